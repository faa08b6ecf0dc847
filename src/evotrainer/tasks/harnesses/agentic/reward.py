"""Reward for agentic episodes, in verl's custom-reward signature (so it runs unchanged under verl).

Self-contained on purpose: verl imports this file by path. One call per EPISODE:

    compute_score(data_source, solution_str, ground_truth, extra_info)
      solution_str  the transcript after the prompt ("assistant: ..." / "user: ..." blocks; under verl,
                    verl's decoded response: the same turns and observations concatenated)
      extra_info    turns, tool_calls, invalid_actions, termination (submitted | max_turns |
                    invalid_action | timeout | context_limit), env_reward (what the environment paid:
                    mini_swe 1.0 = the hidden tests passed), actions, per_turn (one dict per turn:
                    turn, tool, valid, observation_len, reward), plus the row's metadata

Returns {"score": ..., components...}; an optional "turn_rewards" list (one float per model turn) is
turn-level credit, added to the episode's advantage on that turn's tokens. TURN_CREDIT = 0 turns it off.
"""

TURN_CREDIT = 0.0  # per turn: +credit for running the tests after an edit, -credit for an invalid action


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    info = extra_info or {}
    solved = 1.0 if float(info.get("env_reward", 0.0)) >= 1.0 else 0.0
    out = {"score": solved, "solved": solved, "invalid_actions": float(info.get("invalid_actions", 0))}
    if TURN_CREDIT:
        turn_rewards, edited = [], False
        for turn in info.get("per_turn", []):
            credit = 0.0 if turn.get("valid", True) else -TURN_CREDIT
            if turn.get("tool") == "replace":
                edited = True
            elif turn.get("tool") == "run_tests" and edited:
                credit, edited = credit + TURN_CREDIT, False
            turn_rewards.append(credit)
        out["turn_rewards"] = turn_rewards
    return out
