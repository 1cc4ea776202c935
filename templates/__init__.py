"""Rill's bundled chat templates (chatml, llama3, plain), installed as the package `rill_templates`
so a non-editable install carries them; asgi/prompt/templating.py loads them from there."""
