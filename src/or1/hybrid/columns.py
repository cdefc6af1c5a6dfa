"""The Batch columns of one training step, in the order the step makes them (B rows, P prompt and R response tokens).

A column is spelled here once; the prompt loader, the workers, the engines and the controller's phases use these
names, so a reader finds every producer and consumer of a column by its constant.
"""

from __future__ import annotations

from typing import Any

# Prompts (trainer/prompt_loader.py, trainer/validation.py), non-tensor, one per prompt
PROMPT_IDS = "prompt_ids"  # the chat-templated prompt's token ids (or1.tokens.prompt_ids)
UID = "uid"  # the GRPO group: one per prompt, repeated over its n samples
PROMPT_KEY = "prompt_key"  # the prompt's content hash (online filter, prompt statistics)
ABILITY = "ability"  # math | code: which verifier scores it
REWARD_MODEL = "reward_model"  # {"ground_truth": ...}, as in the or1 row
DATA_SOURCE = "data_source"

# Rollout (workers/actor_rollout_ref.generate_sequences), tensors
INPUT_IDS = "input_ids"  # [B, P + R]: prompt left-padded, response right-padded
ATTENTION_MASK = "attention_mask"  # [B, P + R]
RESPONSES = "responses"  # [B, R]: the last R columns of input_ids
RESPONSE_MASK = "response_mask"  # [B, R]: the loss mask
RESPONSE_LENGTH = "response_length"  # [B]
ROLLOUT_LOG_PROBS = "rollout_log_probs"  # [B, R]: the sampler's own log-probs
TRUNCATED = "truncated"  # [B]: hit the response budget without a stop token
RESPONSE_TEXT = "response_text"  # non-tensor: the decoded response
POLICY_VERSION = (
    "policy_version"  # [B]: the training step whose weights sampled the row (0: the stage's start)
)
# partial rollout (trainer/partial.py): [B, R] the version that sampled each response token; POLICY_VERSION is then
# the row's oldest
TOKEN_VERSIONS = "token_versions"

# A partial rollout round (workers/rollout_worker.RolloutRole.continue_responses): in, per row, its prompt (PROMPT_IDS),
# the response so far, its token budget and seed for the round; out, the tokens sampled, their log-probs, whether a
# stop token ended the response, and its decoded text (RESPONSE_TEXT) once it is final
RESPONSE_SO_FAR = "response_so_far"  # non-tensor: token ids
ROUND_BUDGET = "round_budget"  # [B]
ROUND_SEED = "round_seed"  # [B]
NEW_IDS = "new_ids"  # non-tensor: token ids
NEW_LOG_PROBS = "new_log_probs"  # non-tensor: floats
STOPPED = "stopped"  # [B]

# Rewards (scoring/manager.py) and the truncation policy (trainer/phases.py)
SCORES = "scores"  # [B]: the verifier's score
SCORE_REASON = "score_reason"  # non-tensor: why (correct, wrong answer, timeout, ...)
SCORE_SECONDS = "score_seconds"  # non-tensor: wall seconds the verifier spent on the row
SCORE_NODE = "score_node"  # non-tensor: where it was scored ("head", or the Ray node's short id)
REWARD_SECONDS = "reward_seconds"  # meta of a scored batch: {ability: seconds its verifier took}
REWARD_HIDDEN = "reward_hidden"  # meta: seconds of scoring that ran while the rows were still being generated
REWARDS = "rewards"  # [B]: the score after the truncation policy

# Actor, reference and critic passes (engines/fsdp_actor.py, fsdp_critic.py through the workers)
LOG_PROBS = "log_probs"  # [B, R]: what an engine's log-prob pass returns
ENTROPY = "entropy"  # [B, R]: full-vocabulary entropy of the old policy
OLD_LOG_PROBS = "old_log_probs"  # [B, R]
REF_LOG_PROBS = "ref_log_probs"  # [B, R]
VALUES = "values"  # [B, R]: the critic's
ADVANTAGES = "advantages"  # [B, R]: on the controller (algos/advantages.py)
IS_WEIGHTS = "rollout_is_weights"  # [B, R]: rollout-correction weights (algos/rollout_correction.py), when on
RETURNS = "returns"  # [B, R]: the critic's targets

# What a pass over the sequences needs (log-probs, values) and what each update adds to it
SEQUENCE_COLUMNS = (INPUT_IDS, ATTENTION_MASK, RESPONSES, RESPONSE_MASK)
UPDATE_COLUMNS = (*SEQUENCE_COLUMNS, OLD_LOG_PROBS, ADVANTAGES)
CRITIC_COLUMNS = (*SEQUENCE_COLUMNS, VALUES, RETURNS)
REWARD_COLUMNS = (ABILITY, RESPONSE_TEXT, REWARD_MODEL)  # what the verifiers read


def reward_input(ability: str, response: str, reward_model: dict[str, Any]) -> dict[str, Any]:
    """One row as the verifiers read it (`or1.rewards.score`): the REWARD_COLUMNS, the text named `response`."""
    return {ABILITY: ability, "response": response, REWARD_MODEL: reward_model}
