"""HTTP at the ASGI level: the body/JSON/disconnect primitives, SSE, CORS, API keys, the access log and each request's context."""
