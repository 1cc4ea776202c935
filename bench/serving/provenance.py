"""Where a microbenchmark's result files go, and the provenance every one of them records."""
from __future__ import annotations

import datetime
import json
import shlex
import sys
from importlib import metadata
from pathlib import Path

from rill.bench.serving.markdown import machine_info as base_machine_info
from rill.engine_proc.cpu_features import machine_record


def provenance(module: str, argv: list[str] | None, machine_name: str | None) -> dict:
    """The command, the date and the machine (with the CPU's model and the flags that decide its fast paths:
    the machines here are not all the same CPU), as every result file records them."""
    packages = {pkg: _version(pkg) for pkg in ("torch", "transformers", "pyzmq", "msgspec", "numpy", "granian")}
    machine = {**base_machine_info(), **packages, **machine_record()}
    machine["name"] = machine_name or machine["hostname"] or "unknown"
    return {"command": shlex.join([".venv/bin/python", "-m", module, *(sys.argv[1:] if argv is None else argv)]),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "machine": machine}


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)  # no import: this runs before torch is loaded, or without it
    except metadata.PackageNotFoundError:
        return None


def save_results(json_path: Path, report: dict, summary_md: str) -> None:
    """`<benchmark>-<machine>.json` and the `.md` summary beside it."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    json_path.with_suffix(".md").write_text(summary_md)
