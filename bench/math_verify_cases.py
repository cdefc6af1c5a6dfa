"""math-verify's published test cases, fed to `or1 score` as responses, against math-verify called plainly.

math-verify's own test suite (huggingface/Math-Verify, tests/test_*.py) lists (gold, prediction, expected) cases,
each a gold answer, a model output and whether they should count as equal. This script reads those cases at run
time from a checkout of that folder (nothing of it is copied here), writes each as an or1 math row (the prediction
as the response, the gold as the only acceptable answer), scores the file with the real `or1 score` command, and
compares with math-verify used plainly: `verify(parse(gold), parse(prediction))` with its default settings, and
with math-verify as Skywork-OR1's reward calls it (the gold wrapped in `\\boxed{}`, the text after `</think>`).
A case counts as right when the verdict equals the expected one. Run from the repository root:

    .venv/bin/python bench/math_verify_cases.py PATH/TO/Math-Verify/tests [--workers 2] [--show 20]

Cases whose columns are not (gold, pred, expected) with string answers and a 0/1 verdict are skipped; the per-file
counts say how many were used. Options some cases pass to math-verify (precision, strict, set relations) are not
passed to either side: both are measured with their defaults, as training uses them.

One published label is audited: math-verify's test_yujianll.py expects `$1 + \\frac{1}{\\mathrm{e}}$` to equal
`$1 - \\frac{1}{\\mathrm{e}}$`, which holds in math-verify only because its parser stops at `\\mathrm{e}` and
compares the leading `1`s. Accuracies are printed against the published labels and against the audited ones.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Case:
    source: str  # file::test function
    gold: str
    pred: str
    expected: bool


def _parametrize_cases(tree: ast.Module, source: str) -> list[Case]:
    """The (gold, pred, expected) rows of every `@pytest.mark.parametrize` in a test module."""
    cases = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef):
            continue
        for deco in node.decorator_list:
            if not (isinstance(deco, ast.Call) and getattr(deco.func, "attr", "") == "parametrize"):
                continue
            try:
                names = ast.literal_eval(deco.args[0])
                rows = ast.literal_eval(deco.args[1])
            except (ValueError, SyntaxError, IndexError):
                continue
            names = [n.strip() for n in (names.split(",") if isinstance(names, str) else names)]
            verdict = next((n for n in ("expected", "result") if n in names), None)
            if "gold" not in names or "pred" not in names or verdict is None:
                continue
            at = {n: names.index(n) for n in ("gold", "pred", verdict)}
            for row in rows:
                gold, pred, want = row[at["gold"]], row[at["pred"]], row[at[verdict]]
                if isinstance(gold, str) and isinstance(pred, str) and want in (0, 1):
                    cases.append(Case(f"{source}::{node.name}", gold, pred, bool(want)))
    return cases


# (gold, pred) -> the mathematically right verdict, for published labels that contradict mathematics.
AUDITED = {("$1 - \\frac{1}{\\mathrm{e}}$", "$1 + \\frac{1}{\\mathrm{e}}$"): False}


def load_cases(tests_dir: Path) -> list[Case]:
    cases = []
    for path in sorted(tests_dir.glob("test_*.py")):
        cases += _parametrize_cases(ast.parse(path.read_text()), path.name)
    return cases


def plain_math_verify(cases: list[Case]) -> list[bool]:
    """math-verify's verdict with its defaults (parse both sides, verify), its own timeouts on."""
    from math_verify import parse, verify

    verdicts = []
    for case in cases:
        try:
            verdicts.append(bool(verify(parse(case.gold), parse(case.pred))))
        except Exception:  # a crash on a case is a "not equal" verdict, as a reward would treat it
            verdicts.append(False)
    return verdicts


def skywork_math_verify(cases: list[Case]) -> list[bool]:
    """Skywork-OR1's reward (verl/workers/reward_manager/hf_math_verify.py), as described there: math-verify's parse
    of the text after `</think>`, at least two items parsed, a string match or verify against the boxed gold."""
    from math_verify import parse, verify

    verdicts = []
    for case in cases:
        text = case.pred.split("</think>")[1] if "</think>" in case.pred else case.pred
        try:
            parsed = parse(text)
            ok = len(parsed) >= 2 and (
                parsed[1] == case.gold or verify(parse("\\boxed{" + case.gold + "}"), parsed)
            )
        except Exception:
            ok = False
        verdicts.append(bool(ok))
    return verdicts


