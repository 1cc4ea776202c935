"""Microbenchmarks of kernels and of the engine step, in-process: `python -m rill.bench.kernels.<name>`."""
