"""Partial rollout (rollout.partial): a step's responses sampled over several rounds, continued with newer weights.

Without it, a replica samples one step's batch per call and the call lasts as long as its longest response: at long
budgets the replicas spend the end of every call on a few responses. With it, the replicas run rounds; each round
continues every unfinished response by at most rollout.partial_tokens tokens (`round_tokens`), so a step's long
responses decode beside the next steps' new ones, on the newest weights the bound allows.

The schedule, with k = rollout.max_staleness >= 1: round r samples with version max(0, r-1-k), the version the
separate placement gives step r's batch without partial rollout, and holds step r's new responses and every
unfinished response of steps r-k .. r-1. A response of step s is sampled in rounds s, s+1, ..., s+k; in round s+k,
whose version s-1 is the newest step s may see, it runs to its end (finished under those weights, never regenerated).
So every token of step s comes from a version in [s-1-k, s-1]: a response's oldest token is at most k updates older
than the update that trains on it, the bound without partial rollout, and one response (one GRPO group) may mix up to
k+1 versions. Each token records its version (`token_versions`) and its log-prob under it (`rollout_log_probs`), so
the correction weighs each token by its own behaviour policy; `policy_version` is the row's oldest version.

Rounds, budgets and seeds (`round_seed`: one per response and round) are fixed by the schedule, never by timing:
a run samples the same tokens however fast its trainer and replicas are. A resume after step s starts again at round
s+1 with no response in flight: steps after s began in round s+1 or later, so they sample the same tokens (round s+1
then lacks the finished steps' responses, which a response's tokens do not depend on). A round whose replica died is
sampled again on the new replicas, from the same state.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from or1.hybrid.batch import Batch
from or1.hybrid.columns import (
    ABILITY,
    NEW_IDS,
    NEW_LOG_PROBS,
    POLICY_VERSION,
    PROMPT_IDS,
    PROMPT_KEY,
    RESPONSE_MASK,
    RESPONSE_SO_FAR,
    RESPONSE_TEXT,
    REWARD_MODEL,
    REWARDS,
    ROUND_BUDGET,
    ROUND_SEED,
    STOPPED,
    TOKEN_VERSIONS,
    UID,
    reward_input,
)
from or1.hybrid.sampling import SamplingRequest, round_seed
from or1.run_metrics import TOKEN_STALENESS_MAX, TOKEN_STALENESS_MEAN, VERSIONS_PER_GROUP_MAX
from or1.scoring import ScoringSession
from or1.trainer.step_log import PhaseTimer
from or1.trainer.step_sampler import ReplicaReplaced, Sampled, StepSampler
from or1.workers.rollout_rows import pad_rows, sampled_batch

# (version, the round's rows, the request, on_results(rank, results)): a round on the replicas holding `version`
# (`RolloutRole.continue_responses`); raises ReplicaReplaced when a replica died and was replaced
RoundCall = Callable[[int, Batch, SamplingRequest, Callable[[int, Any], None]], Any]


@dataclass
class Response:
    """One response in flight: its row in its step's batch and what its rounds sampled so far."""

    row: int
    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    stopped: bool = False
    text: str | None = None  # decoded once final
    rounds: int = 0  # the rounds that continued it


@dataclass
class StepRollout:
    """A step's responses across rounds, with its prompts, request, scoring session and phase timer."""

    step: int
    prompts: Batch
    request: SamplingRequest
    responses: list[Response]
    session: ScoringSession
    timer: PhaseTimer
    loader_state: dict[str, int]

    def unfinished(self) -> list[Response]:
        return [r for r in self.responses if r.text is None]


