"""Stdin/stdout programs for the tiny world: a chain of integer steps, `read x; add 3; times 2; negate; print x.`

The model answers with a whole program in one ```python block:

    x=int(input())
    x+=3
    x*=2
    x=-x
    print(x)

Difficulty is the number of steps, as the number of operands is for arithmetic: each step is one more line to get
right, so the tiny model writes short chains reliably and long ones sometimes (the frontier RL needs). Each task
carries real stdin/stdout test cases (expected outputs computed here in Python, checked against the reference program
by the tests) and its reference program in extra_info, so the code reward and its sandbox run end to end offline.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from or1.data.rows import make_row
from or1.data.synthetic_draws import endless, held_out

CODE_SOURCE = "tiny-code-stdio"
TESTS_PER_TASK = 4
# the validation set is fixed, whatever seed trains: results stay comparable across runs
CODE_VALIDATION_SEED = 271828
CODE_VALIDATION_STEPS = (3, 4, 5, 6)
CODE_VALIDATION_PER_STEPS = 25
CODE_RL_STEPS = CODE_VALIDATION_STEPS  # 2-step programs are written right almost always after the warm start
CODE_SFT_STEPS = (2, 3, 4, 5, 6)


@dataclass(frozen=True)
class _Op:
    """One kind of step: how the prompt says it, how the program writes it, what it does, its argument range."""

    phrase: str  # with {k} where it takes an argument
    line: str
    apply: Callable[[int, int], int]
    args: tuple[int, int] | None = None  # inclusive range of k; None: no argument


OPS: dict[str, _Op] = {
    "add": _Op("add {k}", "x+={k}", lambda x, k: x + k, (1, 9)),
    "sub": _Op("subtract {k}", "x-={k}", lambda x, k: x - k, (1, 9)),
    "mul": _Op("times {k}", "x*={k}", lambda x, k: x * k, (2, 5)),
    "div": _Op("divide by {k}", "x//={k}", lambda x, k: x // k, (2, 5)),
    "mod": _Op("mod {k}", "x%={k}", lambda x, k: x % k, (2, 9)),
    "neg": _Op("negate", "x=-x", lambda x, _: -x),
    "square": _Op("square", "x*=x", lambda x, _: x * x),
    "abs": _Op("absolute value", "x=abs(x)", lambda x, _: abs(x)),
    "max": _Op("at least {k}", "x=max(x,{k})", lambda x, k: max(x, k), (-5, 5)),
    "min": _Op("at most {k}", "x=min(x,{k})", lambda x, k: min(x, k), (-5, 5)),
}


@dataclass(frozen=True)
class CodeTask:
    """One programming problem: a chain of steps applied to the integer read from stdin, and its test cases."""

    steps: tuple[tuple[str, int], ...]  # (op name, argument; 0 for ops without one)
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    @property
    def key(self) -> str:
        return ";".join(f"{name}{k}" for name, k in self.steps)

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    @property
    def prompt(self) -> str:
        phrases = "; ".join(OPS[name].phrase.format(k=k) for name, k in self.steps)
        return f"Python: read x; {phrases}; print x."

    @property
    def solution(self) -> str:
        """The reference program (plain source)."""
        lines = ["x=int(input())", *(OPS[name].line.format(k=k) for name, k in self.steps), "print(x)"]
        return "\n".join(lines) + "\n"

    @property
    def response(self) -> str:
        """The gold response: the reference program in one ```python block."""
        return f"```python\n{self.solution}```"

    def slipped_response(self, rng: random.Random) -> str:
        """The response with one slip: one step's line written as another step (another op or argument)."""
        i = rng.randrange(self.num_steps)
        while True:
            wrong = _draw_step(rng)
            if wrong != self.steps[i]:
                break
        steps = (*self.steps[:i], wrong, *self.steps[i + 1 :])
        return CodeTask(steps, (), ()).response

    def run(self, x: int) -> int:
        for name, k in self.steps:
            x = OPS[name].apply(x, k)
        return x


def _test_inputs(rng: random.Random) -> list[int]:
    """Distinct inputs with both signs, so a dropped negate, absolute value or bound shows in some test."""
    while True:
        xs = rng.sample(range(-30, 31), TESTS_PER_TASK)
        if min(xs) < 0 < max(xs):
            return xs


def _draw_step(rng: random.Random) -> tuple[str, int]:
    name = rng.choice(list(OPS))
    args = OPS[name].args
    return name, rng.randint(*args) if args else 0


def sample_task(rng: random.Random, num_steps: int) -> CodeTask:
    """One task of `num_steps` steps (no op twice in a row) with TESTS_PER_TASK test cases."""
    steps: list[tuple[str, int]] = []
    while len(steps) < num_steps:
        step = _draw_step(rng)
        if not steps or steps[-1][0] != step[0]:
            steps.append(step)
    partial = CodeTask(tuple(steps), (), ())
    xs = _test_inputs(rng)
    return CodeTask(partial.steps, tuple(f"{x}\n" for x in xs), tuple(f"{partial.run(x)}\n" for x in xs))


def validation_tasks() -> list[CodeTask]:
    """The fixed held-out set: CODE_VALIDATION_PER_STEPS distinct tasks for each step count."""
    return held_out(CODE_VALIDATION_SEED, CODE_VALIDATION_STEPS, CODE_VALIDATION_PER_STEPS, sample_task, _key)


def task_stream(seed: int, steps: Iterable[int], exclude: set[str] | None = None) -> Iterator[CodeTask]:
    """Endless tasks with step counts drawn uniformly from `steps`, skipping keys in `exclude` (default: validation)."""
    skip = exclude if exclude is not None else {t.key for t in validation_tasks()}
    yield from endless(seed, steps, skip, sample_task, _key)


def _key(task: CodeTask) -> str:
    return task.key


def code_tasks(seed: int, size: int, steps: Iterable[int] = CODE_RL_STEPS) -> list[CodeTask]:
    """`size` distinct train tasks, none in the validation set, step counts balanced over `steps`."""
    choices = list(steps)
    if not choices or min(choices) < 1:
        raise ValueError(f"step counts must be at least 1, got {choices}")
    rng = random.Random(seed)
    seen = {t.key for t in validation_tasks()}
    tasks: list[CodeTask] = []
    for i in range(size):
        for _ in range(1000):
            task = sample_task(rng, choices[i % len(choices)])
            if task.key not in seen:
                break
        else:
            raise ValueError(
                f"ran out of distinct {choices[i % len(choices)]}-step tasks; ask for fewer than {size}"
            )
        seen.add(task.key)
        tasks.append(task)
    rng.shuffle(tasks)
    return tasks


def code_row(task: CodeTask, index: int, split: str) -> dict[str, Any]:
    """The or1 row of one task (stdin/stdout tests form, as LiveCodeBench's stdin problems)."""
    return make_row(
        data_source=CODE_SOURCE,
        prompt=[{"role": "user", "content": task.prompt}],
        ability="code",
        ground_truth={"inputs": list(task.inputs), "outputs": list(task.outputs)},
        extra_info={
            "index": index,
            "split": split,
            "num_steps": task.num_steps,
            "reference_solution": task.solution,
        },
    )
