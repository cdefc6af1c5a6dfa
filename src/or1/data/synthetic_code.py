"""Stdin/stdout programming tasks for the tiny world, from a handful of parameterised families.

Each task carries real test cases (`{"inputs": [...], "outputs": [...]}`, outputs as the reference program prints
them) and its reference solution in extra_info, so the code reward and sandbox can be tested end to end offline.
The expected outputs are computed here in Python; tests run the reference source against them.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from or1.data.schema import make_row

CODE_SOURCE = "tiny-code-stdio"
CODE_INSTRUCTION = (
    "Write a Python program that reads from standard input and writes to standard output. "
    "Put the whole program in one ```python code block."
)
TESTS_PER_TASK = 5


@dataclass(frozen=True)
class CodeTask:
    """One programming problem: statement, reference program and test cases."""

    family: str
    params: tuple[Any, ...]
    statement: str
    solution: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    @property
    def key(self) -> str:
        return f"{self.family}{self.params}"


@dataclass(frozen=True)
class _Family:
    name: str
    draw_params: Callable[[random.Random], tuple[Any, ...]]
    statement: Callable[..., str]
    solution: Callable[..., str]
    draw_input: Callable[..., str]  # (rng, *params) -> stdin text
    answer: Callable[..., str]  # (input text, *params) -> expected stdout


def _ints(rng: random.Random, n: int, lo: int = -50, hi: int = 50) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(n)]


def _word(rng: random.Random, lo: int = 1, hi: int = 8) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(lo, hi)))


def _order(words: list[str], order: str) -> list[str]:
    return {"reversed": words[::-1], "sorted": sorted(words), "original": words}[order]


def _list_input(rng: random.Random) -> str:
    values = _ints(rng, rng.randint(1, 8))
    return f"{len(values)}\n{' '.join(map(str, values))}\n"


FAMILIES: tuple[_Family, ...] = (
    _Family(
        "linear",
        lambda r: (r.randint(1, 9), r.randint(1, 9)),
        lambda p, q: f"The input is one line with two integers a and b. Print {p}*a + {q}*b.",
        lambda p, q: f"a, b = map(int, input().split())\nprint({p} * a + {q} * b)\n",
        lambda r, *_: "{} {}\n".format(*_ints(r, 2, -1000, 1000)),
        lambda text, p, q: f"{p * int(text.split()[0]) + q * int(text.split()[1])}\n",
    ),
    _Family(
        "repeat",
        lambda r: (r.randint(2, 9), r.choice(",-|+ ")),
        lambda k, sep: f"The input is one word. Print the word {k} times, joined by '{sep}'.",
        lambda k, sep: f"w = input().strip()\nprint({sep!r}.join([w] * {k}))\n",
        lambda r, *_: _word(r) + "\n",
        lambda text, k, sep: sep.join([text.strip()] * k) + "\n",
    ),
    _Family(
        "list_extreme",
        lambda r: (r.choice(["largest", "smallest"]), r.randint(0, 20)),
        lambda which, c: (
            f"The first line holds n, the second n integers. Print the {which} of them plus {c}."
        ),
        lambda which, c: (
            "input()\nxs = list(map(int, input().split()))\n"
            f"print({'max' if which == 'largest' else 'min'}(xs) + {c})\n"
        ),
        lambda r, *_: _list_input(r),
        lambda text, which, c: (
            f"{(max if which == 'largest' else min)(map(int, text.split(chr(10))[1].split())) + c}\n"
        ),
    ),
    _Family(
        "count_char",
        lambda r: (r.choice(string.ascii_lowercase), r.choice([True, False])),
        lambda ch, same: (
            "The input is one line of lowercase letters. Print how many of its letters "
            + (f"are '{ch}'." if same else f"are not '{ch}'.")
        ),
        lambda ch, same: (
            "s = input().strip()\n"
            + (f"print(s.count({ch!r}))\n" if same else f"print(len(s) - s.count({ch!r}))\n")
        ),
        lambda r, ch, _: "".join(r.choice("abcde" + ch) for _ in range(r.randint(1, 20))) + "\n",
        lambda text, ch, same: (
            f"{text.strip().count(ch) if same else len(text.strip()) - text.strip().count(ch)}\n"
        ),
    ),
    _Family(
        "words",
        lambda r: (
            r.choice(["reversed", "sorted", "original"]),
            r.choice(["lower", "upper", "capitalize"]),
            r.choice(" ,-+"),
        ),
        lambda order, case, sep: (
            f"The input is one line of words separated by spaces. Print the words in {order} order, each converted "
            f"with str.{case}(), joined by '{sep}'."
        ),
        lambda order, case, sep: (
            "words = input().split()\n"
            + {"reversed": "words = words[::-1]\n", "sorted": "words = sorted(words)\n", "original": ""}[
                order
            ]
            + f"print({sep!r}.join(w.{case}() for w in words))\n"
        ),
        lambda r, *_: " ".join(_word(r) for _ in range(r.randint(1, 5))) + "\n",
        lambda text, order, case, sep: (
            sep.join(getattr(w, case)() for w in _order(text.split(), order)) + "\n"
        ),
    ),
)


def sample_task(rng: random.Random, family: _Family) -> CodeTask:
    """Draw one task of `family` with TESTS_PER_TASK random test cases."""
    params = family.draw_params(rng)
    inputs = tuple(family.draw_input(rng, *params) for _ in range(TESTS_PER_TASK))
    return CodeTask(
        family=family.name,
        params=params,
        statement=family.statement(*params),
        solution=family.solution(*params),
        inputs=inputs,
        outputs=tuple(family.answer(text, *params) for text in inputs),
    )


def code_tasks(seed: int, size: int, exclude: set[str] | None = None) -> list[CodeTask]:
    """`size` tasks, families in turn, parameter sets distinct and outside `exclude` (other splits' keys)."""
    rng = random.Random(seed)
    seen = set(exclude or ())
    tasks: list[CodeTask] = []
    for i in range(size):
        family = FAMILIES[i % len(FAMILIES)]
        for _ in range(1000):
            task = sample_task(rng, family)
            if task.key not in seen:
                break
        else:
            raise ValueError(f"family {family.name} ran out of distinct tasks; ask for fewer than {size}")
        seen.add(task.key)
        tasks.append(task)
    return tasks


def code_row(task: CodeTask, index: int, split: str) -> dict[str, Any]:
    """The or1 row of one task (stdin/stdout tests form)."""
    return make_row(
        data_source=CODE_SOURCE,
        prompt=[{"role": "user", "content": f"{task.statement}\n\n{CODE_INSTRUCTION}"}],
        ability="code",
        ground_truth={"inputs": list(task.inputs), "outputs": list(task.outputs)},
        extra_info={
            "index": index,
            "split": split,
            "family": task.family,
            "reference_solution": task.solution,
        },
    )
