"""The outcome of scoring one response: what training, evaluation and data preparation all consume."""

from __future__ import annotations

from dataclasses import dataclass, field

# One-word reasons, shared by every reward so that summaries and metrics can count them together.
CORRECT = "correct"
WRONG_ANSWER = "wrong_answer"
NO_ANSWER = "no_answer"
TIMEOUT = "timeout"
BAD_INPUT = "bad_input"
NO_CODE = "no_code"
SYNTAX_ERROR = "syntax_error"
RUNTIME_ERROR = "runtime_error"
WRONG_OUTPUT = "wrong_output"
INTERNAL_ERROR = "internal_error"


@dataclass(frozen=True)
class Result:
    """Score of one response: `score` is 1.0 or 0.0 (a fraction in code's fraction-passed mode)."""

    score: float
    reason: str
    extracted: str | None = None  # the final answer or program the verifier judged, when one was found
    detail: str | None = None  # one line for humans (which test failed, what timed out)
    # wall seconds the verifier spent on this row (0.0 when decided without running anything), so a step can name
    # its slowest rows; a measurement, not part of the verdict, so two equal verdicts compare equal
    seconds: float = field(default=0.0, compare=False)

    @property
    def correct(self) -> bool:
        return self.reason == CORRECT
