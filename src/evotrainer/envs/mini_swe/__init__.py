"""``mini_swe``: generated Python repositories with one injected bug, fixed through view / run_tests /
replace / submit, rewarded by hidden tests run in the OS sandbox (see ``env`` and docs/environments.md)."""

from evotrainer.envs.mini_swe.env import MiniSweEnv, expert_actions, instance_of, random_actions
from evotrainer.envs.mini_swe.repos import Instance, generate
from evotrainer.envs.mini_swe.templates import BUG_KINDS

__all__ = ["BUG_KINDS", "Instance", "MiniSweEnv", "expert_actions", "generate", "instance_of", "random_actions"]
