"""bench/'s folders stay layered: what `rill bench` ships (bench/serving) imports no experiment, and no bench module imports
one that imports it back."""
from __future__ import annotations

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def bench_imports() -> dict[str, set[str]]:
    """module -> the bench modules it imports (anywhere in the file, lazy imports included)."""
    graph = {}
    for path in BENCH.rglob("*.py"):
        name = "rill." + ".".join(path.relative_to(BENCH.parent).with_suffix("").parts).removesuffix(".__init__")
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names if alias.name.startswith("rill.bench")}
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rill.bench"):
                found |= {f"{node.module}.{alias.name}" for alias in node.names} | {node.module}
        graph[name] = found
    return {name: {m for m in found if m in graph and m != name} for name, found in graph.items()}


def test_serving_imports_no_experiment():
    experiments = ("peers", "kernels", "ipc", "features")
    wrong = {name: sorted(m for m in found if m.split(".")[2] in experiments)
             for name, found in bench_imports().items() if name.startswith("rill.bench.serving")}
    assert {name: found for name, found in wrong.items() if found} == {}


def test_no_import_cycle_in_bench():
    graph = bench_imports()

    def reaches(start: str, target: str, seen: set[str]) -> bool:
        for nxt in graph.get(start, ()):
            if nxt == target or (nxt not in seen and not seen.add(nxt) and reaches(nxt, target, seen)):
                return True
        return False

    cycles = sorted(name for name in graph if reaches(name, name, set()))
    assert cycles == []
