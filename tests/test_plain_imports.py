"""or1's own modules are imported with plain import statements only, so the import-linter contracts (pyproject.toml)
and a reader following imports see every arrow; `importlib` / `__import__` load third-party modules only."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "or1"
# modules that import third-party packages by a name they are given (`or1 doctor`'s version probes)
THIRD_PARTY_PROBES = {"doctor.py"}


def dynamic_imports(tree: ast.AST) -> list[ast.Call]:
    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ("import_module", "__import__"):
                calls.append(node)
    return calls


def names_or1(arg: ast.expr) -> bool:
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value == "or1" or arg.value.startswith("or1.")
    if isinstance(arg, ast.JoinedStr):
        first = arg.values[0] if arg.values else None
        return isinstance(first, ast.Constant) and str(first.value).startswith("or1")
    return True  # a name computed at run time could be anything


def test_no_module_of_or1_is_imported_by_name() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for call in dynamic_imports(ast.parse(path.read_text())):
            if call.args and names_or1(call.args[0]) and path.name not in THIRD_PARTY_PROBES:
                found.append(f"{path.relative_to(SRC)}:{call.lineno}")
    assert not found, f"or1 modules imported by name (use a plain import): {found}"


def test_the_check_sees_a_dynamic_import_of_or1() -> None:
    code = 'import importlib\nimportlib.import_module("or1.trainer.run")\n__import__(f"or1.{name}")\n'
    assert [names_or1(call.args[0]) for call in dynamic_imports(ast.parse(code))] == [True, True]
    assert not names_or1(ast.parse('"torch"', mode="eval").body)
