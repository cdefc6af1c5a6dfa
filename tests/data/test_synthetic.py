import json
import random
import re
import subprocess
import sys
from collections import Counter

import pytest

from or1.data.rows import read_rows
from or1.data.synthetic import math_train_rows, math_validation_rows, write_tiny_dataset
from or1.data.synthetic_code import (
    CODE_VALIDATION_STEPS,
    OPS,
    TESTS_PER_TASK,
    CodeTask,
    code_tasks,
    task_stream,
    validation_tasks,
)
from or1.data.synthetic_math import ArithmeticProblem, sample_problem
from or1.errors import UserError


def test_worked_solution_format():
    problem = ArithmeticProblem((3, 4, 2), ("+", "-"))
    assert problem.prompt == "Compute 3+4-2."
    assert problem.solution == "3+4=7. 7-2=5. \\boxed{5}"
    assert problem.answer == 5


def test_solutions_are_correct_chains():
    rng = random.Random(0)
    for _ in range(200):
        problem = sample_problem(rng, rng.randint(2, 6))
        assert problem.answer == eval(problem.expression)  # left-to-right +/- is Python's order too
        steps = re.findall(r"(-?\d+)([+-])(\d+)=(-?\d+)\.", problem.solution)
        assert len(steps) == problem.num_ops - 1
        running = problem.operands[0]
        for a, sign, b, c in steps:
            assert int(a) == running
            running = int(a) + int(b) if sign == "+" else int(a) - int(b)
            assert int(c) == running
        assert problem.solution.endswith(f"\\boxed{{{problem.answer}}}")


def test_validation_is_fixed_balanced_and_disjoint_from_train():
    validation = math_validation_rows()
    assert validation == math_validation_rows()
    assert Counter(r["extra_info"]["num_ops"] for r in validation) == {3: 50, 4: 50, 5: 50, 6: 50}
    held_out = {r["extra_info"]["expression"] for r in validation}
    assert len(held_out) == 200
    for seed in (0, 1):
        train = math_train_rows(seed, 3000)
        expressions = [r["extra_info"]["expression"] for r in train]
        assert len(set(expressions)) == len(expressions)
        assert not held_out & set(expressions)


def test_train_rows_are_deterministic_from_the_seed():
    assert math_train_rows(7, 50) == math_train_rows(7, 50)
    assert math_train_rows(7, 50) != math_train_rows(8, 50)


def test_math_row_schema():
    row = math_train_rows(0, 1, ops=[4])[0]
    assert row["ability"] == "math"
    assert row["prompt"][0]["role"] == "user"
    assert row["prompt"][0]["content"].startswith("Compute ")
    gold = json.loads(row["reward_model"]["ground_truth"])
    assert gold == [str(eval(row["extra_info"]["expression"]))]
    assert row["extra_info"]["num_ops"] == 4 and row["extra_info"]["split"] == "train"


def test_program_format():
    task = CodeTask((("add", 3), ("mul", 2), ("neg", 0)), (), ())
    assert task.prompt == "Python: read x; add 3; times 2; negate; print x."
    assert task.response == "```python\nx=int(input())\nx+=3\nx*=2\nx=-x\nprint(x)\n```"
    assert task.run(4) == -14


def test_a_slipped_program_differs_in_one_line():
    rng = random.Random(0)
    for task in code_tasks(0, 50):
        gold, slipped = task.response.splitlines(), task.slipped_response(rng).splitlines()
        assert len(gold) == len(slipped)
        assert sum(a != b for a, b in zip(gold, slipped, strict=True)) == 1


def test_code_reference_solutions_pass_their_tests():
    tasks = code_tasks(0, 40)
    assert {t.num_steps for t in tasks} == set(CODE_VALIDATION_STEPS)
    assert {name for t in tasks for name, _ in t.steps} == set(OPS)  # every kind of step is exercised
    for task in tasks:
        for stdin, expected in zip(task.inputs, task.outputs, strict=True):
            run = subprocess.run(
                [sys.executable, "-c", task.solution],
                input=stdin,
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            )
            assert run.stdout == expected, (task.key, stdin)


def test_code_splits_are_disjoint_and_the_validation_set_is_fixed():
    validation = validation_tasks()
    assert len(validation) == 100 and [t.key for t in validation] == [t.key for t in validation_tasks()]
    assert Counter(t.num_steps for t in validation) == {n: 25 for n in CODE_VALIDATION_STEPS}
    held_out = {t.key for t in validation}
    assert not held_out & {t.key for t in code_tasks(1, 500)}
    stream = task_stream(1, [2, 6])
    assert not held_out & {next(stream).key for _ in range(500)}


def test_write_tiny_dataset(tiny_data_dir):
    names = {p.name for p in tiny_data_dir.iterdir()}
    assert names == {"train.parquet", "validation.parquet", "code_train.parquet", "code_validation.parquet"}
    train, validation = (
        read_rows(tiny_data_dir / "train.parquet"),
        read_rows(tiny_data_dir / "validation.parquet"),
    )
    assert len(train) == 400 and len(validation) == 200
    assert {r["extra_info"]["num_ops"] for r in train} == {3, 4, 5, 6}
    code_train = read_rows(tiny_data_dir / "code_train.parquet")
    code_validation = read_rows(tiny_data_dir / "code_validation.parquet")
    assert all(r["ability"] == "code" for r in code_train + code_validation)
    prompts = lambda rows: {r["prompt"][0]["content"] for r in rows}  # noqa: E731
    assert not prompts(code_train) & prompts(code_validation)
    tests = json.loads(code_train[0]["reward_model"]["ground_truth"])
    assert len(tests["inputs"]) == len(tests["outputs"]) == TESTS_PER_TASK
    assert len(code_validation) == 100


def test_write_tiny_dataset_is_deterministic(tmp_path):
    a = write_tiny_dataset(tmp_path / "a", seed=3, math_train_size=20, code_train_size=5)
    b = write_tiny_dataset(tmp_path / "b", seed=3, math_train_size=20, code_train_size=5)
    for name in ("train", "validation", "code_train", "code_validation"):
        assert getattr(a, name).read_bytes() == getattr(b, name).read_bytes()


@pytest.mark.parametrize(
    "kwargs", [{"math_train_size": 0}, {"train_ops": [1, 2]}, {"math_train_size": 10**6, "train_ops": [2]}]
)
def test_impossible_sizes_are_user_errors(tmp_path, kwargs):
    with pytest.raises(UserError):
        write_tiny_dataset(tmp_path, **kwargs)
