"""Reward scheduling during training: where and when the verifiers of `or1.rewards` score the controller's rows.

The controller imports this package only, never its modules (an import-linter contract):
- `RewardManager` (scoring/manager.py) opens a `ScoringSession` per batch (scoring/session.py): rows go in as they
  are ready, every score comes out at `finish()`; `compute_scores` turns a batch into its score columns.
- reward.placement head scores in the controller's process on a background thread (`HeadSession`);
  reward.placement cluster spreads the rows over one scorer actor per Ray node (scoring/cluster_placement.py feeds and
  watches them, scoring/scorer.py is the actor's body). Ray is imported only then.
- `slowest_rows` names the rows that took longest to score, for the step's metrics and saved samples.
"""

from or1.scoring.manager import RewardManager
from or1.scoring.session import SLOWEST_ROWS, Scored, ScoringSession, slowest_rows

__all__ = ["SLOWEST_ROWS", "RewardManager", "Scored", "ScoringSession", "slowest_rows"]
