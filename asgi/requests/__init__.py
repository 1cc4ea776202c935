"""Request bodies decoded and checked at the edge, and what they become for the engine (sampling, structure, tools)."""
