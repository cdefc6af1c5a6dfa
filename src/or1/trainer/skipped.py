"""Steps skipped because no prompt group had reward variance: counted in a row, and a stage that cannot learn
stopped with the verifiers' reasons (trainer.max_skipped_steps)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from or1.errors import UserError


@dataclass
class SkippedSteps:
    """Consecutive skipped steps and, per verifier reason (reward/reason_<r>), the sum of each step's fraction."""

    limit: int  # trainer.max_skipped_steps; 0: never stop
    in_a_row: int = 0
    reasons: dict[str, float] = field(default_factory=dict)

    def reset(self) -> None:
        """A step trained: the count starts over."""
        self.in_a_row, self.reasons = 0, {}

    def count(self, step: int, reasons: dict[str, float]) -> None:
        """One more skipped step; `limit` in a row is a UserError naming the verifiers' reasons."""
        self.in_a_row += 1
        for key, share in reasons.items():
            self.reasons[key] = self.reasons.get(key, 0.0) + share
        if self.limit and self.in_a_row >= self.limit:
            shares = sorted(self.reasons.items(), key=lambda kv: -kv[1])
            told = ", ".join(
                f"{share / self.in_a_row:.0%} {key.removeprefix('reward/reason_')}" for key, share in shares
            )
            raise UserError(
                f"{self.in_a_row} steps in a row were skipped (no prompt group with reward variance, so "
                f"nothing to learn) up to step {step}; verifier reasons: {told or 'none recorded'}. Check that "
                "the data's ground truths match the answer format the model writes, the reward settings, and the "
                "model (a group all correct or all wrong teaches nothing); raise trainer.max_skipped_steps (0: "
                "never stop) to go on"
            )

    def state_dict(self) -> dict[str, Any]:
        return {"in_a_row": self.in_a_row, "reasons": dict(self.reasons)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.in_a_row = int(state["in_a_row"])
        self.reasons = dict(state["reasons"])
