"""A draft model for speculative decoding made from the bundled one: its first layers and its head.

Same tokenizer, same embedding and head (tied), `num_layers` of its 30 decoder layers; what the tests
and `bench.features.speculative` use as `{"method": "draft_model", "model": DIR}`, with nothing downloaded.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import save_file

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def write_truncated_model(src: str | Path, dst: str | Path, num_layers: int) -> Path:
    src, dst = Path(src), Path(dst)
    if (dst / "model.safetensors").is_file():
        return dst
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "special_tokens_map.json"):
        if (src / name).is_file():
            shutil.copy(src / name, dst / name)
    config = json.loads((src / "config.json").read_text())
    if not 1 <= num_layers <= config["num_hidden_layers"]:
        raise ValueError(f"num_layers must be from 1 to {config['num_hidden_layers']}")
    config["num_hidden_layers"] = num_layers
    tensors = {}
    for file in sorted(src.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                match = _LAYER.search(key)
                if match is None or int(match.group(1)) < num_layers:
                    tensors[key] = f.get_tensor(key)
    save_file(tensors, str(dst / "model.safetensors.partial"), metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    (dst / "model.safetensors.partial").rename(dst / "model.safetensors")
    return dst
