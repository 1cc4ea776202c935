"""asgi package."""
