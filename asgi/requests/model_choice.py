"""Which model a request names, once for every route: the served model, or one of its LoRA adapters (--lora-modules,
or loaded at runtime under --allow-runtime-lora-updating, when each API worker learns of it from the engine)."""
from __future__ import annotations

from rill.asgi.http.request_context import current
from rill.asgi.requests.schemas import unknown_model


async def refresh_adapters(state) -> None:
    """The adapters the engine holds now (another worker may have loaded or unloaded some)."""
    try:
        state.lora_names = dict((await state.client.stats()).lora_modules)
    except Exception:  # noqa: BLE001  (an engine that does not answer: keep what we knew)
        pass


async def resolve_model(state, model: str | None, *, adapters: bool = True) -> str:
    """The LoRA adapter `model` names, "" for the served model (or None: a route where `model` is optional);
    a 404 naming `model` for any other. With `adapters` false (embeddings) only the served model. While adapters
    may come and go at runtime, the engine is asked once more before a 404. The access log gets the name."""
    name = state.model_id if model is None else model
    served = name in state.model_names
    if not served and adapters:
        if name not in state.lora_names and state.settings.http.allow_runtime_lora_updating:
            await refresh_adapters(state)
        if name not in state.lora_names:
            raise unknown_model(name)
    elif not served:
        raise unknown_model(name)
    if (ctx := current()) is not None:
        ctx.model = name
    return "" if served else name
