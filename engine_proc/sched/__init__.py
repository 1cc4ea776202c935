"""Scheduling: requests, continuous batching under a token budget, KV blocks, the prefix cache, admission and deadlines. Pure Python: no torch, no sockets."""
