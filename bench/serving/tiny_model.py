"""A tiny Llama config with the bundled tokenizer, for `rill serve --load-format dummy` benchmarks.

    python -m rill.bench.serving.tiny_model DIR
    rill serve --model DIR --load-format dummy --max-model-len 2048

The model costs almost nothing per step (2 layers of width 64, random weights, no weight
files), so what a benchmark of it measures is the serving stack: HTTP, tokenizer, IPC,
scheduler, detokenizer. It keeps the bundled model's vocabulary, special token ids and
tokenizer files, so prompts, chat templates and eos behave as with the real model.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from rill.engine_proc.model.bundled import ensure_bundled_model

TINY_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}
TOKENIZER_FILE_NAMES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "special_tokens_map.json")


def write_tiny_model(model_dir: str | Path, source_dir: str | Path | None = None) -> Path:
    """Write config.json (the source's, shrunk to TINY_SHAPE) and its tokenizer files; no weights."""
    source = Path(source_dir) if source_dir is not None else ensure_bundled_model()
    target = Path(model_dir)
    target.mkdir(parents=True, exist_ok=True)
    config = json.loads((source / "config.json").read_text())
    if config.get("model_type") != "llama":
        raise ValueError(f"{source}: expected a Llama config, got {config.get('model_type')!r}")
    config.update(TINY_SHAPE)
    config["_name_or_path"] = "rill-tiny-llama"
    config.pop("_model_name_or_path", None)
    (target / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in TOKENIZER_FILE_NAMES:
        if (source / name).is_file():
            shutil.copyfile(source / name, target / name)
    return target


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        sys.exit("usage: python -m rill.bench.serving.tiny_model DIR")
    print(write_tiny_model(args[0]))


if __name__ == "__main__":
    main()
