"""The weights push's self-test: after the actor's weights reach the rollout engine, both score a fixed probe.

A push that silently did nothing (a skipped sync under sleep mode, a renamed tensor an engine ignores) leaves the
sampler on old weights while training goes on as if on-policy. After every push the worker scores the same few
tokens with the engine and with the actor; `check_push` stops the run with one line naming the step when they
disagree by more than the tolerance of their dtypes.
"""

from __future__ import annotations

from or1.errors import UserError

# A fixed text whose tokens both sides score: any tokenizer encodes it, and it is short (one tiny forward).
PROBE_TEXT = "Compute 12+7-3. 12+7=19. 19-3=16. The answer is \\boxed{16}."
FLOAT32_TOLERANCE = 1e-3  # both sides float32: different kernels agree to ~1e-5
HALF_TOLERANCE = 0.1  # a 16-bit side: rounding and kernels differ by ~1e-2 per token on average


def tolerance(configured: float | None, engine_dtype: str, actor_dtype: str) -> float:
    """The largest mean |log-prob difference| on the probe that passes (rollout.weight_sync_tolerance)."""
    if configured is not None:
        return configured
    return FLOAT32_TOLERANCE if engine_dtype == actor_dtype == "float32" else HALF_TOLERANCE


def check_push(engine: list[float], actor: list[float], tol: float, where: str) -> float:
    """The mean |difference| of the two sides' log-probs of the probe's tokens; a UserError above `tol`."""
    if len(engine) != len(actor) or not engine:
        raise ValueError(f"probe log-probs of {len(engine)} and {len(actor)} tokens")
    gap = sum(abs(e - a) for e, a in zip(engine, actor, strict=True)) / len(engine)
    if not gap <= tol:  # a NaN fails too
        raise UserError(
            f"{where}: after the weights push the rollout engine scores a fixed probe unlike the actor (mean "
            f"|log-prob difference| {gap:.3g} over {len(engine)} tokens, tolerance {tol:g}), so it samples from other "
            "weights than the ones being trained; check the vLLM build (or1 doctor) or try rollout.engine=hf "
            "(rollout.weight_sync_tolerance sets the tolerance, rollout.weight_sync_check=false skips the check)"
        )
    return gap
