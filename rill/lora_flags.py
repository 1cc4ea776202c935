"""`--enable-lora`, `--lora-modules`, `--max-loras`, `--max-lora-rank`, as vLLM spells them."""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def add_lora_flags(ap: argparse.ArgumentParser) -> None:
    lora = ap.add_argument_group("LoRA adapters")
    lora.add_argument("--enable-lora", action="store_true",
                      help="serve LoRA adapters (PEFT's layout), chosen per request by the `model` field")
    lora.add_argument("--lora-modules", nargs="+", default=[], metavar="NAME=PATH",
                      help='adapters loaded at start: name=path, or vLLM\'s JSON {"name": ..., "path": ...}')
    lora.add_argument("--max-loras", type=int, default=1, help="adapters loaded at once (the slots)")
    lora.add_argument("--max-lora-rank", type=int, default=16, help="the highest rank an adapter may have")
    lora.add_argument("--allow-runtime-lora-updating", action="store_true",
                      default=os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower() in ("1", "true"),
                      help="serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (as vLLM does under "
                           "VLLM_ALLOW_RUNTIME_LORA_UPDATING=true, which turns this on too)")


def lora_modules(args) -> dict[str, str]:
    """name -> path of --lora-modules (checked by check_lora_flags)."""
    out = {}
    for item in args.lora_modules:
        if item.lstrip().startswith("{"):
            spec = json.loads(item)
            out[spec["name"]] = spec["path"]
        else:
            name, _, path = item.partition("=")
            out[name] = path
    return out


def check_lora_flags(args, parser: argparse.ArgumentParser) -> None:
    """Exit 2 naming the flag for adapters that cannot be served."""
    if args.lora_modules and not args.enable_lora:
        parser.error("--lora-modules needs --enable-lora")
    if args.allow_runtime_lora_updating and not args.enable_lora:
        args.allow_runtime_lora_updating = False  # the env switch alone (vLLM's) does nothing without adapters
    if args.max_loras < 1 or args.max_lora_rank < 1:
        parser.error("--max-loras and --max-lora-rank must be at least 1")
    modules = {}
    for item in args.lora_modules:
        try:
            spec = json.loads(item) if item.lstrip().startswith("{") else None
        except json.JSONDecodeError as exc:
            parser.error(f"--lora-modules {item!r}: not JSON ({exc})")
        name, path = (spec.get("name"), spec.get("path")) if isinstance(spec, dict) else item.partition("=")[::2]
        if not name or not path:
            parser.error(f"--lora-modules {item!r}: expected name=path")
        if name in modules:
            parser.error(f"--lora-modules: the name {name!r} is given twice")
        if not (Path(path) / "adapter_config.json").is_file():
            parser.error(f"--lora-modules {name}: {path} is not a PEFT adapter directory (no adapter_config.json)")
        modules[name] = path
    if len(modules) > args.max_loras:
        parser.error(f"--lora-modules gives {len(modules)} adapters, more than --max-loras {args.max_loras}")
