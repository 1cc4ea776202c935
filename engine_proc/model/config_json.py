"""A plain Llama, Mistral, Qwen2 or Qwen3 config read straight from config.json, for the native runner.

transformers' config classes import about 1.4 s of modules through their field validators (accelerate,
torch.distributed.tensor, sympy): a third of an engine's start on the bundled model, which needs none of
them. Read here only where the file holds nothing this reader does not know, with transformers 5's own
defaults for what it leaves out; its RoPE plain or scaled (Llama 3.x's `llama3`, `linear`, `yarn`), which
engine_proc/model/rope.py computes itself. Anything else (another RoPE scaling, a sliding window, a
quantization_config, a key not listed) gives None, and transformers reads the file as before. tests/model/test_config_json.py
holds this reader to transformers' reading, field by field.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

_COMMON = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, hidden_act="silu",
               rms_norm_eps=1e-6, initializer_range=0.02, tie_word_embeddings=False, pad_token_id=None)
_QWEN = dict(_COMMON, vocab_size=151936, intermediate_size=22016, num_key_value_heads=32, max_position_embeddings=32768,
             use_sliding_window=False, sliding_window=4096, max_window_layers=28, bos_token_id=None, eos_token_id=None)
# transformers 5's defaults (each family's configuration_*.py) for the fields a config.json may leave out.
DEFAULTS: dict[str, dict] = {
    "llama": dict(_COMMON, vocab_size=32000, intermediate_size=11008, num_key_value_heads=None, head_dim=None,
                  max_position_embeddings=2048, bos_token_id=1, eos_token_id=2, attention_bias=False, mlp_bias=False),
    "mistral": dict(_COMMON, vocab_size=32000, intermediate_size=14336, num_key_value_heads=8, head_dim=None,
                    max_position_embeddings=131072, bos_token_id=1, eos_token_id=2, sliding_window=4096),
    "qwen2": _QWEN,
    "qwen3": dict(_QWEN, head_dim=128, attention_bias=False),
}
# The fields each family's class takes as null (and derives); a null elsewhere is transformers' error to give.
NULLABLE = {"llama": {"num_key_value_heads", "head_dim"}, "mistral": {"head_dim"}, "qwen2": {"num_key_value_heads"},
            "qwen3": {"num_key_value_heads"}}
DEFAULT_ROPE_THETA = 10000.0
# Keys read here or never read by the native runner; any other sends the file to transformers.
KNOWN_KEYS = {"model_type", "architectures", "rope_parameters", "rope_theta", "rope_scaling", "layer_types", "head_dim",
              "attention_bias", "mlp_bias", "sliding_window", "use_sliding_window", "max_window_layers",
              "attention_dropout", "dtype", "torch_dtype", "transformers_version", "use_cache", "pretraining_tp",
              "unk_token_id", "_name_or_path", "_model_name_or_path"}
_SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "head_dim", "max_position_embeddings")


class JsonConfig(SimpleNamespace):
    """The config's fields as attributes, as a transformers config has them for the native runner; name_or_path,
    the directory it was read from."""

    def get_text_config(self) -> JsonConfig:
        return self

    def __deepcopy__(self, memo) -> JsonConfig:
        return JsonConfig(**copy.deepcopy(vars(self), memo))


def read_config_json(model_dir: str | Path) -> JsonConfig | None:
    """The config of `model_dir`, or None where transformers must read it (see the module's docstring)."""
    try:
        raw = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None  # transformers says what is wrong with it
    if not isinstance(raw, dict) or raw.get("model_type") not in DEFAULTS:
        return None
    defaults = DEFAULTS[raw["model_type"]]
    if set(raw) - KNOWN_KEYS - set(defaults):
        return None
    fields = {**defaults, **raw}
    if any(fields.get(name, 0) is None for name in _SIZES if name not in NULLABLE[raw["model_type"]]):
        return None
    if fields["num_key_value_heads"] is None:
        fields["num_key_value_heads"] = fields["num_attention_heads"]
    if not all(_is_size(fields[name]) for name in _SIZES if fields.get(name) is not None):
        return None
    if fields["hidden_size"] % fields["num_attention_heads"] or not isinstance(fields["rms_norm_eps"], (int, float)):
        return None
    if "head_dim" in fields and fields["head_dim"] is None:
        fields["head_dim"] = fields["hidden_size"] // fields["num_attention_heads"]
    rope = _rope(raw)
    if rope is None or not _full_attention_only(raw, fields):
        return None
    fields["rope_parameters"] = fields["rope_scaling"] = rope
    fields.pop("rope_theta", None)
    return JsonConfig(**fields, name_or_path=str(model_dir))


def _is_size(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


# The RoPE scalings read here: the keys each must have besides rope_theta and rope_type, and those it may have. All
# numbers, but YaRN's `truncate` (a boolean).
SCALINGS: dict[str, tuple[set[str], set[str]]] = {
    "default": (set(), set()),
    "linear": ({"factor"}, set()),
    "llama3": ({"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}, set()),
    "yarn": ({"factor", "original_max_position_embeddings"},
             {"attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"}),
}


def _rope(raw: dict) -> dict | None:
    """rope_parameters as transformers 5 makes them (the older rope_scaling with the top-level rope_theta, and its
    `type` for rope_type, or rope_parameters as it writes them), or None for any other scaling or shape."""
    scaling, params = raw.get("rope_scaling"), raw.get("rope_parameters")
    if scaling is not None and params is not None and scaling != params:
        return None
    given = params if params is not None else scaling if scaling is not None else {}
    if not isinstance(given, dict):
        return None
    rope_type = given.get("rope_type", given.get("type", "default"))
    if rope_type not in SCALINGS:
        return None
    required, optional = SCALINGS[rope_type]
    keys = set(given) - {"rope_theta", "rope_type", "type"}
    theta = given.get("rope_theta", raw.get("rope_theta", DEFAULT_ROPE_THETA))
    if not required <= keys <= required | optional or not _is_number(theta) or \
            not all(isinstance(given[k], bool) if k == "truncate" else _is_number(given[k]) for k in keys):
        return None
    if "original_max_position_embeddings" in keys and not _is_size(given["original_max_position_embeddings"]):
        return None
    if rope_type == "llama3" and given["high_freq_factor"] <= given["low_freq_factor"]:
        return None
    kept = {"type": given["type"]} if "type" in given else {}  # transformers keeps the older key beside rope_type
    return {**{key: given[key] for key in keys}, **kept, "rope_theta": theta, "rope_type": rope_type}


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def _full_attention_only(raw: dict, fields: dict) -> bool:
    """No sliding window: Qwen2's and Qwen3's only with use_sliding_window (their layer_types then all full),
    Mistral's and Llama's window as the file gives it (the native runner checks it)."""
    if raw["model_type"] in ("qwen2", "qwen3"):
        if fields["use_sliding_window"] is not False:
            return False
        fields["sliding_window"] = None
        fields.setdefault("layer_types", None)
        if fields["layer_types"] is None:
            fields["layer_types"] = ["full_attention"] * fields["num_hidden_layers"]
    elif "layer_types" in raw:  # Mistral with layer_types: transformers warns to use Ministral's classes
        return False
    layer_types = fields.get("layer_types")
    return layer_types is None or (isinstance(layer_types, list) and all(t == "full_attention" for t in layer_types)
                                   and len(layer_types) == fields["num_hidden_layers"])
