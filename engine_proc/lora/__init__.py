"""LoRA adapters: PEFT's layout loaded, and applied per row of a step over the base model's linears."""
