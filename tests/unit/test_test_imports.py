"""No test module imports another test module or a conftest: what tests share lives in tests/helpers/."""
from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def imported_test_modules(source: str) -> list[str]:
    """The `tests.*` modules named `test_*` or `conftest` that `source` imports."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        for name in names:
            parts = name.split(".")
            if parts[0] == "tests" and any(p.startswith("test_") or p == "conftest" for p in parts[1:]):
                found.append(name)
                break
    return found


def test_the_check_sees_test_module_imports():
    assert imported_test_modules("from tests.model.test_model_runner import generate") != []
    assert imported_test_modules("import tests.conftest") != []
    assert imported_test_modules("from tests.unit import test_scheduler") != []
    assert imported_test_modules("from tests.helpers.generation import generate") == []


def test_no_test_module_imports_another():
    offenders = {str(path.relative_to(TESTS)): found for path in sorted(TESTS.rglob("*.py"))
                 if (found := imported_test_modules(path.read_text()))}
    assert offenders == {}, "move what they share to tests/helpers/"
