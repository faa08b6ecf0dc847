"""The registries of the plug-in kinds that live above the config (agents, trainer backends, rollout
players), declared here, on the bottom floor, so that ``config.validate`` can check ``agent.name``,
``trainer.name`` and ``rollout.name`` against what is installed without importing the packages that
implement them. Each package uses its registry from here (``agents.AGENTS``, ``backends.TRAINERS``,
``backends.rollouts.ROLLOUTS`` are these objects); tasks and environments, below the config, keep their
registries in their own packages (``tasks.TASKS``, ``envs.ENVS``). Built-ins are "module:attr" strings,
imported only when chosen."""

from __future__ import annotations

from evotrainer.loading import Registry


class RolloutError(ValueError):
    """A rollout kind that is not installed, or that cannot play the task's rollouts."""


AGENTS = Registry("agent", "evotrainer.agents", {
    "heuristic": "evotrainer.agents.heuristic:HeuristicAgent",
    "search_control": "evotrainer.agents.baselines:SearchControlAgent",  # baseline arms of the headline
    "random": "evotrainer.agents.baselines:RandomSearchAgent",
    "tpe": "evotrainer.agents.tuners:TPETunerAgent",  # tuners on Optuna over the knob space (docs/tuners.md)
    "cmaes": "evotrainer.agents.tuners:CmaEsTunerAgent",
    "pbt": "evotrainer.agents.pbt:PBTAgent",  # population-based training over a generation's slots
    "claude": "evotrainer.agents.claude:make",  # the SDKs are imported only when an agent is made
    "openai": "evotrainer.agents.openai_agent:make",
}, ValueError, descriptions={
    "heuristic": "offline: a deterministic catalogue of known RL interventions, ranked by the findings",
    "search_control": "baseline arm: the parent harness unchanged under other training seeds",
    "random": "baseline arm: one recipe knob per candidate, set at random near its current value",
    "tpe": "tuner: Optuna's TPE over the recipe's knob space, rebuilt from the run's lineage each generation",
    "cmaes": "tuner: Optuna's CMA-ES over the recipe's numeric knobs (categoricals at random), rebuilt likewise",
    "pbt": "arm: population-based training; the bottom quarter copies the top member's policy and perturbs its recipe",
    "claude": "an LLM agent through the anthropic SDK (Messages API with tool use; agent.model)",
    "openai": "an LLM agent through any OpenAI-compatible chat-completions endpoint (agent.model, agent.base_url)",
})

# trainer backends: ``(job, reward=, task=, weights=, cfg=) -> train log`` (evotrainer.backends)
TRAINERS = Registry("trainer", "evotrainer.trainers", {
    "local": "evotrainer.backends.local.trainer:train",
    "verl": "evotrainer.backends.verl.launch:train",
}, ValueError, descriptions={
    "local": "one-process GRPO in torch (CPU or one GPU)",
    "verl": "verl's PPO trainer (Ray, SLURM); optional, needs verl installed (pip install -e '.[verl]')",
})

# rollout players (evotrainer.backends.rollouts): ``(setting, policy_dir=, model=, tokenizer=) -> Player``
ROLLOUTS = Registry("rollout", "evotrainer.rollouts", {
    "hf": "evotrainer.backends.rollouts:hf",
    "vllm": "evotrainer.backends.rollouts:VllmPlayer",
}, RolloutError, descriptions={
    "hf": "the local policy in torch: sampled responses, or episodes for a multi-turn task",
    "vllm": "vLLM's offline engine (GPU); single-turn tasks",
})
