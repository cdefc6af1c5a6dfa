"""Adaptive entropy control (the "A" of MAGIC): keep the policy's entropy from collapsing below a target.

Each step the controller sees e_k, the mean negative log-prob of the sampled response tokens, and returns alpha_k,
the weight of the entropy bonus (-alpha_k * H) in that step's loss. The coefficient c moves by delta per step:

    alpha_k = c_k if e_k < target else 0               (the bonus only acts below target)
    c_{k+1} = clamp(c_k + delta if e_k < target else c_k - delta, min_coef, max_coef)

with c_0 = init_coef (0). e_k == target counts as "not below": no bonus, c decreases.
Paper knobs: delta 0.005, no max; repository scripts: delta 0.0001, max 0.005.

`timing="repository"` reproduces the SkyworkAI/Skywork-OR1 code instead, where the on/off switch of step k comes
from the previous step's estimate (alpha_k = c_k if e_{k-1} < target, on at step 0); c_k is the same in both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from torch import Tensor

if TYPE_CHECKING:
    from or1.config.schema import EntropyControlConfig

Mode = Literal["adaptive", "fixed", "off"]
Timing = Literal["paper", "repository"]


def entropy_estimate(old_log_probs: Tensor, mask: Tensor) -> float:
    """e_k = -mean log-prob of the sampled response tokens over the step's batch (cheap: no full vocabulary)."""
    mask = mask.to(old_log_probs.dtype)
    n = float(mask.sum())
    if n == 0:
        raise ValueError("entropy_estimate got a batch without response tokens")
    return float(-(old_log_probs * mask).sum() / n)


class AdaptiveEntropyController:
    """Turns the step's entropy estimate into the entropy-bonus weight alpha; its state goes into checkpoints."""

    def __init__(
        self,
        mode: Mode = "adaptive",
        *,
        target: float = 0.2,
        delta: float = 0.005,
        init_coef: float = 0.0,
        min_coef: float = 0.0,
        max_coef: float | None = None,
        fixed_coef: float = 0.0,
        timing: Timing = "paper",
    ) -> None:
        if mode not in ("adaptive", "fixed", "off"):
            raise ValueError(f"unknown entropy control mode {mode!r}; expected adaptive, fixed or off")
        if timing not in ("paper", "repository"):
            raise ValueError(f"unknown entropy control timing {timing!r}; expected paper or repository")
        if max_coef is not None and max_coef < min_coef:
            raise ValueError(f"entropy max_coef ({max_coef}) is below min_coef ({min_coef})")
        self.mode, self.timing = mode, timing
        self.target, self.delta = target, delta
        self.min_coef, self.max_coef, self.fixed_coef = min_coef, max_coef, fixed_coef
        self.coef = self._clamp(init_coef)
        self.enabled = True  # repository timing: whether the previous estimate was below target
        self.steps = 0
        self.last_entropy: float | None = None
        self.last_alpha = 0.0

    @classmethod
    def from_config(cls, cfg: EntropyControlConfig) -> AdaptiveEntropyController:
        """Build from algorithm.entropy of a resolved RunConfig."""
        return cls(
            cfg.mode,
            target=cfg.target,
            delta=cfg.delta,
            init_coef=cfg.init_coef,
            min_coef=cfg.min_coef,
            max_coef=cfg.max_coef,
            fixed_coef=cfg.fixed_coef,
            timing=cfg.timing,
        )

    def _clamp(self, c: float) -> float:
        c = max(c, self.min_coef)
        return c if self.max_coef is None else min(c, self.max_coef)

    @property
    def alpha_needs_estimate(self) -> bool:
        """Whether this step's alpha depends on its own estimate e_k (paper timing, adaptive, coefficient > 0)."""
        return self.mode == "adaptive" and self.timing == "paper" and self.coef != 0.0

    def alpha_before(self, switch_estimate: float) -> float:
        """The alpha_k that `step` will return, before e_k is known: exact unless it depends on e_k (paper timing
        with a non-zero coefficient), where the on/off switch reads `switch_estimate` instead of e_k."""
        if self.mode == "off":
            return 0.0
        if self.mode == "fixed":
            return self.fixed_coef
        on = switch_estimate < self.target if self.timing == "paper" else self.enabled
        return self.coef if on else 0.0

    def step(self, entropy_estimate: float, alpha: float | None = None) -> float:
        """Record this step's estimate e_k; return alpha_k for this step's loss and advance the coefficient.

        `alpha`: the weight this step's loss already used (from `alpha_before`, when the update had to start
        before e_k was known); e_k still moves the coefficient and is what `metrics` reports.
        """
        below = entropy_estimate < self.target
        if alpha is None:
            alpha = self.alpha_before(entropy_estimate)
        if self.mode == "adaptive":
            self.coef = self._clamp(self.coef + self.delta if below else self.coef - self.delta)
            self.enabled = below
        self.steps += 1
        self.last_entropy, self.last_alpha = float(entropy_estimate), float(alpha)
        return alpha

    def metrics(self) -> dict[str, float]:
        """Per-step log line: coef (next step's c), alpha (this step's weight), target, entropy (this step's e_k)."""
        coef = self.coef if self.mode == "adaptive" else (self.fixed_coef if self.mode == "fixed" else 0.0)
        return {
            "coef": coef,
            "alpha": self.last_alpha,
            "target": self.target,
            "entropy": float("nan") if self.last_entropy is None else self.last_entropy,
        }

    def state_dict(self) -> dict[str, Any]:
        """Everything `step` depends on, as plain Python values (JSON-safe), for checkpoints."""
        return {
            "coef": self.coef,
            "enabled": self.enabled,
            "steps": self.steps,
            "last_entropy": self.last_entropy,
            "last_alpha": self.last_alpha,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from `state_dict` (knobs come from the config, not the checkpoint)."""
        self.coef = float(state["coef"])
        self.enabled = bool(state["enabled"])
        self.steps = int(state["steps"])
        self.last_entropy = None if state["last_entropy"] is None else float(state["last_entropy"])
        self.last_alpha = float(state["last_alpha"])
