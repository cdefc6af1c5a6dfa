"""Multi-step integer arithmetic for the tiny world: `Compute 3+4-2.` answered as `3+4=7. 7-2=5. \\boxed{5}`.

Difficulty is the number of operands: each one adds a worked step, so longer problems need longer responses
(the tiny world, docs/tiny.md). Operands are single digits, which keeps the tasks at a tiny model's frontier.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from or1.data.rows import make_row
from or1.data.synthetic_draws import endless, held_out

MATH_SOURCE = "tiny-math-arith"
# the validation set is fixed, whatever seed trains: results stay comparable across runs
VALIDATION_SEED = 314159
VALIDATION_OPS = (3, 4, 5, 6)
VALIDATION_PER_OPS = 50


@dataclass(frozen=True)
class ArithmeticProblem:
    """`operands[0] signs[0] operands[1] ...` evaluated left to right."""

    operands: tuple[int, ...]
    signs: tuple[str, ...]  # "+" or "-", one fewer than operands

    @property
    def num_ops(self) -> int:
        return len(self.operands)

    @property
    def expression(self) -> str:
        parts = [str(self.operands[0])]
        for sign, value in zip(self.signs, self.operands[1:], strict=True):
            parts.append(f"{sign}{value}")
        return "".join(parts)

    @property
    def prompt(self) -> str:
        return f"Compute {self.expression}."

    def _partials(self) -> list[tuple[int, str, int, int]]:
        steps, total = [], self.operands[0]
        for sign, value in zip(self.signs, self.operands[1:], strict=True):
            new = total + value if sign == "+" else total - value
            steps.append((total, sign, value, new))
            total = new
        return steps

    @property
    def answer(self) -> int:
        return self._partials()[-1][3]

    @property
    def solution(self) -> str:
        """The gold worked response: one `a±b=c.` step per operator, then the boxed answer."""
        steps = " ".join(f"{a}{s}{b}={c}." for a, s, b, c in self._partials())
        return f"{steps} \\boxed{{{self.answer}}}"


def sample_problem(rng: random.Random, num_ops: int, max_operand: int = 9) -> ArithmeticProblem:
    """Draw one problem with `num_ops` operands in 1..max_operand."""
    if num_ops < 2:
        raise ValueError("an arithmetic problem needs at least 2 operands")
    operands = tuple(rng.randint(1, max_operand) for _ in range(num_ops))
    signs = tuple(rng.choice("+-") for _ in range(num_ops - 1))
    return ArithmeticProblem(operands, signs)


def validation_problems() -> list[ArithmeticProblem]:
    """The fixed held-out set: VALIDATION_PER_OPS distinct problems for each operand count in VALIDATION_OPS."""
    return held_out(VALIDATION_SEED, VALIDATION_OPS, VALIDATION_PER_OPS, sample_problem, _expression)


def problem_stream(
    seed: int, ops: Iterable[int], exclude: set[str] | None = None
) -> Iterator[ArithmeticProblem]:
    """Endless problems with operand counts drawn uniformly from `ops`, skipping expressions in `exclude`."""
    skip = exclude if exclude is not None else {p.expression for p in validation_problems()}
    yield from endless(seed, ops, skip, sample_problem, _expression)


def _expression(problem: ArithmeticProblem) -> str:
    return problem.expression


def distinct_problems(seed: int, size: int, ops: Iterable[int]) -> list[ArithmeticProblem]:
    """`size` distinct problems, none in the validation set, operand counts balanced over `ops`."""
    ops = list(ops)
    capacity = sum(9**n * 2 ** (n - 1) for n in ops)  # distinct expressions available
    if size > capacity // 2:
        raise ValueError(
            f"asked for {size} distinct problems with {ops} operands; at most {capacity // 2} allowed"
        )
    rng = random.Random(seed)
    seen = {p.expression for p in validation_problems()}
    problems: list[ArithmeticProblem] = []
    for i in range(size):
        while True:
            problem = sample_problem(rng, ops[i % len(ops)])
            if problem.expression not in seen:
                break
        seen.add(problem.expression)
        problems.append(problem)
    rng.shuffle(problems)
    return problems


def math_row(problem: ArithmeticProblem, index: int, split: str) -> dict[str, Any]:
    """The or1 row of one problem; the gold worked solution rides along in extra_info for SFT and length studies."""
    return make_row(
        data_source=MATH_SOURCE,
        prompt=[{"role": "user", "content": problem.prompt}],
        ability="math",
        ground_truth=[str(problem.answer)],
        extra_info={
            "index": index,
            "split": split,
            "num_ops": problem.num_ops,
            "expression": problem.expression,
            "solution": problem.solution,
        },
    )
