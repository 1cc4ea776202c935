"""No import cycle among Rill's packages: every `import` and `from` statement, function-level too, read with `ast`."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("asgi", "engine_proc", "ipc", "rill")
# Cycles inside engineer A's files (the attention and kernel backends, issue 31 item 1), to be
# emptied by that work; each entry is a cycle's modules in sorted order. Nothing else may join it.
KNOWN_CYCLES: set[tuple[str, ...]] = set()


def module_name(path: Path) -> str:
    """Its name as installed: the repo's asgi/, engine_proc/ and ipc/ are rill.asgi, ... (pyproject's package-dir)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] != "rill":
        parts.insert(0, "rill")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(path): path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))}


def imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of these packages that `name` imports anywhere in its body."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import mod` imports the module pkg.mod; `from mod import name` imports mod.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import a.b.c` of a name inside a module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_no_import_cycles():
    modules = all_modules()
    graph = {name: imported(name, path, modules) for name, path in modules.items()}
    cycles = [tuple(c) for c in find_cycles(graph)]
    new = [" -> ".join(c) for c in cycles if c not in KNOWN_CYCLES]
    assert not new, "import cycles:\n" + "\n".join(new)


def test_known_cycles_still_exist():
    """An allow-list entry that no longer holds is dropped, so the list only shrinks."""
    modules = all_modules()
    graph = {name: imported(name, path, modules) for name, path in modules.items()}
    gone = KNOWN_CYCLES - {tuple(c) for c in find_cycles(graph)}
    assert not gone, f"these cycles are gone: remove them from KNOWN_CYCLES: {sorted(gone)}"


def test_finds_a_cycle():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_nothing_imports_a_bare_top_level_folder():
    """`import asgi...` would load a second copy of a module beside rill.asgi's (two registries, two custom ops)."""
    bare = ("asgi", "engine_proc", "ipc", "bench", "rill_templates")
    found = []
    for path in sorted(ROOT.glob("*/**/*.py")):
        if path.relative_to(ROOT).parts[0] not in (*PACKAGES, "bench", "tests"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            found += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in bare]
    assert not found, "import rill.<package> instead:\n" + "\n".join(found)
