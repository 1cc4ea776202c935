"""Sampling: the sampler and its Triton kernel, penalties and logit bias."""
