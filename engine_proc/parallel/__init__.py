"""Tensor parallelism: sharded model, rank processes, the step broadcast."""
