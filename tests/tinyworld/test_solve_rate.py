import pytest

from or1.data.synthetic import code_validation_rows, math_validation_rows
from or1.engines.hf_rollout import Generations
from or1.tinyworld.init import _tokenizer_corpus
from or1.tinyworld.solve_rate import measure_solve_rate
from or1.tinyworld.tokenizer import train_tokenizer


class _ScriptedEngine:
    """Answers each prompt with the gold solution (or reference program) when it has few operands (steps), else
    with a wrong answer (a program that prints 1000)."""

    def __init__(self, tokenizer, rows, solve_up_to):
        self.tokenizer, self.rows, self.solve_up_to = tokenizer, rows, solve_up_to

    def generate_ids(self, prompts, sampling):
        responses = []
        for row in self.rows:
            info = row["extra_info"]
            if row["ability"] == "code":
                program = (
                    info["reference_solution"] if info["num_steps"] <= self.solve_up_to else "print(1000)\n"
                )
                text = f"```python\n{program}```"
            else:
                text = info["solution"] if info["num_ops"] <= self.solve_up_to else "\\boxed{1000}"
            ids = self.tokenizer(text + self.tokenizer.eos_token, add_special_tokens=False)["input_ids"]
            responses += [ids] * sampling.n
        return Generations(responses=responses, truncated=[False] * len(responses))


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(_tokenizer_corpus(seed=0, size=1000))


def test_solve_rate_counts_correct_answers_per_operand_count(tokenizer):
    rows = math_validation_rows()
    rate = measure_solve_rate(_ScriptedEngine(tokenizer, rows, solve_up_to=4), tokenizer, rows, samples=2)
    assert rate.by_difficulty == {3: 1.0, 4: 1.0, 5: 0.0, 6: 0.0}
    assert rate.overall == 0.5
    assert rate.problems == 200 and rate.samples_per_problem == 2 and rate.truncated == 0.0


def test_code_rows_run_in_the_sandbox_per_step_count(tokenizer):
    rows = code_validation_rows()
    rate = measure_solve_rate(_ScriptedEngine(tokenizer, rows, solve_up_to=3), tokenizer, rows, samples=1)
    assert rate.by_difficulty == {3: 1.0, 4: 0.0, 5: 0.0, 6: 0.0}
    assert rate.overall == 0.25 and rate.problems == 100
