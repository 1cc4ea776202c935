"""Structured outputs in the engine: compiling specs, each request's matcher, and the token bitmask."""
