"""Prompts: chat templates, chat messages to token ids, and tokenizing off the event loop."""
