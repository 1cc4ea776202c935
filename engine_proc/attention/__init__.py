"""Attention over the paged KV cache: the cache itself, the torch path, the CPU kernels' wrappers, the batch-invariant and Triton paths."""
