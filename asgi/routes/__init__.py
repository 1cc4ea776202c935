"""The route handlers: chat, completions, Responses and their stored objects, Conversations, tokenize, metrics."""
