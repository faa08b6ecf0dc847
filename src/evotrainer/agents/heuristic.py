"""Offline agent: a deterministic catalogue of known RL interventions keyed by findings.

Each intervention edits one variable of the harness and states a falsifiable hypothesis.
Interventions whose triggers fired rank first (critical findings weigh double); the rest fill the
remaining slots in catalogue order as exploration. The repairs of harness flaws no knob reaches
(agents/repairs.py, keyed by the trusted findings) are proposed only when one of their findings is
flagged, and then before every other intervention. An identical diff already tried from the same
parent harness (per the lineage) is not proposed again, unless it answers a trusted finding still critical and
every try gained but not surely (``ProposalContext.worth_retrying``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import yaml

from evotrainer.agents.base import ProposalContext
from evotrainer.agents.diagnostic_ideas import propose_diagnostics
from evotrainer.agents.guidance import Guidance
from evotrainer.agents.repairs import NEEDS_EVERY_TRIGGER, REPAIRS, lend_disagreement, lenders_of
from evotrainer.contracts.candidate import Proposal
from evotrainer.contracts.harness import RECIPE_SCHEMA, load_recipe
from evotrainer.contracts.intervention import Intervention, set_recipe_values, unified_diff
from evotrainer.runtime import diff_hash
from evotrainer.sandbox.candidate_check import validate

SEVERITY_WEIGHT = {"warn": 1.0, "critical": 2.0}
# catalogue entries that buy compute a responses budget does not charge (stages/propose.uncharged_compute)
UNCHARGED_UNDER_RESPONSES = frozenset({"raise_max_response_len", "raise_max_turns"})
MAX_RESPONSE_LEN = int(RECIPE_SCHEMA["max_response_len"].high)


def _recipe_edit(fn: Callable[[dict], dict | None]) -> Callable[[dict, dict], dict | None]:
    def edit(recipe: dict, files: dict) -> dict | None:
        changes = fn(recipe)
        if not changes or all(recipe.get(k) == v for k, v in changes.items()):
            return None
        return {"recipe.yaml": set_recipe_values(files["recipe.yaml"], changes)}

    return edit


def _replace_in(file: str, old: str, new: str) -> Callable[[dict, dict], dict | None]:
    def edit(recipe: dict, files: dict) -> dict | None:
        return {file: files[file].replace(old, new, 1)} if old in files[file] else None

    return edit


_BINARY_SCORE = '"score": 1.0 if correct else 0.0'
_FORMAT_SHAPED = '"score": 1.0 if correct else (0.0 if format_ok else -0.5)'
_UNIFORM_CURRICULUM = "    return np.ones(len(pool), dtype=float)\n"
_PASS_RATE_CURRICULUM = '''    weights = np.ones(len(pool), dtype=float)
    if evidence is None or len(evidence) == 0:
        return weights
    # favour difficulty levels with pass rates away from 0 and 1 (they carry GRPO signal)
    pass_rate = evidence.groupby("difficulty")["correct"].mean()
    for difficulty, p in pass_rate.items():
        weights[(pool["difficulty"] == difficulty).to_numpy()] = 0.1 + 4 * p * (1 - p)
    return weights
'''

CATALOGUE: tuple[Intervention, ...] = (
    Intervention(
        "dynamic_sampling", ("dead_group_ratio", "train_dead_group_ratio", "reward_spread"),
        _recipe_edit(lambda r: {"dynamic_sampling": True}),
        "If zero-variance groups are dropped and the batch refilled (DAPO dynamic sampling), every step "
        "carries gradient signal, so val accuracy rises faster than the control's.",
    ),
    Intervention(
        "lower_lr", ("entropy_trend", "reward_trend", "kl_final", "clip_fraction"),
        _recipe_edit(lambda r: {"lr": r["lr"] * 0.5}),
        "If the learning rate is halved, the policy stops drifting (entropy and reward trends stabilise), "
        "so val accuracy ends higher than the control's.",
    ),
    Intervention(
        "smaller_groups_more_prompts", ("all_correct_group_ratio", "dead_group_ratio"),
        _recipe_edit(lambda r: {"group_size": r["group_size"] // 2, "prompts_per_step": r["prompts_per_step"] * 2}
                     if r["group_size"] >= 4 else None),
        "If each step sees twice the prompts with half the samples each (same sample budget), easy prompts "
        "waste fewer samples and the gradient covers more of the data, so val accuracy rises.",
    ),
    Intervention(
        "larger_groups_fewer_prompts", ("all_wrong_group_ratio",),
        _recipe_edit(lambda r: {"group_size": r["group_size"] * 2, "prompts_per_step": max(1, r["prompts_per_step"] // 2)}
                     if r["group_size"] <= 32 else None),
        "If each prompt gets twice the samples (same sample budget), hard prompts more often get one success "
        "to learn from, so all-wrong groups fall and val accuracy rises.",
    ),
    Intervention(
        "clip_higher", ("entropy_trend",),
        _recipe_edit(lambda r: {"clip_high": max(r["clip_high"], 0.28)}),
        "If the upper clip is raised to 0.28 (clip-higher), low-probability tokens can grow, entropy "
        "collapses less, and val accuracy ends higher.",
    ),
    Intervention(
        "kl_penalty", ("kl_final", "length_drift"),
        _recipe_edit(lambda r: {"kl_coef": 0.01 if r["kl_coef"] == 0 else min(1.0, r["kl_coef"] * 2)}),
        "If a KL penalty to the parent policy is added, the policy drifts less per generation, so the "
        "gains are kept and val accuracy does not fall.",
    ),
    Intervention(
        "overlong_shaping", ("truncation_rate",),
        _recipe_edit(lambda r: {"overlong_buffer": max(1, r["max_response_len"] // 4)} if r["overlong_buffer"] == 0 else None),
        "If responses near the length limit are softly penalised, truncations fall and so do the format "
        "violations they cause, so val accuracy rises.",
    ),
    Intervention(
        "format_penalty", ("format_violation_rate",),
        _replace_in("reward.py", _BINARY_SCORE, _FORMAT_SHAPED),
        "If unparseable answers score -0.5 instead of 0, the policy learns the answer format first, so "
        "format violations fall and val accuracy rises.",
    ),
    Intervention(
        "pass_rate_curriculum", ("all_correct_group_ratio", "all_wrong_group_ratio"),
        _replace_in("curriculum.py", _UNIFORM_CURRICULUM, _PASS_RATE_CURRICULUM),
        "If prompts are sampled by difficulty level in proportion to p(1-p) of their pass rate, fewer groups "
        "are dead, so val accuracy rises.",
    ),
    Intervention(
        "lower_temperature", ("format_violation_rate", "truncation_rate"),
        _recipe_edit(lambda r: {"temperature": round(max(0.5, r["temperature"] - 0.2), 3)}),
        "If sampling temperature is lowered by 0.2, fewer malformed samples are drawn, so the gradient is "
        "less noisy and val accuracy rises.",
    ),
    Intervention(
        "higher_temperature", ("entropy_trend", "all_correct_group_ratio"),
        _recipe_edit(lambda r: {"temperature": round(min(1.5, r["temperature"] + 0.2), 3)}),
        "If sampling temperature is raised by 0.2, groups are more diverse, fewer are dead, and val accuracy rises.",
    ),
    Intervention(
        "no_std_normalisation", (),
        _recipe_edit(lambda r: {"norm_adv_by_std": False}),
        "If advantages are not divided by the group std (Dr. GRPO), near-solved and near-hopeless prompts "
        "stop dominating the update, so val accuracy rises.",
    ),
    Intervention(
        "raise_max_response_len", ("truncation_rate",),
        _recipe_edit(lambda r: {"max_response_len": min(MAX_RESPONSE_LEN, r["max_response_len"] * 2)}
                     if r["max_response_len"] < MAX_RESPONSE_LEN else None),
        "If max_response_len is doubled (within the recipe schema), fewer responses are cut before their answer, "
        "truncation_rate falls and val accuracy rises.",
    ),
    Intervention(
        "raise_lr", (),
        _recipe_edit(lambda r: {"lr": min(1e-2, r["lr"] * 1.5)}),
        "If the learning rate is raised by half, learning is faster within the same budget, so val accuracy rises.",
    ),
)


HARNESS_STEMS = ("recipe", "reward", "curriculum", "diagnostics")


def vocabulary(recipe: dict) -> set[str]:
    """What human feedback can name: interventions, recipe keys, harness files."""
    return {i.name for i in CATALOGUE + REPAIRS} | set(recipe) | set(HARNESS_STEMS)


def touched_names(recipe: dict, new_files: dict[str, str]) -> set[str]:
    """The recipe keys an edit changes and the code files it edits (by stem)."""
    names = {Path(f).stem for f in new_files if f != "recipe.yaml"}
    if "recipe.yaml" in new_files:
        new = yaml.safe_load(new_files["recipe.yaml"]) or {}
        names |= {key for key, value in new.items() if recipe.get(key) != value}
    return names


def _diff_files(diff: str) -> list[str]:
    return sorted({line[6:].strip() for line in diff.splitlines() if line.startswith("+++ b/")})


def _skill_note(skill: dict | None) -> str:
    if not skill:
        return ""
    gain = skill["validation"].get("mean_gain")
    return (f" (Skill {skill['skill_id']} worked before for a similar diagnosis: mean gain "
            f"{'n/a' if gain is None else f'{gain:+.3f}'}, held in {len(skill['validation']['held_in'])} domain(s).)")


class HeuristicAgent:
    name = "heuristic"

    def narrate(self, context: ProposalContext) -> str:
        flagged = [f for f in context.findings if f["severity"] in ("warn", "critical")]
        if not flagged:
            text = "No diagnostic crossed its threshold; proposals are exploratory."
        else:
            parts = [f"{f['name']} = {f['value']:.3g} ({f['severity']}, threshold {f['threshold']})" for f in flagged]
            text = "Flagged: " + "; ".join(parts) + "."
        recipe = load_recipe(context.harness_dir)
        steer = Guidance.from_context(context, vocabulary(recipe)).summary(context.feedback)
        return text + ("\n\n" + steer if steer else "")

    def propose(self, context: ProposalContext, k: int) -> list[Proposal]:
        """Catalogue interventions that apply, minus those already tried from this parent, avoided by
        human feedback or failed as skills; ordered by feedback preference, then worked skills, then
        the weight of the findings that trigger them, then catalogue order (see agents/guidance.py)."""
        recipe = load_recipe(context.harness_dir)
        files = {name: (context.harness_dir / name).read_text(encoding="utf-8")
                 for name in ("recipe.yaml", "reward.py", "curriculum.py", "diagnostics.py")}
        if (context.harness_dir / "env.yaml").is_file():  # multi-turn harnesses: the environment knobs
            files["env.yaml"] = (context.harness_dir / "env.yaml").read_text(encoding="utf-8")
        severity = {f["name"]: SEVERITY_WEIGHT.get(f["severity"], 0.0) for f in context.findings}
        lent = lend_disagreement(severity, context.findings)
        tried = self._tried(context)
        guidance = Guidance.from_context(context, vocabulary(recipe))
        options: list[tuple[tuple, Proposal]] = []
        # the generic catalogue, then the task's own (context.extra["interventions"], e.g. the code domain's),
        # then the repairs, which only a flagged finding calls for (and which then come first)
        known = CATALOGUE + tuple(context.extra.get("interventions", ()))
        if context.extra.get("ledger_unit") == "responses":  # propose refuses what the ledger would not charge
            known = tuple(i for i in known if i.name not in UNCHARGED_UNDER_RESPONSES)
        for index, intervention in enumerate(known + REPAIRS):
            repair = index >= len(known)
            flagged = [severity.get(t, 0.0) > 0 for t in intervention.triggers]
            if repair and not (all(flagged) if intervention.name in NEEDS_EVERY_TRIGGER else any(flagged)):
                continue
            new_files = intervention.edit(recipe, files)
            if not new_files:
                continue
            diff = "".join(unified_diff(name, files[name], text) for name, text in new_files.items())
            if not diff or diff_hash(diff) in tried:
                continue
            names = {intervention.name, *touched_names(recipe, new_files)}
            if guidance.blocked(names):
                continue
            targeted = [t for t in intervention.triggers if severity.get(t, 0.0) > 0]
            targeted += lenders_of(severity) if repair and lent.keys() & set(targeted) else []
            hypothesis = intervention.hypothesis + _skill_note(guidance.worked.get(intervention.name))
            score = sum(severity.get(t, 0.0) for t in intervention.triggers)
            options.append(((*guidance.rank(intervention.name, names), -float(repair), -score, index),
                            Proposal(intervention.name, hypothesis, targeted, intervention.success_criterion, diff)))
        options += self._skill_proposals(context, guidance, tried, severity)
        options.sort(key=lambda option: option[0])
        # a diagnostics change trains nothing (it is backtested on archived evidence), but its slot is charged like
        # any other (contracts.ledger): it takes one of the k slots, the last, so that every arm is charged the same
        chosen = [proposal for _, proposal in options[:k]]
        diagnostics = propose_diagnostics(context, tried)
        room = k - len(chosen)
        if diagnostics and room == 0 and k >= 2:
            chosen, room = chosen[:-1], 1
        return chosen + diagnostics[:room]

    @staticmethod
    def _skill_proposals(context: ProposalContext, guidance: Guidance, tried: set[str],
                         severity: dict[str, float]) -> list[tuple[tuple, Proposal]]:
        """Worked skills the catalogue does not know (an LLM's or a user's intervention): their recorded
        diff, when it still applies to this harness."""
        known = {i.name for i in CATALOGUE + REPAIRS}
        out = []
        for name, skill in sorted(guidance.worked.items()):
            diff = skill["diff"]
            if name in known or not diff.strip() or diff_hash(diff) in tried:
                continue
            names = {name, *(Path(f).stem for f in _diff_files(diff))}
            if guidance.blocked(names) or not validate(context.harness_dir, diff)["ok"]:
                continue
            expected = skill["expected_outcome"]
            targeted = [t for t in skill["trigger"]["signature"] if severity.get(t, 0.0) > 0]
            out.append(((*guidance.rank(name, names), 0.0, 0.0, -1),
                        Proposal(name, expected["hypothesis"] + _skill_note(skill), targeted,
                                 expected["success_criterion"], diff)))
        return out

    @staticmethod
    def _tried(context: ProposalContext) -> set[str]:
        return context.tried_diffs()
