"""Repairs of harness flaws no knob reaches, keyed by the trusted findings (``scoring.trusted_findings``), in
the shape of ``agents.heuristic.CATALOGUE``. The offline agent proposes a repair only when one of its findings
is flagged (warn or critical), and before the knob interventions.

Every repair is built from the text of the harness it is given, never from a shipped file: a reward repair
APPENDS a wrapper around whatever ``compute_score`` the reward.py defines (the old one renamed, so it composes
with any reward), a curriculum repair wraps or replaces ``prompt_weights``.
The lenient answer rule (``scoring.answers``) is appended verbatim where a repair needs it, so the rule the
diagnosis measured is the one the repair applies. Each repair is applied at most once (its marker comment).

- ``verdict_recheck`` (reward_false_negative_rate): a score below 1.0 of a response the verifier passed
  (``extra_info["verification"]["correct"]``, the reward row every trainer builds) scores 1.0;
- ``lenient_answer_recheck`` (reward_false_negative_rate): a score below full credit (1.0) is re-checked: the
  response's final answer read leniently (``scoring.answers``) equal to the ground truth scores 1.0 (component
  ``lenient_rescue``);
- ``pay_only_verified`` (reward_false_positive_rate): a positive score of a response the verifier failed is 0.0;
- ``all_or_nothing_reward`` (reward_false_positive_rate): 1.0 when the score is at full credit, else 0.0;
- ``no_penalty_on_valid_turns`` (penalised_valid_turn_rate): negative turn-level credit on turns the
  environment judged valid tool calls (``extra_info["per_turn"][i]["valid"]``) is dropped;
- ``drop_label_disputes`` (label_disagreement): the curriculum gives weight 0 to training prompts whose
  evidence shows the label_disagreement pattern (matched by prompt_id, or by prompt text and label: the
  evidence comes from the probe split, whose ids differ from the training pool's);
- ``uniform_curriculum`` (curriculum_starved_share, curriculum_starved_levels, never_solved_prompts,
  never_solved_across_generations): every prompt of the pool sampled equally (not proposed where the curriculum
  is uniform already).

Where both directions are flagged, ``defer_to_verifier`` (``verdict_recheck`` and ``pay_only_verified`` in one
candidate) comes first: a repair of one direction alone can beat its control and be promoted (the reward gates
judge it against the control, which has the other direction's disagreement alike), and the other can then stack
on it in the next generation, but one candidate fixes both at once. It was added for a flaw written elsewhere whose
reward erred both ways, not for a suite flaw.

In each direction the repair that uses the verifier's verdict comes first, since the verdict is what correct means:
``verdict_recheck`` before the lenient recheck, which only fits tasks whose answer is one value (the agentic flaw's
generation 0 spent its one slot on a lenient recheck that ``reward_correctness`` vetoed); ``pay_only_verified``
before ``all_or_nothing_reward``, which cannot help where the reward pays a wrong answer in full (the math flaw's
generation 1 tried it, and a diagnostic took the second slot).

A flagged ``reward_verifier_disagreement`` lends its weight to the direction that holds its rows
(``lend_disagreement``): in the code flaw's first generation it was at warn (8.6% of rows, all paid failures)
while the false-positive share of failures was 9.3%, under its own 0.1. So does a flagged
``train_reward_without_accuracy``: in math_unreadable_answers_pass the starting policy's evidence showed 1.8% of
failures paid, while the generation's control trained to reward 1.0 at verified accuracy 0.

Truncation (the trusted truncation_rate) is a knob's: the catalogue's ``raise_max_response_len``.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable

from evotrainer.contracts.intervention import Intervention
from evotrainer.scoring import answers, trusted_findings

MARKER = "# harness repair: "
FULL_CREDIT = 1.0


def answers_source() -> str:
    """``scoring.answers`` without its docstring: the lenient answer rule as code to append to a harness file."""
    source = inspect.getsource(answers)
    body = ast.parse(source).body
    start = body[1].lineno if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) else 1
    return "".join(source.splitlines(keepends=True)[start - 1:]).strip("\n") + "\n"


def defines(source: str, name: str) -> bool:
    """True when the module ``source`` defines ``name`` at its top level (a def, or an assignment)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return True
    return False


def _append(file: str, name: str, function: str, code: str) -> Callable[[dict, dict], dict | None]:
    """An edit appending ``code`` (a wrapper of ``function``) to ``file``, once, where ``file`` defines it."""
    def edit(recipe: dict, files: dict) -> dict | None:
        text = files.get(file)
        if text is None or f"{MARKER}{name}" in text or not defines(text, function):
            return None
        block = code.replace("{answers}", answers_source()) if "{answers}" in code else code
        return {file: text.rstrip("\n") + f"\n\n\n{MARKER}{name}\n" + block.strip("\n") + "\n"}

    return edit


