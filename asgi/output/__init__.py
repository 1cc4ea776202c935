"""What goes back to the client: detokenized text, the OpenAI wire shapes of chunks and bodies, and the response lifecycle."""
