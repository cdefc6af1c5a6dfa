"""Pure RL algorithm pieces (torch / numpy only, no Ray, no models), each checked against hand-computed values.

advantages.py       GRPO / RLOO / GAE estimators and the ADVANTAGE_ESTIMATORS registry
aggregation.py      loss aggregation modes, masked selection, the step's loss denominators
policy_losses.py    the policy-gradient terms by name: PPO-clip (clip-higher, dual clip), GSPO, CISPO
losses.py           log-probs, entropy, KL, policy_loss (PG + entropy + KL) + LossConfig, the critic's value loss
rollout_correction.py  sampler / trainer mismatch metrics, truncated IS (TIS) and rejection (MIS) weights
entropy_control.py  MAGIC's adaptive entropy controller and the sampled-token entropy estimate
filters.py          rejection sampling + trim, DAPO-style refill, per-prompt stats and online filtering
truncation.py       zero_reward / mask handling of truncated responses, DAPO's overlong penalty
"""