def is_uniform(source: str) -> bool:
    """True when the curriculum's (last) ``prompt_weights`` is ``return <np>.ones(len(<pool>)...)`` alone."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "prompt_weights"]
    if not defs or not defs[-1].args.args:
        return False
    body = [n for n in defs[-1].body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    if len(body) != 1 or not isinstance(body[0], ast.Return) or not isinstance(body[0].value, ast.Call):
        return False
    call, pool = body[0].value, defs[-1].args.args[0].arg
    return (isinstance(call.func, ast.Attribute) and call.func.attr == "ones" and len(call.args) == 1
            and ast.dump(call.args[0]) == ast.dump(ast.parse(f"len({pool})", mode="eval").body))


def _uniform(recipe: dict, files: dict) -> dict | None:
    text = files.get("curriculum.py")
    if text is None or is_uniform(text) or f"{MARKER}uniform_curriculum" in text:
        return None
    return _append("curriculum.py", "uniform_curriculum", "prompt_weights", UNIFORM)(recipe, files)


_SCORE = '''
def _repair_score(out):
    return float(out["score"] if isinstance(out, dict) else out)


def _repair_with_score(out, score, **components):
    return {**out, "score": float(score), **components} if isinstance(out, dict) else float(score)


def _repair_verdict(extra_info):
    verdict = extra_info.get("verification") if isinstance(extra_info, dict) else None
    return verdict.get("correct") if isinstance(verdict, dict) else None
'''

LENIENT = f'''# A score below full credit is re-checked: the response's final answer read leniently (the last \\boxed{{}}
# or <answer> tag, else the last number or line; spaces, $, trailing punctuation and number formats
# normalised) equal to the ground truth scores {FULL_CREDIT}.
{{answers}}
{_SCORE}

_compute_score_before_lenient_recheck = compute_score


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    out = _compute_score_before_lenient_recheck(data_source, solution_str, ground_truth, extra_info)
    rescued = _repair_score(out) < {FULL_CREDIT} and lenient_match(solution_str, ground_truth)
    return _repair_with_score(out, {FULL_CREDIT} if rescued else _repair_score(out), lenient_rescue=float(rescued))
'''

VERDICT = f'''# A score below full credit of a response the task's verifier passed (the trainer's
# extra_info["verification"]["correct"]) scores {FULL_CREDIT}.
{_SCORE}

_compute_score_before_verdict_recheck = compute_score


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    out = _compute_score_before_verdict_recheck(data_source, solution_str, ground_truth, extra_info)
    rescued = _repair_verdict(extra_info) is True and _repair_score(out) < {FULL_CREDIT}
    return _repair_with_score(out, {FULL_CREDIT} if rescued else _repair_score(out), verdict_rescue=float(rescued))
'''

ALL_OR_NOTHING = f'''# Only full credit pays: a score of {FULL_CREDIT} or more scores {FULL_CREDIT}, anything else 0.0 (partial
# credit a policy can collect without a correct answer is dropped).
{_SCORE}

_compute_score_before_all_or_nothing = compute_score


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    out = _compute_score_before_all_or_nothing(data_source, solution_str, ground_truth, extra_info)
    return _repair_with_score(out, {FULL_CREDIT} if _repair_score(out) >= {FULL_CREDIT} - 1e-9 else 0.0)
'''

VERIFIED_ONLY = '''# A response the task's verifier failed (the trainer's extra_info["verification"]["correct"] is False) earns
# at most 0.0: a positive score of it is dropped.
{_SCORE}

_compute_score_before_pay_only_verified = compute_score


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    out = _compute_score_before_pay_only_verified(data_source, solution_str, ground_truth, extra_info)
    dropped = _repair_verdict(extra_info) is False and _repair_score(out) > 0.0
    return _repair_with_score(out, 0.0 if dropped else _repair_score(out), unverified_pay_dropped=float(dropped))
'''.replace("{_SCORE}", _SCORE)

VALID_TURNS = '''# Turn-level credit never penalises a turn the environment judged a valid tool call
# (extra_info["per_turn"][i]["valid"]): negative credit there is dropped.
_compute_score_before_no_penalty_on_valid_turns = compute_score


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    out = _compute_score_before_no_penalty_on_valid_turns(data_source, solution_str, ground_truth, extra_info)
    credit = out.get("turn_rewards") if isinstance(out, dict) else None
    per_turn = (extra_info or {}).get("per_turn") if isinstance(extra_info, dict) else None
    if not isinstance(credit, list | tuple) or not isinstance(per_turn, list | tuple):
        return out
    valid = [isinstance(t, dict) and t.get("valid") is True for t in per_turn]
    return {**out, "turn_rewards": [max(0.0, float(c)) if i < len(valid) and valid[i] else c
                                    for i, c in enumerate(credit)]}
'''

UNIFORM = '''# Every prompt of the pool is sampled equally often (the weighting above is no longer used).
import numpy as _uniform_np


def prompt_weights(pool, evidence=None):
    return _uniform_np.ones(len(pool), dtype=float)
'''

LABEL_DISPUTES = f'''# Training prompts whose evidence shows at least {trusted_findings.MIN_SAMPLES} samples, none correct, at least
# {trusted_findings.CONSENSUS:.0%} of them on one final answer (read leniently) that is not the label and that the
# policy gives here more often than on all other prompts together, get weight 0: their label may be wrong.
# Matched by prompt_id, or by prompt text and label (the evidence's split may name prompts differently).
import numpy as _label_np

{{answers}}

_prompt_weights_before_label_disputes = prompt_weights


def _label_prompt_text(prompt):
    if isinstance(prompt, str):
        return prompt
    try:
        messages = [dict(m) for m in prompt]
    except (TypeError, ValueError):
        return str(prompt)
    if len(messages) == 1:
        return str(messages[0].get("content", ""))
    return "\\n".join(f"{{m.get('role')}}: {{m.get('content')}}" for m in messages)


def _label_disputes(evidence):
    ids, texts = set(), set()
    needed = {{"prompt_id", "response", "ground_truth", "correct"}}
    if evidence is None or len(evidence) == 0 or not needed <= set(evidence.columns) or "turns" in evidence:
        return ids, texts
    frame = evidence.assign(_answer=[lenient_answer(r) for r in evidence["response"]])
    everywhere = frame.loc[frame["_answer"] != "", "_answer"].value_counts()
    for prompt_id, rows in frame.groupby("prompt_id", sort=False, observed=True):
        truth = str(rows["ground_truth"].iloc[0])
        if len(rows) < {trusted_findings.MIN_SAMPLES} or rows["correct"].astype(bool).any() or not lenient_label_ok(truth):
            continue
        given = rows.loc[rows["_answer"] != "", "_answer"].value_counts()
        if given.empty:
            continue
        top, count = given.index[0], int(given.iloc[0])
        if count >= {trusted_findings.CONSENSUS} * len(rows) and top != lenient_canonical(truth) and everywhere[top] - count < count:
            ids.add(str(prompt_id))
            texts.add((str(rows["prompt"].iloc[0]) if "prompt" in rows else "", truth))
    return ids, texts


def prompt_weights(pool, evidence=None):
    weights = _label_np.asarray(_prompt_weights_before_label_disputes(pool, evidence), dtype=float)
    ids, texts = _label_disputes(evidence)
    if not ids:
        return weights
    drop = _label_np.fromiter(
        (str(i) in ids or (_label_prompt_text(p), str(t)) in texts
         for i, p, t in zip(pool["prompt_id"], pool["prompt"], pool["ground_truth"])), dtype=bool, count=len(pool))
    kept = _label_np.where(drop, 0.0, weights)
    return kept if kept.sum() > 0 else weights
'''

DISAGREEMENT = "reward_verifier_disagreement"
TRAINING_DIVERGENCE = "train_reward_without_accuracy"
LENDERS = (DISAGREEMENT, TRAINING_DIVERGENCE)
DIRECTIONS = ("reward_false_positive_rate", "reward_false_negative_rate")


def lend_disagreement(severity: dict[str, float], findings: list[dict]) -> dict[str, float]:
    """The weight of a flagged lender lent to the reward-verifier directions, in proportion to the rows each holds
    in the evidence (the reward repairs are keyed by direction):
    - ``reward_verifier_disagreement``, a share of all rows, can cross its threshold while neither direction's
      share of its own rows does;
    - ``train_reward_without_accuracy`` (the training reward rose while verified accuracy collapsed) is seen in
      training, which the evidence of the starting policy may not show: with no row in either direction, its
      weight goes to the false positives (the reward paid what the verifier failed).
    Returns {direction: weight lent}; the flagged lenders are ``lenders_of(severity)``."""
    weight = max(severity.get(name, 0.0) for name in LENDERS)
    rows = {f["name"]: int(f.get("affected_rows") or 0) for f in findings if f["name"] in DIRECTIONS}
    total = sum(rows.values())
    if weight <= 0:
        return {}
    if total <= 0:
        if severity.get(TRAINING_DIVERGENCE, 0.0) <= 0:
            return {}
        rows, total = {DIRECTIONS[0]: 1}, 1
    lent = {name: weight * n / total for name, n in rows.items() if n > 0}
    for name, extra in lent.items():
        severity[name] = max(severity.get(name, 0.0), extra)
    return lent


def lenders_of(severity: dict[str, float]) -> list[str]:
    """The lenders flagged in ``severity`` (the names a repair that received their weight also targets)."""
    return [name for name in LENDERS if severity.get(name, 0.0) > 0]


def _both(*edits: Callable[[dict, dict], dict | None]) -> Callable[[dict, dict], dict | None]:
    """One edit that applies ``edits`` in turn (each to the files the last left); None unless every one applies."""
    def edit(recipe: dict, files: dict) -> dict | None:
        current, changed = dict(files), {}
        for one in edits:
            out = one(recipe, current)
            if not out:
                return None
            current |= out
            changed |= out
        return changed

    return edit


# repairs proposed only where every one of their triggers is flagged (the others: where any one is)
NEEDS_EVERY_TRIGGER = frozenset({"defer_to_verifier"})

REPAIRS: tuple[Intervention, ...] = (
    Intervention(
        "defer_to_verifier", DIRECTIONS,
        _both(_append("reward.py", "verdict_recheck", "compute_score", VERDICT),
              _append("reward.py", "pay_only_verified", "compute_score", VERIFIED_ONLY)),
        "If the reward defers to the task's verifier in both directions (a response it passed earns full credit, one "
        "it failed earns at most 0), the reward stops rejecting correct answers and stops paying wrong ones, both "
        "reward_false_negative_rate and reward_false_positive_rate fall to 0 and val accuracy rises above control.",
    ),
    Intervention(
        "verdict_recheck", ("reward_false_negative_rate",),
        _append("reward.py", "verdict_recheck", "compute_score", VERDICT),
        "If a response the task's verifier passed (extra_info['verification']) always earns full credit, the reward "
        "stops rejecting correct answers, reward_false_negative_rate falls to 0 and val accuracy rises above control.",
    ),
    Intervention(
        "lenient_answer_recheck", ("reward_false_negative_rate",),
        _append("reward.py", "lenient_answer_recheck", "compute_score", LENIENT),
        "If a response the reward scores below full credit is re-checked with a lenient reading of its final answer "
        "(last boxed or <answer> tag / number / line, formats normalised) against the ground truth, correct answers "
        "in a format the policy drifted to are paid again, reward_false_negative_rate falls and val accuracy rises above control.",
    ),
    Intervention(
        "pay_only_verified", ("reward_false_positive_rate",),
        _append("reward.py", "pay_only_verified", "compute_score", VERIFIED_ONLY),
        "If a response the task's verifier failed earns at most 0, the reward cannot be gamed without a correct "
        "answer, reward_false_positive_rate falls to 0 and val accuracy rises above control.",
    ),
    Intervention(
        "all_or_nothing_reward", ("reward_false_positive_rate",),
        _append("reward.py", "all_or_nothing_reward", "compute_score", ALL_OR_NOTHING),
        "If only full credit pays (1.0 at full credit, else 0.0), the partial credit the policy collects on "
        "incorrect answers disappears, reward_false_positive_rate falls and val accuracy rises above control.",
    ),
    Intervention(
        "no_penalty_on_valid_turns", ("penalised_valid_turn_rate",),
        _append("reward.py", "no_penalty_on_valid_turns", "compute_score", VALID_TURNS),
        "If turn-level credit never penalises a valid tool call, the policy stops being pushed away from valid "
        "calls, penalised_valid_turn_rate falls to 0 and the val solve rate rises above control.",
        "val solve rate above the control's after the same number of steps",
    ),
    Intervention(
        "drop_label_disputes", ("label_disagreement",),
        _append("curriculum.py", "drop_label_disputes", "prompt_weights", LABEL_DISPUTES),
        "If training prompts whose samples agree on one answer the verifier rejects (a label that may be wrong) "
        "are not trained on, the policy is no longer pushed away from its consensus answers there, and val "
        "accuracy rises above control.",
    ),
    Intervention(
        "uniform_curriculum", ("curriculum_starved_share", "curriculum_starved_levels", "never_solved_prompts",
                               "never_solved_across_generations"),
        _uniform,
        "If every training prompt is sampled equally often, the prompts the current curriculum starves are "
        "trained on again, fewer prompts stay never solved and val accuracy rises above control.",
    ),
)
