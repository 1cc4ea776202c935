"""The LoRA adapters of the bundled model the model and end-to-end tests make (with bench's make_adapter)."""
from __future__ import annotations

ADAPTERS = {  # name: (rank, alpha, target modules)
    "attn": (8, 16, ["q_proj", "k_proj", "v_proj", "o_proj"]),
    "mlp": (4, 8, ["gate_proj", "up_proj", "down_proj"]),
    "all": (16, 8, ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
}