def or1_score(cases: list[Case], workers: int, timeout: float) -> tuple[list[bool], list[str]]:
    """The verdicts and reasons of the `or1 score` command on the cases written as or1 math rows."""
    with tempfile.TemporaryDirectory(prefix="or1-mv-cases-") as tmp:
        src, out = Path(tmp) / "cases.jsonl", Path(tmp) / "scored.jsonl"
        with src.open("w") as handle:
            for case in cases:
                row = {
                    "ability": "math",
                    "response": case.pred,
                    "reward_model": {"ground_truth": json.dumps([case.gold]), "style": "rule"},
                }
                handle.write(json.dumps(row) + "\n")
        command = [sys.executable, "-m", "or1.cli", "score", str(src), "--out", str(out)]
        command += ["--workers", str(workers), "--timeout", str(timeout)]
        subprocess.run(command, check=True)
        scored = [json.loads(line) for line in out.read_text().splitlines()]
    return [row["score"] == 1.0 for row in scored], [row["reason"] for row in scored]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tests_dir", type=Path, help="the tests/ folder of a Math-Verify checkout")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument(
        "--show", type=int, default=20, help="print up to this many cases where the two differ"
    )
    args = parser.parse_args()
    cases = load_cases(args.tests_dir)
    if not cases:
        sys.exit(f"no (gold, pred, expected) cases found under {args.tests_dir}")
    plain = plain_math_verify(cases)
    skywork = skywork_math_verify(cases)
    or1, reasons = or1_score(cases, args.workers, args.timeout)
    per_file: dict[str, Counter] = {}
    for case, p, k, o in zip(cases, plain, skywork, or1, strict=True):
        counts = per_file.setdefault(case.source.split("::")[0], Counter())
        counts["cases"] += 1
        counts["plain"] += p == case.expected
        counts["skywork"] += k == case.expected
        counts["or1"] += o == case.expected
    print(
        f"{'file':<28} {'cases':>6} {'math-verify plain':>18} {'as Skywork calls it':>20} {'or1 score':>10}"
    )
    for name, c in [*per_file.items(), ("total", sum(per_file.values(), Counter()))]:
        print(f"{name:<28} {c['cases']:>6} {c['plain']:>18} {c['skywork']:>20} {c['or1']:>10}")
    n = len(cases)
    right = {
        k: sum(v == c.expected for c, v in zip(cases, verdicts, strict=True))
        for k, verdicts in (("plain", plain), ("skywork", skywork), ("or1", or1))
    }
    print(
        f"accuracy: math-verify plain {right['plain'] / n:.1%}, as Skywork calls it {right['skywork'] / n:.1%}, "
        f"or1 score {right['or1'] / n:.1%}"
    )
    audited = [AUDITED.get((c.gold, c.pred), c.expected) for c in cases]
    fixed = {
        k: sum(v == want for want, v in zip(audited, verdicts, strict=True))
        for k, verdicts in (("plain", plain), ("skywork", skywork), ("or1", or1))
    }
    print(
        f"with {sum(a != c.expected for a, c in zip(audited, cases, strict=True))} label(s) audited (see the "
        f"docstring): math-verify plain {fixed['plain']}, as Skywork calls it {fixed['skywork']}, "
        f"or1 score {fixed['or1']} of {n}"
    )
    differ = [
        (c, p, o, r)
        for c, p, o, r in zip(cases, plain, or1, reasons, strict=True)
        if (p == c.expected) != (o == c.expected)
    ]
    print(
        f"or1 right where plain is wrong: {sum(o == c.expected for c, _, o, _ in differ)}; "
        f"plain right where or1 is wrong: {sum(p == c.expected for c, p, _, _ in differ)}"
    )
    for case, p, o, reason in differ[: args.show]:
        print(
            f"  {case.source}: expected {int(case.expected)}, plain {int(p)}, or1 {int(o)} ({reason}): "
            f"gold {case.gold!r} pred {case.pred[:120]!r}"
        )


if __name__ == "__main__":
    main()
