"""The GPU hand-off between a rank's actor and its colocated rollout engine, and the weights push with its self-test.

The actor and the rollout engine take turns with the device's memory (`WeightSync.rollout_phase`): wake the
rollout's weights, push the actor's weights when they changed, offload the actor (actor.offload), wake the rollout's
KV cache, generate, put the rollout to sleep, onload the actor. On the CPU every one of those calls is a no-op. The
push streams the actor's weights into the engine in memory, layer by layer
(`load_weights(actor.named_full_params())`).

The push's self-test: a push that silently did nothing (a skipped sync under sleep mode, a renamed tensor an engine
ignores) leaves the sampler on old weights while training goes on as if on-policy. After every push the engine and
the actor score the same few tokens; `check_push` stops the run with one line naming the step when they disagree by
more than the tolerance of their dtypes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from or1.errors import UserError
from or1.hybrid.batch import Batch
from or1.hybrid.columns import LOG_PROBS, SEQUENCE_COLUMNS
from or1.workers.rollout_rows import pack_sequences

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from or1.engines.fsdp_actor import FSDPPolicyEngine
    from or1.engines.rollout import RolloutEngine

# A fixed text whose tokens both sides score: any tokenizer encodes it, and it is short (one tiny forward).
PROBE_TEXT = "Compute 12+7-3. 12+7=19. 19-3=16. The answer is \\boxed{16}."
FLOAT32_TOLERANCE = 1e-3  # both sides float32: different kernels agree to ~1e-5
HALF_TOLERANCE = 0.1  # a 16-bit side: rounding and kernels differ by ~1e-2 per token on average


class WeightSync:
    """Which of a rank's actor and rollout engine holds the GPU, and which weights the engine holds.

    The engine starts from the actor's folder (weights version 0); the worker counts the actor's weight changes and
    names the version it wants sampled from, and the weights move only when that differs from the engine's.
    """

    def __init__(
        self,
        actor: FSDPPolicyEngine,
        rollout: RolloutEngine,
        tokenizer: PreTrainedTokenizerBase,
        *,
        check: bool,
        tolerance: float,
    ):
        self.actor, self.rollout, self.tokenizer = actor, rollout, tokenizer
        self.check, self.tolerance = check, tolerance  # rollout.weight_sync_check, the probe's tolerance
        self.rollout_version = 0  # the actor's weights version the engine holds

    @contextmanager
    def rollout_phase(self, weights_version: int, where: str = "") -> Iterator[None]:
        """The rollout engine holds the GPU inside the block, the actor outside it, the engine on `weights_version`.

        The push needs both (it gathers the actor's shards on the GPU into the woken weights), so it runs before the
        actor leaves and before the KV cache comes back; its self-test scores the probe with the actor before it
        leaves and with the engine once it can run (`where` names the step in its error)."""
        self.rollout.wake_up(tags=["weights"])
        probe = None
        if self.rollout_version != weights_version:  # collective: every rank streams every tensor
            self.push_weights()
            self.rollout_version = weights_version
            probe = actor_probe(self.actor, self.tokenizer, self.rollout.pad_token_id) if self.check else None
        self.actor.offload()
        self.rollout.wake_up(tags=["kv_cache"])
        try:
            if probe is not None:
                engine = self.rollout.score_ids(probe[0])
                check_push(engine, probe[1], self.tolerance, where)
            yield
        finally:
            self.rollout.sleep()
            self.actor.onload()

    def push_weights(self) -> None:
        """Stream the actor's weights into the rollout engine (collective)."""
        self.rollout.load_weights(self.actor.named_full_params())


def actor_probe(
    actor: FSDPPolicyEngine, tokenizer: PreTrainedTokenizerBase, pad_id: int
) -> tuple[list[int], list[float]]:
    """The probe's token ids and the actor's log-probs of all but the first, at temperature 1 (collective)."""
    ids = tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"]
    tensors = pack_sequences([ids[:1]], [ids[1:]], 1, len(ids) - 1, pad_id)
    out = actor.log_probs(Batch(tensors).only(SEQUENCE_COLUMNS), temperature=1.0)
    return ids, out.tensors[LOG_PROBS][0].tolist()


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
