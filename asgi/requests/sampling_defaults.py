"""The model's own sampling defaults, as vLLM's `--generation-config auto` applies them: what the
model's generation_config.json sets of temperature, top_p, top_k, min_p and repetition_penalty is
used where a request leaves the field out (a GGUF's `general.sampling.*` land there when it is
converted, engine_proc/model/gguf_dir.py). `--generation-config vllm` (or `none`) ignores the file;
a folder takes its generation_config.json instead; `--override-generation-config JSON` sets fields on
top. A value outside what a request may send is refused at start (an override) or dropped with a
warning (the model's file)."""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path

from rill.ipc.config import json_object

log = logging.getLogger("rill.api")

# Each field's bounds, as a request's (asgi/requests/schemas.py): (low, high, low is inclusive)
BOUNDS = {"temperature": (0.0, 2.0, True), "top_p": (0.0, 1.0, False), "top_k": (-1, 1 << 31, True),
          "min_p": (0.0, 1.0, True), "repetition_penalty": (0.0, 2.0, False)}
IGNORE = ("vllm", "none")


class DefaultsError(ValueError):
    """An override that names a field Rill does not default, or a value out of its bounds."""


def check_value(name: str, value) -> float | int:
    """`value` for field `name` if a request could send it; DefaultsError otherwise."""
    if name not in BOUNDS:
        raise DefaultsError(f"{name!r} is not a sampling default Rill applies (one of {', '.join(BOUNDS)})")
    low, high, inclusive = BOUNDS[name]
    integral = name == "top_k"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integral and value != int(value)):
        raise DefaultsError(f"{name} must be {'an integer' if integral else 'a number'}, not {value!r}")
    if not math.isfinite(value) or value > high or (value < low if inclusive else value <= low):
        raise DefaultsError(f"{name} = {value!r} is outside {'[' if inclusive else '('}{low}, {high}]")
    return int(value) if integral else float(value)


def parse_override(text: str | None) -> dict[str, float | int]:
    """--override-generation-config's JSON object, each field checked."""
    if not text:
        return {}
    fields = json_object(text, not_json="not JSON: ", not_object='a JSON object of fields, such as {"temperature": 0.6}',
                         error=DefaultsError)
    return {name: check_value(name, value) for name, value in fields.items()}


def sampling_defaults(model_dir: str | Path, source: str = "auto", override: str | None = None) -> dict:
    """The defaults to serve with: the model's file's (source "auto"), a folder's, or none; then the override."""
    defaults: dict[str, float | int] = {}
    if source not in IGNORE:
        folder = Path(model_dir) if source == "auto" else Path(source)
        defaults = _from_file(folder / "generation_config.json")
    defaults.update(parse_override(override))
    return defaults


def _from_file(path: Path) -> dict[str, float | int]:
    try:
        fields = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    defaults = {}
    for name in BOUNDS:
        if fields.get(name) is None:
            continue
        try:
            defaults[name] = check_value(name, fields[name])
        except DefaultsError as exc:
            log.warning("%s: %s; requests that leave it out get Rill's default", path, exc)
    return defaults
