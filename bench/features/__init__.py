"""One `rill serve` feature against `rill serve` without it (admission, LoRA, prefix cache, ...): `python -m rill.bench.features.<name>`."""
