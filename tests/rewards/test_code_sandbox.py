"""Code reward end to end in a real sandbox, on each backend: LiveCodeBench (stdin and functional), TACO-style
calls and LeetCode-style asserts; reference solutions score 1, wrong ones 0, batches keep their order."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from or1.rewards.code import score_code_batch
from or1.rewards.result import CORRECT, TIMEOUT, WRONG_OUTPUT
from or1.sandbox.pool import unavailable
from or1.sandbox.probes import ASSERT_GT, REVERSE_OK

LCB = (
    Path(__file__).parents[2] / ".." / "shared" / "benchmarks" / "livecodebench" / "lcb_2408_2502_public.json"
)
# Our own reference solutions for a few problems of the public LiveCodeBench window (index: program).
REFERENCE = {
    0: "n = int(input())\na = list(map(int, input().split()))\nprint(a.index(sorted(a)[-2]) + 1)\n",
    249: "class Solution:\n    def smallestNumber(self, n: int) -> int:\n        x = 1\n"
    "        while x < n:\n            x = 2 * x + 1\n        return x\n",
    79: "class Solution:\n    def largestPalindrome(self, n: int, k: int) -> str:\n"
    "        best = None\n        for x in range(10 ** n - 1, 10 ** (n - 1) - 1, -1):\n"
    "            s = str(x)\n            if s == s[::-1] and x % k == 0:\n                return s\n        return ''\n",
    108: "class Solution:\n    def minElement(self, nums: List[int]) -> int:\n"
    "        return min(sum(map(int, str(x))) for x in nums)\n",
    220: "class Solution:\n    def numberOfSubstrings(self, s: str, k: int) -> int:\n        n, total = len(s), 0\n"
    "        for i in range(n):\n            seen = {}\n            for j in range(i, n):\n"
    "                seen[s[j]] = seen.get(s[j], 0) + 1\n                if seen[s[j]] >= k:\n"
    "                    total += n - j\n                    break\n        return total\n",
}
WRONG = {
    0: "n = int(input())\na = list(map(int, input().split()))\nprint(a.index(max(a)) + 1)\n",
    249: "class Solution:\n    def smallestNumber(self, n: int) -> int:\n        return n\n",
    108: "class Solution:\n    def minElement(self, nums):\n        return min(nums)\n",
}


def lcb_ground_truth(problem: dict) -> dict:
    """A LiveCodeBench record's tests as a code ground truth (the forms of or1.rewards.code_tests)."""
    tests = problem["tests"]
    truth = {"inputs": [t["input"] for t in tests], "outputs": [t["output"] for t in tests]}
    if tests[0]["testtype"] == "functional":
        truth["fn_name"] = re.findall(r"def (\w+)\(self", problem["starter_code"])[-1]
    return truth


def respond(program: str) -> str:
    return f"<think>Let me think.</think>\nHere it is:\n```python\n{program}```\n"


@pytest.fixture(scope="module")
def lcb() -> list[dict]:
    if not LCB.exists():
        pytest.skip(f"{LCB} not found")
    return json.loads(LCB.read_text())


def test_livecodebench_references_pass_and_wrong_ones_fail(backend: str, lcb: list[dict]):
    items = [(i, p, 1.0) for i, p in REFERENCE.items()] + [(i, p, 0.0) for i, p in WRONG.items()]
    truths = [json.dumps(lcb_ground_truth(lcb[i])) for i, _, _ in items]
    results = score_code_batch([respond(p) for _, p, _ in items], truths, backend=backend)
    assert [r.score for r in results] == [want for _, _, want in items], results
    assert all(r.reason == CORRECT for r in results[: len(REFERENCE)])


def test_leetcode_assert_and_taco_call_forms(backend: str):
    taco = {"inputs": [[[3, 1, 2]], [[5]]], "outputs": [[[1, 2, 3]], [[5]]], "fn_name": "sort_list"}
    taco_ok = "def sort_list(xs):\n    return sorted(xs)\n"
    taco_bad = "def sort_list(xs):\n    return xs\n"
    responses = [respond(REVERSE_OK), respond(taco_ok), respond(taco_bad)]
    results = score_code_batch(responses, [ASSERT_GT, taco, taco], backend=backend)
    assert [r.score for r in results] == [1.0, 1.0, 0.0], results


def test_fraction_mode_and_first_failure(backend: str):
    gt = {"inputs": ["1\n", "2\n", "3\n", "4\n"], "outputs": ["1\n", "4\n", "9\n", "15\n"]}
    program = respond("x = int(input())\nprint(x * x)\n")
    binary, fraction = (
        score_code_batch([program], [gt], backend=backend, fraction=f)[0] for f in (False, True)
    )
    assert binary.score == 0.0 and binary.reason == WRONG_OUTPUT and "test 3" in binary.detail
    assert fraction.score == 0.75 and fraction.reason == WRONG_OUTPUT


def test_timeout_is_per_test(backend: str):
    gt = {"inputs": ["1\n", "2\n"], "outputs": ["1\n", "2\n"]}
    slow = respond("import time\nx = int(input())\nif x == 2:\n    time.sleep(5)\nprint(x)\n")
    result = score_code_batch([slow], [gt], backend=backend, timeout=1.0)[0]
    assert result.score == 0.0 and result.reason == TIMEOUT
    assert 1.0 <= result.seconds < 5.0  # the problem's sandbox visit, its timed-out test included


def test_batch_order_is_kept_across_slots(backend: str):
    gt = {"inputs": ["\n"], "outputs": ["ok\n"]}
    programs = [
        ("import time\ntime.sleep(0.3)\n" if i % 3 == 0 else "") + ("print('ok')" if i % 2 else "print('no')")
        for i in range(12)
    ]
    results = score_code_batch([respond(p) for p in programs], [gt] * 12, backend=backend, slots=2)
    assert [r.score for r in results] == [float(i % 2) for i in range(12)]


def test_the_sandbox_self_test_imports_no_reward_code() -> None:
    # Layering: the sandbox runs programs; judging their output belongs to the rewards above it.
    import subprocess
    import sys

    code = (
        "import sys, or1.sandbox.check, or1.sandbox.pool, or1.sandbox.probes\n"
        "print(sorted(m for m in sys.modules if m.startswith('or1.rewards')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_judge_probes_scores_the_sandbox_controls() -> None:
    from or1.rewards.code import judge_probes
    from or1.sandbox.pool import SandboxPool
    from or1.sandbox.probes import controls

    if unavailable("local"):
        pytest.skip(f"local sandbox: {unavailable('local')}")
    pool = SandboxPool("local", 2)
    try:
        probes = controls()
        verdicts = judge_probes(pool, probes)
    finally:
        pool.close()
    # the honest controls score 1, their wrong twins 0
    assert [v.score for v in verdicts] == [p.want for p in probes]
    assert {p.want for p in probes} == {0.0, 1.0}
    assert all((v.reason == CORRECT) == (p.want == 1.0) for v, p in zip(verdicts, probes, strict=True))
