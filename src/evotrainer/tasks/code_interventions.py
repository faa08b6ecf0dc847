"""Heuristic-agent interventions for task=code, in the shape of ``agents.heuristic.CATALOGUE``.

Each is an ``Intervention`` (name, triggering findings, edit(recipe, files) -> {file: new text} or None,
hypothesis). They edit the code harness (``tasks/harnesses/code``): the reward's constants and the
curriculum's body. ``CODE_CATALOGUE`` is what the heuristic agent adds for task=code; ``proposals``
turns the applicable ones into unified diffs (what a proposal carries).
"""

from __future__ import annotations

from pathlib import Path

from evotrainer.contracts.intervention import Intervention, set_constant, unified_diff

UNIFORM = "    return np.ones(len(pool), dtype=float)\n"
# difficulty levels weighted by how learnable their failures are: levels whose programs run (right or
# wrong answers) and have a pass rate away from 0 and 1 carry GRPO signal; levels lost in syntax errors,
# missing code or crashes are left to easier levels first
FAILURE_CURRICULUM = '''    weights = np.ones(len(pool), dtype=float)
    if evidence is None or len(evidence) == 0 or "failure_category" not in evidence:
        return weights
    ran = evidence["failure_category"].isna() | (evidence["failure_category"] == "wrong_answer")
    stats = evidence.assign(ran=ran).groupby("difficulty").agg(p=("correct", "mean"), ran=("ran", "mean"))
    for level, row in stats.iterrows():
        weights[(pool["difficulty"] == level).to_numpy()] = 0.1 + 4 * row.p * (1 - row.p) * row.ran
    return weights
'''
# execution-feedback filtering: a prompt whose samples all failed without running to an answer (syntax
# error, no code, crash, timeout) or all passed teaches nothing this generation; sample it rarely
EXECUTION_FILTER = '''    weights = np.ones(len(pool), dtype=float)
    if evidence is None or len(evidence) == 0 or "failure_category" not in evidence:
        return weights
    category = evidence["failure_category"]
    useful = category.isna() | (category == "wrong_answer")
    per_prompt = evidence.assign(useful=useful).groupby("prompt_id").agg(useful=("useful", "any"),
                                                                         solved=("correct", "all"))
    dead = per_prompt.index[~per_prompt["useful"] | per_prompt["solved"]]
    weights[pool["prompt_id"].isin(dead).to_numpy()] = 0.1
    return weights
'''


def _replace_body(new: str):
    def edit(recipe: dict, files: dict) -> dict | None:
        text = files["curriculum.py"]
        return {"curriculum.py": text.replace(UNIFORM, new, 1)} if UNIFORM in text else None

    return edit


CODE_CATALOGUE: tuple[Intervention, ...] = (
    Intervention(
        "partial_credit_tests", ("all_wrong_group_ratio", "dead_group_ratio", "partial_pass_rate"),
        set_constant("reward.py", "PARTIAL_CREDIT", 0.5),
        "If a failing program earns half the fraction of hidden tests it passes (instead of 0), groups where "
        "no sample passes every test still rank their samples, fewer groups are dead, and the hidden-test pass "
        "rate on val rises faster than the control's.",
    ),
    Intervention(
        # not "reward_hacking": that is a gate's verdict on a candidate, which no diagnostic reports, so the trigger
        # never fired (contracts/finding_names.py); the trusted finding of the same thing is the repairs' business
        "all_or_nothing", ("visible_hidden_gap", "hardcoded_rate"),
        set_constant("reward.py", "PARTIAL_CREDIT", 0.0),
        "If only programs passing every hidden test are paid, partial solutions (and hard-coded examples) stop "
        "being reinforced, so the visible-vs-hidden gap closes and the val pass rate rises.",
    ),
    Intervention(
        "syntax_error_penalty", ("syntax_error_rate",),
        set_constant("reward.py", "SYNTAX_ERROR_PENALTY", 0.5),
        "If a program that does not compile scores -0.5 instead of 0, the policy learns to write valid Python "
        "first, the syntax-error rate falls and the val pass rate rises.",
    ),
    Intervention(
        "no_code_penalty", ("no_code_rate", "format_violation_rate", "truncation_rate"),
        set_constant("reward.py", "NO_CODE_PENALTY", 0.5),
        "If a response without a fenced program scores -0.5 instead of 0, the fence is learned first, the no-code "
        "rate falls and the val pass rate rises.",
    ),
    Intervention(
        "failure_category_curriculum", ("all_wrong_group_ratio", "all_correct_group_ratio", "syntax_error_rate"),
        _replace_body(FAILURE_CURRICULUM),
        "If difficulty levels are sampled by p(1-p) of their pass rate times the share of programs that run, "
        "levels that can teach (runnable but not yet solved) dominate, fewer groups are dead and the val pass "
        "rate rises.",
    ),
    Intervention(
        "execution_feedback_filter", ("dead_group_ratio", "timeout_rate", "runtime_error_rate"),
        _replace_body(EXECUTION_FILTER),
        "If prompts whose samples all crashed, timed out or did not compile (or all passed) are sampled 10x less "
        "often, the batch holds more groups with reward variance and the val pass rate rises.",
    ),
)


def proposals(harness_dir: str | Path, recipe: dict | None = None) -> dict[str, str]:
    """name -> unified diff of every intervention that applies to the harness in ``harness_dir``."""
    files = {name: (Path(harness_dir) / name).read_text(encoding="utf-8") for name in ("reward.py", "curriculum.py")}
    out = {}
    for intervention in CODE_CATALOGUE:
        new_files = intervention.edit(recipe or {}, files)
        if new_files:
            out[intervention.name] = "".join(unified_diff(n, files[n], t) for n, t in new_files.items())
    return out
