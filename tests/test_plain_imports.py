"""or1's own modules are imported with plain import statements only, so the import-linter contracts (pyproject.toml)
and a reader following imports see every arrow; `importlib` / `__import__` load third-party modules only."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "or1"
# modules that import third-party packages by a name they are given (`or1 doctor`'s version probes)
THIRD_PARTY_PROBES = {"doctor.py"}


def dynamic_imports(tree: ast.AST) -> list[ast.expr | None]:
    """The module name of each use of importlib.import_module / __import__: a call's first argument, or None where
    the function itself is passed on (its module name is then decided elsewhere)."""
    called = {id(node.func): node for node in ast.walk(tree) if isinstance(node, ast.Call)}
    found = []
    for node in ast.walk(tree):
        name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
        if name in ("import_module", "__import__") and isinstance(node, ast.Attribute | ast.Name):
            call = called.get(id(node))
            found.append(call.args[0] if call is not None and call.args else None)
    return found


def names_or1(arg: ast.expr | None) -> bool:
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value == "or1" or arg.value.startswith("or1.")
    if isinstance(arg, ast.JoinedStr):
        first = arg.values[0] if arg.values else None
        return isinstance(first, ast.Constant) and str(first.value).startswith("or1")
    return True  # a name computed at run time could be anything


def test_no_module_of_or1_is_imported_by_name() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for module in dynamic_imports(ast.parse(path.read_text())):
            if names_or1(module) and path.name not in THIRD_PARTY_PROBES:
                found.append(f"{path.relative_to(SRC)}:{getattr(module, 'lineno', '?')}")
    assert not found, f"or1 modules imported by name (use a plain import): {found}"


def test_the_check_sees_a_dynamic_import_of_or1() -> None:
    code = 'importlib.import_module("or1.trainer.run")\n__import__(f"or1.{name}")\npool.submit(importlib.import_module, m)\n'
    assert [names_or1(module) for module in dynamic_imports(ast.parse(code))] == [True, True, True]
    assert not names_or1(ast.parse('"torch"', mode="eval").body)
