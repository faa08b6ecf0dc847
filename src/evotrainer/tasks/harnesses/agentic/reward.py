"""Reward for agentic episodes, in verl's custom-reward signature (so it runs unchanged under verl).

Self-contained: it runs in the sandboxed reward worker, under verl too (never in verl). One call per EPISODE:

    compute_score(data_source, solution_str, ground_truth, extra_info)
      solution_str  the transcript after the prompt ("assistant: ..." / "user: ..." blocks; under verl,
                    verl's decoded response: the same turns and observations concatenated)
      extra_info    turns, tool_calls, invalid_actions, termination (submitted | max_turns |
                    invalid_action | timeout | context_limit), env_reward (what the environment paid:
                    mini_swe 1.0 = the hidden tests passed), actions, per_turn (one dict per turn:
                    turn, tool, valid, observation_len, reward), plus the row's metadata

Returns {"score": ..., components...}; an optional "turn_rewards" list (one float per model turn) is
turn-level credit, added to the episode's advantage on that turn's tokens (the evidence records each
turn's credit in the per-turn table's turn_reward and the episode's sum in turn_credit; a trusted gate
vetoes credit that pays unsolved episodes for acting). Every constant below at 0 turns it off.
"""

TURN_CREDIT = 0.0  # per turn: +credit for running the tests after an edit, -credit for an invalid action
LOOP_PENALTY = 0.0  # per turn: -penalty for repeating the previous turn's action word for word
PREMATURE_SUBMIT_PENALTY = 0.0  # on a submit turn: -penalty when the episode made no edit before it


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    info = extra_info or {}
    solved = 1.0 if float(info.get("env_reward", 0.0)) >= 1.0 else 0.0
    out = {"score": solved, "solved": solved, "invalid_actions": float(info.get("invalid_actions", 0))}
    if TURN_CREDIT or LOOP_PENALTY or PREMATURE_SUBMIT_PENALTY:
        actions = [str(a).strip() for a in info.get("actions", [])]
        turn_rewards, edited, ever_edited = [], False, False
        for i, turn in enumerate(info.get("per_turn", [])):
            credit = 0.0 if turn.get("valid", True) else -TURN_CREDIT
            tool = turn.get("tool")
            if tool == "replace":
                edited = ever_edited = True
            elif tool == "run_tests" and edited:
                credit, edited = credit + TURN_CREDIT, False
            elif tool == "submit" and not ever_edited:
                credit -= PREMATURE_SUBMIT_PENALTY
            if 0 < i < len(actions) and actions[i] == actions[i - 1]:
                credit -= LOOP_PENALTY
            turn_rewards.append(credit)
        out["turn_rewards"] = turn_rewards
    return out
