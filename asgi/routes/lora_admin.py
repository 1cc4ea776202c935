"""vLLM's runtime LoRA routes, `POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter`, served
only under --allow-runtime-lora-updating (or VLLM_ALLOW_RUNTIME_LORA_UPDATING=true, vLLM's switch);
and each worker's view of which adapters the engine holds."""
from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from rill.asgi.errors import APIError, engine_unavailable
from rill.asgi.http.primitives import send_response
from rill.asgi.http.router import HTTPRequest
from rill.asgi.requests.body import decode_json
from rill.asgi.requests.bounds import MAX_LORA_PATH_LEN, Name
from rill.asgi.state import WorkerState


class LoadLoRA(msgspec.Struct, forbid_unknown_fields=True):
    lora_name: Name
    lora_path: Annotated[str, Meta(max_length=MAX_LORA_PATH_LEN)]
    load_inplace: bool = False


class UnloadLoRA(msgspec.Struct, forbid_unknown_fields=True):
    lora_name: Name
    lora_int_id: int | None = None


_load_decoder = msgspec.json.Decoder(LoadLoRA)
_unload_decoder = msgspec.json.Decoder(UnloadLoRA)


async def load_lora_adapter(http: HTTPRequest) -> None:
    state = _runtime_updates(http)
    req = decode_json(_load_decoder, http.body)
    if not req.lora_name or not req.lora_path:
        raise APIError(400, "Both 'lora_name' and 'lora_path' must be provided.", param="lora_name")
    if req.lora_name in state.model_names:
        raise APIError(400, f"'{req.lora_name}' is the served model's name.", param="lora_name")
    await _update(state, req.lora_name, req.lora_path, req.load_inplace)
    state.lora_names[req.lora_name] = req.lora_path
    await send_response(http.send, 200, f"Success: LoRA adapter '{req.lora_name}' added successfully.".encode(),
                        content_type=b"text/plain; charset=utf-8")


async def unload_lora_adapter(http: HTTPRequest) -> None:
    state = _runtime_updates(http)
    req = decode_json(_unload_decoder, http.body)
    await _update(state, req.lora_name, "")
    state.lora_names.pop(req.lora_name, None)
    await send_response(http.send, 200, f"Success: LoRA adapter '{req.lora_name}' removed successfully.".encode(),
                        content_type=b"text/plain; charset=utf-8")


def _runtime_updates(http: HTTPRequest) -> WorkerState:
    state: WorkerState = http.state
    if not state.settings.http.allow_runtime_lora_updating:
        raise APIError(404, "Not Found: start the server with --enable-lora and --allow-runtime-lora-updating "
                            "to load and unload LoRA adapters at runtime.", type="not_found_error")
    return state


async def _update(state: WorkerState, name: str, path: str, load_inplace: bool = False) -> None:
    try:
        result = await state.client.update_lora(name, path, load_inplace=load_inplace)
    except Exception:  # noqa: BLE001  (EngineDead, a timeout)
        raise engine_unavailable() from None
    if result.status >= 500:  # the engine failed on it, logged it, and went on
        raise APIError(result.status, result.error, type="server_error", code="lora_update_failed")
    if result.error:
        raise APIError(result.status, result.error, param="lora_name" if result.status == 404 else "lora_path",
                       type="not_found_error" if result.status == 404 else "invalid_request_error")
