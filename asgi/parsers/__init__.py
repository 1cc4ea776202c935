"""Output parsers over generated text: reasoning and tool calls."""