class PartialRounds:
    """The rounds of partial rollout (module docstring) from step `first` on; `run` hands each step's `Sampled` to
    `deliver` the moment its last response is scored, in the middle of a round, so the trainer trains it while the
    round goes on."""

    def __init__(self, sampler: StepSampler, pad_id: int) -> None:
        self.sampler, self.pad_id = sampler, pad_id
        self.cfg = sampler.cfg
        self.k, self.tokens = self.cfg.rollout.max_staleness, self.cfg.rollout.round_tokens
        self.in_flight: dict[int, StepRollout] = {}
        self.seconds = _Seconds()

    def run(
        self,
        first: int,
        last: int,
        version_of: Callable[[int], int | None],
        call: RoundCall,
        deliver: Callable[[int, Sampled], None],
    ) -> None:
        """Rounds first .. until every step up to `last` is delivered; `version_of(r)` waits for round r's weights
        (None: stop)."""
        r = first
        while r <= last or self.in_flight:
            if r <= last:
                self.in_flight[r] = self._start(r)
            began = time.perf_counter()
            version = version_of(r)
            if version is None:
                return
            self.seconds.idle += time.perf_counter() - began
            self.seconds.mark = time.perf_counter()
            self._round(r, version, call, deliver)
            self.seconds.stop()
            r += 1

    def _start(self, step: int) -> StepRollout:
        prompts = self.sampler.loader.next_batch(step, 0)
        rows = len(prompts) * self.cfg.rollout.n
        return StepRollout(
            step,
            prompts,
            SamplingRequest.training(self.cfg, step),
            [Response(row) for row in range(rows)],
            self.sampler.rewards.session(),
            PhaseTimer(),
            self.sampler.loader.state_dict(),
        )

    def _round(self, r: int, version: int, call: RoundCall, deliver: Callable[[int, Sampled], None]) -> None:
        """Continue every unfinished response once: a step at its last round (s + k <= r) to its end, the others by
        at most `tokens` tokens. Each response's result is applied as it arrives; one that ends is streamed into its
        step's scoring session, and a step whose responses all ended is delivered. A round cut by a replica's death
        is sampled again for the responses it had not returned."""
        budget = self.cfg.rollout.max_response_length
        request = self.in_flight[max(self.in_flight)].request
        while True:
            rows = [
                (s, resp)
                for s in self.in_flight.values()
                for resp in s.unfinished()
                if resp.rounds < r - s.step + 1
            ]
            if not rows:
                return
            batch = Batch(
                {
                    ROUND_BUDGET: torch.tensor(
                        [
                            budget - len(resp.tokens)
                            if s.step + self.k <= r
                            else min(self.tokens, budget - len(resp.tokens))
                            for s, resp in rows
                        ]
                    ),
                    ROUND_SEED: torch.tensor(
                        [round_seed(s.request.seed, s.step, resp.row, r) for s, resp in rows]
                    ),
                },
                {
                    PROMPT_IDS: [s.prompts[PROMPT_IDS][resp.row // self.cfg.rollout.n] for s, resp in rows],
                    RESPONSE_SO_FAR: [resp.tokens for _, resp in rows],
                },
            )

            def apply(_rank: int, results: list[dict[str, Any]], rows: list = rows) -> None:
                for result in results:
                    if result["row"] < len(rows):  # not one of the split's padding rows
                        self._apply(*rows[result["row"]], result, deliver)

            try:
                call(version, batch, request, apply)
                return
            except ReplicaReplaced:
                continue

    def _apply(
        self, s: StepRollout, resp: Response, result: dict[str, Any], deliver: Callable[[int, Sampled], None]
    ) -> None:
        """One response's round: its tokens, their version and log-probs; scored once final, and its step delivered
        once every response of it is."""
        resp.tokens += result[NEW_IDS]
        resp.log_probs += result[NEW_LOG_PROBS]
        resp.versions += [result[POLICY_VERSION]] * len(result[NEW_IDS])
        resp.stopped, resp.rounds = result[STOPPED], resp.rounds + 1
        if result[RESPONSE_TEXT] is None:
            return
        resp.text = result[RESPONSE_TEXT]
        prompt = resp.row // self.cfg.rollout.n
        s.session.submit(
            [resp.row], [reward_input(s.prompts[ABILITY][prompt], resp.text, s.prompts[REWARD_MODEL][prompt])]
        )
        if not s.unfinished():
            del self.in_flight[s.step]
            self.seconds.hand_to(s.timer)
            deliver(s.step, self._finish(s))

    def _finish(self, s: StepRollout) -> Sampled:
        """The step's Batch (the columns of a non-partial call, and `token_versions`), scored."""
        responses, width = s.responses, self.cfg.rollout.max_response_length
        batch = sampled_batch(
            s.prompts,
            [list(p) for p in s.prompts[PROMPT_IDS]],
            self.cfg.rollout.n,
            (
                [r.tokens for r in responses],
                [not r.stopped for r in responses],
                [r.log_probs for r in responses],
            ),
            [r.text or "" for r in responses],
            (self.cfg.data.max_prompt_length, width, self.pad_id),
        )
        token_versions = pad_rows([r.versions for r in responses], width, torch.long)
        batch = batch.union(
            Batch(
                {
                    TOKEN_VERSIONS: token_versions,
                    POLICY_VERSION: torch.tensor([min(r.versions) for r in responses]),
                }
            )
        )
        batch = self.sampler.score(batch, s.session, s.timer)
        sampled = Sampled(
            batch, batch, [(batch.non_tensor[PROMPT_KEY], batch.tensors[REWARDS])], s.loader_state, s.timer
        )
        sampled.metrics = token_metrics(batch, s.step)
        return sampled


@dataclass
class _Seconds:
    """The replicas' sampling and waiting seconds, handed to the next step delivered (its time/generate and
    time/rollout_idle): over a run, every second of the rounds goes to one step."""

    generate: float = 0.0
    idle: float = 0.0
    mark: float | None = None  # when the round in progress started, or its last step was delivered

    def stop(self) -> None:
        if self.mark is not None:
            self.generate += time.perf_counter() - self.mark
        self.mark = None

    def hand_to(self, timer: PhaseTimer) -> None:
        running = self.mark is not None
        self.stop()
        timer.add("generate", self.generate)
        timer.add("rollout_idle", self.idle)
        self.generate = self.idle = 0.0
        if running:
            self.mark = time.perf_counter()


def token_metrics(batch: Batch, step: int) -> dict[str, float]:
    """Per-token staleness of a partial-rollout batch trained at `step` (versions behind the weights it trains,
    step - 1), and the most versions one GRPO group's tokens mix."""
    mask = batch.tensors[RESPONSE_MASK].bool()
    versions = batch.tensors[TOKEN_VERSIONS]
    staleness = ((step - 1) - versions)[mask].float()
    groups: dict[object, set[int]] = {}
    for uid, row, row_mask in zip(batch.non_tensor[UID], versions, mask, strict=True):
        groups.setdefault(uid, set()).update(row[row_mask].tolist())
    return {
        TOKEN_STALENESS_MEAN: float(staleness.mean()) if staleness.numel() else 0.0,
        TOKEN_STALENESS_MAX: float(staleness.max()) if staleness.numel() else 0.0,
        VERSIONS_PER_GROUP_MAX: float(max((len(v) for v in groups.values()), default=0)),
    }
