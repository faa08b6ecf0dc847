"""The scoring kernel: one path from a sampled response to its verdict, reward and reward row.

    verdict (task.verify) -> reward row -> harness reward (sandboxed) -> shaping -> evidence row

``kernel.score`` is that path; training, replay, rollout, evaluation, the vLLM backend and verl's reward
function call it. ``rows`` defines the reward row, ``verdicts`` the verdict record, ``shaping`` the recipe's
shaping, ``evidence`` the evidence columns. It sits between the backends (which sample) and the tasks,
environments and sandbox (which judge and run harness code); it never imports a backend.
"""

from evotrainer.scoring.kernel import Scored, rescore, score
from evotrainer.scoring.reward import InProcessReward, Reward
from evotrainer.scoring.verdicts import Verdicts, verify

__all__ = ["InProcessReward", "Reward", "Scored", "Verdicts", "rescore", "score", "verify"]
