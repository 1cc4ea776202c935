"""A model directory for `--load-format dummy` at a config's shape: its config.json, and a tokenizer
whose vocabulary is as large as the config's, so that a server can run it.

    python -m rill.bench.kernels.dummy_model_dir bench/models/llama-3.2-1b OUT_DIR [--tokenizer-from DIR]

The tokenizer is the bundled model's (or --tokenizer-from's), its byte-level BPE vocabulary padded
with tokens <|pad_N|> up to the config's vocab_size: prompts encode as the bundled model's do, and
every id a random-weight model samples decodes to text. The weights are random at load.
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path


def make_dir(config_dir: Path, out: Path, tokenizer_from: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((config_dir / "config.json").read_text())
    shutil.copy(config_dir / "config.json", out / "config.json")
    tokenizer = json.loads((tokenizer_from / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    used = set(vocab.values()) | {t["id"] for t in tokenizer.get("added_tokens", [])}
    for token_id in range(config["vocab_size"]):
        if token_id not in used:
            vocab[f"<|pad_{token_id}|>"] = token_id
    (out / "tokenizer.json").write_text(json.dumps(tokenizer))
    tokenizer_config = json.loads((tokenizer_from / "tokenizer_config.json").read_text())
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    eos = config.get("eos_token_id")
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos, "bos_token_id": config.get("bos_token_id")}))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m rill.bench.kernels.dummy_model_dir", description=__doc__.splitlines()[0])
    ap.add_argument("config_dir", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--tokenizer-from", type=Path, default=None, help="a model directory (default: the bundled model's)")
    args = ap.parse_args(argv)
    if args.tokenizer_from is None:
        from rill.engine_proc.model.bundled import ensure_bundled_model

        args.tokenizer_from = ensure_bundled_model()
    print(make_dir(args.config_dir, args.out, args.tokenizer_from))


if __name__ == "__main__":
    main()
