"""The one scheduling core for replaceable actors (or1.hybrid.actor_pool), and that its three owners use it rather
than dealing, budgeting restarts or naming failures on their own."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from or1.hybrid.actor_pool import Member, RestartBudget, first_results, last_line, least_loaded, replace

SRC = Path(__file__).resolve().parents[2] / "src" / "or1"
OWNERS = [
    SRC / "scoring" / "cluster_placement.py",
    SRC / "eval" / "replicas.py",
    SRC / "trainer" / "separate.py",
]


def test_deals_to_the_least_loaded_member_with_room() -> None:
    a, b, c = Member(0), Member(1), Member(2)
    a.inflight = {"r1": [1, 2, 3]}
    b.inflight = {"r2": [4], "r3": [5]}  # full at depth 2
    assert least_loaded([a, b, c], depth=2) is c
    c.inflight = {"r4": [6, 7, 8, 9]}
    assert least_loaded([a, b, c], depth=2) is a  # fewer positions outstanding than c
    assert least_loaded([b], depth=2) is None


def test_the_first_result_of_a_position_wins() -> None:
    done: set[int] = set()
    assert first_results([1, 2, 3], done) == [1, 2, 3]
    assert first_results([3, 4], done) == [4]  # a copy of 3 came back later
    assert done == {1, 2, 3, 4}


def test_a_dead_member_is_replaced_in_place_until_the_budget_is_spent() -> None:
    members = [Member(0), Member(1, inflight={"r": [7, 8]})]
    budget = RestartBudget(1)
    lost = replace(members, members[1], lambda index: Member(index), budget, "replicas")
    assert lost == [[7, 8]] and members[1].index == 1 and not members[1].inflight and budget.used == 1
    with pytest.raises(RuntimeError, match="replicas died 2 times"):
        replace(members, members[1], lambda index: Member(index), budget, "replicas")


def test_a_budget_per_key_counts_each_key_apart() -> None:
    budget = RestartBudget(2, per_key=True)
    assert budget.spend("node-a") and budget.spend("node-a") and not budget.allows("node-a")
    assert budget.allows("node-b") and budget.used == 2


def test_a_failure_is_named_by_its_last_line() -> None:
    assert last_line(RuntimeError("Traceback ...\n  File x\nValueError: boom\n")) == "ValueError: boom"
    assert last_line(KeyError()) == "KeyError" and last_line("") == "unknown error"


def _own_scheduling(path: Path) -> list[str]:
    """What a module does itself that the pool does: a last_line helper, a least-loaded pick, a restart count."""
    tree = ast.parse(path.read_text())
    found = [
        f"def {n.name}" for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and "last_line" in n.name
    ]
    for node in ast.walk(tree):
        text = ast.unparse(node)
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("min", "max") and "outstanding" in text:
            found.append(text)
        if isinstance(node, ast.Compare) and "restart" in text.lower():
            found.append(text)
        if isinstance(node, ast.AugAssign) and "restart" in ast.unparse(node.target).lower():
            found.append(text)
    return found


@pytest.mark.parametrize("path", OWNERS, ids=lambda p: p.name)
def test_the_owners_use_the_pool_and_schedule_nothing_of_their_own(path: Path) -> None:
    assert "from or1.hybrid.actor_pool import" in path.read_text()
    assert _own_scheduling(path) == []


def test_the_check_sees_a_scheduler_of_its_own(tmp_path: Path) -> None:
    module = tmp_path / "owner.py"
    module.write_text(
        "def _last_line(e):\n    return str(e)\n"
        "pick = min(free, key=lambda s: (s.outstanding, s.name))\n"
        "if self.restarts >= self.max_restarts:\n    pass\n"
    )
    assert len(_own_scheduling(module)) == 3
