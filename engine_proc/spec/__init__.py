"""Speculative decoding: proposers (n-gram lookup, a draft model) and verification in one step."""
