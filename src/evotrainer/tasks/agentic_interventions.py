"""Heuristic-agent interventions for task=agentic, in the shape of ``agents.heuristic.CATALOGUE``: edits of
the harness's env.yaml (the environment knobs, ``contracts.harness.ENV_SCHEMA``) keyed by the agentic
diagnostics' findings (turn_limit_rate, context_limit_rate, invalid_termination_rate), and the reward's
turn-level credit in reward.py: ``TURN_CREDIT`` for edits never tested and invalid actions,
``LOOP_PENALTY`` for repeated-action loops (loop_rate), ``PREMATURE_SUBMIT_PENALTY`` for submits before
any edit (premature_submit_rate). The credit edits are penalties or pay only tested edits, so the task's
``turn_credit_pays_for_actions`` gate lets them through."""

from __future__ import annotations

from collections.abc import Callable

import yaml

from evotrainer.contracts.intervention import Intervention, set_constant, set_recipe_values


def _env_edit(fn: Callable[[dict], dict | None]) -> Callable[[dict, dict], dict | None]:
    """An edit of env.yaml's values (None where the harness has no env.yaml or the knob is not in it)."""
    def edit(recipe: dict, files: dict) -> dict | None:
        if "env.yaml" not in files:
            return None
        knobs = yaml.safe_load(files["env.yaml"]) or {}
        changes = fn(knobs)
        if not changes or any(key not in knobs or knobs[key] == value for key, value in changes.items()):
            return None
        return {"env.yaml": set_recipe_values(files["env.yaml"], changes)}

    return edit


AGENTIC_CATALOGUE: tuple[Intervention, ...] = (
    Intervention(
        "raise_max_turns", ("turn_limit_rate",),
        _env_edit(lambda k: {"max_turns": min(64, int(k["max_turns"]) + 4)} if "max_turns" in k else None),
        "If episodes get 4 more turns, fewer are cut at the turn limit before a submit, so more of them reach "
        "the hidden tests and the val solve rate rises.",
        "val solve rate above the control's after the same number of steps",
    ),
    Intervention(
        "shorter_observations", ("context_limit_rate",),
        _env_edit(lambda k: {"max_observation_chars": max(100, int(k["max_observation_chars"]) // 2)}
                  if "max_observation_chars" in k else None),
        "If observations are cut to half the characters, conversations outgrow the policy's context less "
        "often, so fewer episodes end at the context limit and the val solve rate rises.",
        "val solve rate above the control's after the same number of steps",
    ),
    Intervention(
        "drop_context_limit_episodes", ("context_limit_rate",),
        _env_edit(lambda k: {"episode_filter": "drop_context_limit"}),
        "If episodes the context cut short are left out of the loss, their arbitrary endings stop adding "
        "noise to the gradient, so the val solve rate rises.",
        "val solve rate above the control's after the same number of steps",
    ),
    Intervention(
        "drop_invalid_episodes", ("invalid_termination_rate",),
        _env_edit(lambda k: {"episode_filter": "drop_invalid"}),
        "If episodes ended by invalid actions in a row are left out of the loss, the update concentrates on "
        "well-formed episodes whose outcomes depend on the tool calls, so the val solve rate rises.",
        "val solve rate above the control's after the same number of steps",
    ),
    Intervention(
        "turn_credit", ("edits_without_tests_rate", "invalid_action_rate"),
        set_constant("reward.py", "TURN_CREDIT", 0.1),
        "If a model turn that runs the tests after an edit earns +0.1 on its own tokens and an invalid action "
        "-0.1 (turn-level credit; the episode's score is unchanged), the policy learns to test its edits "
        "before submitting, the edits-without-tests rate falls and the val solve rate rises.",
        "val solve rate above the control's after the same number of steps",
    ),
    Intervention(
        "loop_penalty", ("loop_rate",),
        set_constant("reward.py", "LOOP_PENALTY", 0.2),
        "If a model turn that repeats the previous turn's action word for word earns -0.2 on its own tokens "
        "(turn-level credit; the episode's score is unchanged), the policy stops spending its turns in "
        "repeated-action loops, the loop rate falls, more episodes reach an edit and a submit, and the val "
        "solve rate rises.",
        "val solve rate above the control's after the same number of steps",
    ),
    Intervention(
        "premature_submit_penalty", ("premature_submit_rate",),
        set_constant("reward.py", "PREMATURE_SUBMIT_PENALTY", 0.5),
        "If a submit before any edit earns -0.5 on the submit turn's tokens (turn-level credit; the episode's "
        "score is unchanged, such a submit never passes the hidden tests), the policy stops giving up on the "
        "first turns, the premature submit rate falls and the val solve rate rises.",
        "val solve rate above the control's after the same number of steps",
    ),
)
