"""OpenAI's Batch API: files, batches and the runner that works through them (docs/batch.md)."""
