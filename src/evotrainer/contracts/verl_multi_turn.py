"""What trainer=verl can honour for a multi-turn task (task=agentic), shared by the two places that check
it: the config check before a run starts (evotrainer.config, the initial harness and
``trainer.verl.overrides``) and the verl backend for every candidate harness (backends/verl/overrides.py,
which maps the rest of a harness onto verl's keys).

``AGENT_LOOP_KEYS`` are the verl keys evotrainer's agent-loop wiring sets, which ``trainer.verl.overrides``
may not replace; ``ENV_OFF`` the env.yaml knobs verl has no counterpart for, refused unless at that value.
It sits with the contracts, below the config and the backends, so that the config check needs no backend.
"""

from __future__ import annotations

from typing import Any

from evotrainer.contracts.harness import HarnessError, check_env

ROLLOUT = "actor_rollout_ref.rollout"
AGENT = f"{ROLLOUT}.agent"
MULTI_TURN = f"{ROLLOUT}.multi_turn"
# the verl keys the agent-loop wiring sets for a multi-turn task; trainer.verl.overrides may not replace them
AGENT_LOOP_KEYS = (f"{AGENT}.", f"{MULTI_TURN}.", "data.max_response_length")
# env.yaml knobs without a verl counterpart (backends/verl/overrides.py ENV_TO_VERL maps them to ()) and the
# value at which they are off
ENV_OFF = {"episode_filter": "none"}


def check_multi_turn_for_verl(recipe: dict[str, Any], env_knobs: dict[str, Any] | None,
                              where: str = "harness") -> dict[str, Any]:
    """env.yaml's knobs (checked) for a multi-turn task under verl; a knob or recipe key verl cannot honour
    for episodes is refused (HarnessError naming it) instead of being dropped."""
    knobs = check_env(dict(env_knobs or {}), f"{where}/env.yaml")
    for key, off in ENV_OFF.items():
        if knobs.get(key, off) != off:
            raise HarnessError(f"{where}/env.yaml: {key!r} = {knobs[key]!r} has no verl counterpart (verl trains on every "
                               f"episode its agent loop returns); under trainer=verl set {key}: {off}, or train with "
                               "trainer=local")
    if recipe["overlong_buffer"] > 0:
        raise HarnessError(f"{where}/recipe.yaml: 'overlong_buffer' ({recipe['overlong_buffer']}) shapes one response, but "
                           "under trainer=verl a multi-turn task's response is the whole episode (turns and "
                           "observations), which verl's DAPO buffer would penalise instead; set overlong_buffer: 0")
    return knobs

