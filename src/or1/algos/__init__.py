"""Pure RL algorithm pieces (torch / numpy only, no Ray, no models), each checked against hand-computed values.

advantages.py       GRPO / RLOO / GAE estimators and the ADVANTAGE_ESTIMATORS registry
losses.py           PPO-clip (clip-higher, dual clip), loss aggregation, log-probs, entropy, KL, policy_loss + LossConfig
entropy_control.py  MAGIC's adaptive entropy controller and the sampled-token entropy estimate
filters.py          rejection sampling + trim, DAPO-style refill, per-prompt stats and online filtering
truncation.py       zero_reward / mask handling of truncated responses
"""
