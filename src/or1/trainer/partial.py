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
from or1.trainer.step_sampler import Sampled, StepSampler
from or1.workers.rollout_rows import pad_rows, sampled_batch

# (version, the round's rows, the request) -> the round's results (`RolloutRole.continue_responses`)
RoundCall = Callable[[int, Batch, SamplingRequest], Batch]


@dataclass
class Response:
    """One response in flight: its row in its step's batch and what its rounds sampled so far."""

    row: int
    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    stopped: bool = False
    text: str | None = None  # decoded once final


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
    `deliver` once its last response is scored."""

    def __init__(self, sampler: StepSampler, pad_id: int) -> None:
        self.sampler, self.pad_id = sampler, pad_id
        self.cfg = sampler.cfg
        self.k, self.tokens = self.cfg.rollout.max_staleness, self.cfg.rollout.round_tokens

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
        in_flight: dict[int, StepRollout] = {}
        r = first
        while r <= last or in_flight:
            if r <= last:
                in_flight[r] = self._start(r)
            newest = in_flight[max(in_flight)]
            began = time.perf_counter()
            version = version_of(r)
            if version is None:
                return
            newest.timer.add("rollout_idle", time.perf_counter() - began)
            with newest.timer("generate"):
                self._round(r, version, in_flight, call)
            for step in sorted(in_flight):
                if not in_flight[step].unfinished():
                    deliver(step, self._finish(in_flight.pop(step)))
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

    def _round(self, r: int, version: int, in_flight: dict[int, StepRollout], call: RoundCall) -> None:
        """Continue every unfinished response once: a step at its last round (s + k <= r) to its end, the others by
        at most `tokens` tokens. Responses that end are streamed into their step's scoring session."""
        n, budget = self.cfg.rollout.n, self.cfg.rollout.max_response_length
        rows = [(s, resp) for s in in_flight.values() for resp in s.unfinished()]
        last_round = [s.step + self.k <= r for s, _ in rows]
        left = [budget - len(resp.tokens) for _, resp in rows]
        batch = Batch(
            {
                ROUND_BUDGET: torch.tensor(
                    [
                        room if at_end else min(self.tokens, room)
                        for at_end, room in zip(last_round, left, strict=True)
                    ]
                ),
                ROUND_SEED: torch.tensor(
                    [round_seed(s.request.seed, s.step, resp.row, r) for s, resp in rows]
                ),
            },
            {
                PROMPT_IDS: [s.prompts[PROMPT_IDS][resp.row // n] for s, resp in rows],
                RESPONSE_SO_FAR: [resp.tokens for _, resp in rows],
            },
        )
        out = call(version, batch, in_flight[max(in_flight)].request)
        versions = out.tensors[POLICY_VERSION].tolist()
        stopped = out.tensors[STOPPED].tolist()
        ended: dict[int, list[Response]] = {}
        for i, (s, resp) in enumerate(rows):
            resp.tokens += list(out[NEW_IDS][i])
            resp.log_probs += list(out[NEW_LOG_PROBS][i])
            resp.versions += [versions[i]] * len(out[NEW_IDS][i])
            resp.stopped = stopped[i]
            if resp.stopped or len(resp.tokens) >= budget:
                resp.text = out[RESPONSE_TEXT][i]
                ended.setdefault(s.step, []).append(resp)
        for step, responses in ended.items():
            prompts = in_flight[step].prompts
            in_flight[step].session.submit(
                [resp.row for resp in responses],
                [
                    reward_input(
                        prompts[ABILITY][resp.row // n], resp.text or "", prompts[REWARD_MODEL][resp.row // n]
                    )
                    for resp in responses
                ],
            )

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
