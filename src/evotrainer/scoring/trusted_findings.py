"""Trusted findings: diagnostics computed by trusted code from evidence columns every run has, beside (never
instead of) the harness's own diagnostics.py. A harness's diagnostics are evolvable code and may be blind to
the flaw at hand (a flaw can live in diagnostics.py itself); these cannot be edited by a candidate. The diagnose
stage always adds them (layer ``trusted``) and they win over a harness finding of the same name.

Findings (the findings contract, ``contracts.findings``; thresholds: ``THRESHOLDS``, warn / critical):

- ``reward_false_positive_rate``: verifier-incorrect rows the harness reward pays as a success, over the
  incorrect rows (a reward the policy can game: partial credit, format credit, a lenient checker);
- ``reward_false_negative_rate``: verifier-correct rows the reward does not pay as a success, over the correct
  rows (a reward that rejects right answers, e.g. in a format the policy drifted to);
- ``reward_verifier_disagreement``: share of all rows in either set.

  The rule. Rewards follow verl's convention (1.0 pays a correct answer). ``R`` is the 90th percentile of the
  rewards of verifier-correct rows where that is positive, else 1.0; a row is *paid* when its reward is at least
  ``R / 2``. A false positive is an incorrect row that is paid, or that earns a positive reward above its
  GRPO group's median (the group advantage pushes it up); a false negative is a correct row that is not
  paid, or whose reward is below its group's median.
- ``truncation_rate``: rows cut at max_response_len without eos (an episode: ended without finishing).
- ``never_solved_prompts``: prompts (prompt_id) with no verifier-correct sample in this evidence; with earlier
  generations' evidence, ``never_solved_across_generations``: this evidence's prompts no generation so far
  solved.
- ``label_disagreement``: prompts whose samples agree on an answer the verifier rejects: at least
  ``MIN_SAMPLES`` samples, none correct, at least ``CONSENSUS`` of them share one final answer
  (``scoring.answers.lenient_answer``: the last \\boxed{} or <answer> tag, else the last number, else the
  last line, canonicalised), that answer is not the label's canonical form, and the policy gives it more
  often on this prompt than on all other prompts together (a degenerate policy answering the same everywhere
  is no evidence against a label). Only where the label is a short answer (``scoring.answers.lenient_label_ok``:
  not long, not a JSON object or list) and the rows are single responses, not episodes. The value: over the
  prompts with enough samples and a short-answer label.
- ``tool_call_parse_failure_rate`` (multi-turn evidence): model turns that were not a valid tool call
  (``invalid_actions``, else ``turns - tool_calls``), over all model turns; ``penalised_valid_turn_rate``
  (with the per-turn table beside the evidence): valid tool calls that the reward's turn-level credit
  (``turn_reward``) made negative, over the valid turns. Absent when the columns are.
- ``harness_diagnostics_failed``: 1.0 (warn) when the harness's own diagnostics failed on this evidence (a crash,
  a hang, or findings of a shape the sandbox's door refuses); its message names the label. The diagnosis then
  holds the trusted findings alone, and the run goes on.
- ``curriculum_starved_share`` (with the harness curriculum's weights over the train pool, computed through the
  door training uses with this evidence): 1 - the pool's effective share the curriculum samples from (Kish
  effective sample size / pool size; 0 for a uniform curriculum);
  ``curriculum_starved_levels``: where the pool and the evidence share a grouping column (a difficulty, level,
  data source: ``LEVEL_COLUMNS_MAX`` values at most), the share of the pool in levels the curriculum draws at
  less than ``STARVED_RATIO`` of their pool share while the evidence shows them still teaching (some samples
  correct, accuracy below ``SOLVED_ACCURACY``): prompts that still teach and are not trained on (a level no
  sample solves gives GRPO no signal, and a curriculum may rightly set it aside). The worst column counts.

- ``train_reward_without_accuracy`` (with the train logs of the parent and of the previous generation's
  backtests): the largest fall in verified training accuracy among the slots whose training reward rose (by at
  least ``REWARD_RISE`` of the first step's reward spread) while that accuracy collapsed (``scoring.training``:
  to at most half the first step's, beyond sampling noise); 0 where none did. The reward paid something other
  than correctness, and training found it: a flaw the starting policy's evidence may not show yet (it rarely
  emits what the reward overpays), which a slot trained on the reward does.

Every finding carries up to 3 example row positions (the stage resolves them into prompt, response, ground
truth, reward and correct).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.compute as pc
import pyarrow.parquet as pq

from evotrainer.contracts.evidence_stream import load_projection
from evotrainer.sandbox.harness_code import pool_kept_fraction
from evotrainer.scoring import training
from evotrainer.scoring.answers import (
    lenient_answer,
    lenient_canonical,
    lenient_label_ok,
)

LAYER = "trusted"
COLUMNS = ("prompt_id", "group_id", "sample_idx", "ground_truth", "reward", "correct", "truncated", "turns",
           "tool_calls", "invalid_actions")
FEATURE_COLUMNS = ("response",)
THRESHOLDS = {  # name -> (warn above, critical above)
    "reward_verifier_disagreement": (0.05, 0.2),
    "reward_false_positive_rate": (0.1, 0.3),
    "reward_false_negative_rate": (0.1, 0.3),
    "truncation_rate": (0.05, 0.25),
    "never_solved_prompts": (0.5, 0.8),
    "never_solved_across_generations": (0.3, 0.6),
    "label_disagreement": (0.05, 0.15),
    "tool_call_parse_failure_rate": (0.1, 0.3),
    "penalised_valid_turn_rate": (0.2, 0.5),
    "curriculum_starved_share": (0.5, 0.75),
    "curriculum_starved_levels": (0.2, 0.4),
    "train_reward_without_accuracy": (0.05, 0.15),
    "harness_diagnostics_failed": (0.5, 1.5),
}
REWARD_RISE = 0.5  # the training reward rose by at least this many of the first step's reward standard deviations
PAID_FRACTION = 0.5  # paid: reward >= PAID_FRACTION * R
EPS = 1e-6
MIN_SAMPLES, CONSENSUS = 3, 0.6
# curriculum levels: a grouping column has 2..LEVEL_COLUMNS_MAX values in the pool; a level is starved when its
# share of the draw is below STARVED_RATIO x its share of the pool, and still teaches when its evidence accuracy
# is above 0 and below SOLVED_ACCURACY (over at least MIN_SAMPLES rows)
LEVEL_COLUMNS_MAX, STARVED_RATIO, SOLVED_ACCURACY = 20, 0.25, 0.9
NOT_LEVELS = frozenset({"prompt_id", "prompt", "ground_truth", "metadata", "task_fields", "response", "group_id"})


def finding(name: str, value, affected_rows: int = 0, message: str = "", examples: Iterable[int] = ()) -> dict:
    """A finding of the contract, its threshold and severity from ``THRESHOLDS`` (bad when above)."""
    value = None if value is None or not np.isfinite(value) else float(value)
    threshold, critical = THRESHOLDS[name]
    severity = ("info" if value is None else "critical" if value > critical else "warn" if value > threshold
                else "ok")
    return {"name": name, "layer": LAYER, "value": value, "threshold": threshold, "direction": "above",
            "severity": severity, "affected_rows": int(affected_rows), "message": message,
            "examples": [int(i) for i in list(examples)[:3]]}


def spread(mask) -> np.ndarray:
    """Up to 3 example rows, spread over the matches."""
    rows = np.flatnonzero(np.asarray(mask, dtype=bool))
    return np.unique(rows[np.linspace(0, len(rows) - 1, 3).astype(int)]) if len(rows) else rows


def row_features(batch: pd.DataFrame) -> dict:
    """Per record batch: the hash of each response's lenient final answer (0: none), so no text is kept."""
    answers = np.fromiter((lenient_answer(r) for r in batch["response"]), dtype=object, count=len(batch))
    keys = pd.util.hash_array(answers).astype(np.uint64)
    return {"answer_key": np.where(answers == "", np.uint64(0), keys)}


def _codes(column: pd.Series) -> np.ndarray:
    return pd.factorize(column)[0]


def disagreement(ev: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(false positives, false negatives) of the harness reward against the verifier, per row (the rule above;
    columns reward, correct, group_id)."""
    reward = ev["reward"].to_numpy(dtype=float)
    correct = ev["correct"].to_numpy(dtype=bool)
    paid_at = np.quantile(reward[correct], 0.9) if correct.any() else 0.0
    paid = reward >= PAID_FRACTION * (paid_at if paid_at > 0 else 1.0)
    median = pd.Series(reward).groupby(_codes(ev["group_id"])).transform("median").to_numpy()
    return ~correct & (paid | ((reward > 0) & (reward > median + EPS))), correct & (~paid | (reward < median - EPS))


def reward_findings(ev: pd.DataFrame) -> list[dict]:
    correct = ev["correct"].to_numpy(dtype=bool)
    false_pos, false_neg = disagreement(ev)
    either = false_pos | false_neg
    n_wrong, n_right = int((~correct).sum()), int(correct.sum())
    return [
        finding("reward_verifier_disagreement", either.mean() if len(ev) else None, either.sum(),
                f"rows where the harness reward and the verifier disagree: {int(false_pos.sum())} incorrect rows "
                f"paid, {int(false_neg.sum())} correct rows not paid", spread(either)),
        finding("reward_false_positive_rate", false_pos.sum() / n_wrong if n_wrong else None, false_pos.sum(),
                "share of verifier-incorrect responses the reward pays as a success (>= half the reward of a correct "
                "one) or above their group's median: a reward the policy can game", spread(false_pos)),
        finding("reward_false_negative_rate", false_neg.sum() / n_right if n_right else None, false_neg.sum(),
                "share of verifier-correct responses the reward does not pay as a success (< half the reward of a "
                "correct one) or pays below their group's median: a reward that rejects right answers",
                spread(false_neg)),
    ]


def prompt_findings(ev: pd.DataFrame, earlier_solved: set[str] | None, earlier_generations: int) -> list[dict]:
    codes = _codes(ev["prompt_id"])
    n_prompts = int(codes.max()) + 1 if len(codes) else 0
    correct = ev["correct"].to_numpy(dtype=bool)
    samples = np.bincount(codes, minlength=n_prompts)
    solved = np.bincount(codes, weights=correct, minlength=n_prompts) > 0
    unsolved_rows = ~solved[codes]
    out = [finding("never_solved_prompts", (~solved).mean() if n_prompts else None, unsolved_rows.sum(),
                   f"share of the {n_prompts} prompts with no verifier-correct sample in this evidence",
                   spread(unsolved_rows))]
    if earlier_solved is not None and earlier_generations > 0:
        ids = pd.Series(ev["prompt_id"].astype(object).to_numpy()).groupby(codes).first()
        never = ~solved & ~ids.isin(earlier_solved).to_numpy()
        out.append(finding(
            "never_solved_across_generations", never.mean() if n_prompts else None, never[codes].sum(),
            f"share of this evidence's prompts that no generation solved (this one and {earlier_generations} "
            "earlier)", spread(never[codes])))
    if "answer_key" in ev and "ground_truth" in ev and "turns" not in ev:
        out.append(_label_finding(ev, codes, n_prompts, samples, solved))
    return out


def _label_finding(ev: pd.DataFrame, codes: np.ndarray, n_prompts: int, samples: np.ndarray,
                   solved: np.ndarray) -> dict:
    truth = ev["ground_truth"].astype("category")
    canon = pd.Series([lenient_canonical(t) for t in truth.cat.categories], dtype=object)
    # a sentinel last entry: a null label (code -1) is never a short answer
    short = np.array([lenient_label_ok(t) for t in truth.cat.categories] + [False], dtype=bool)
    truth_key = np.append(pd.util.hash_array(canon.to_numpy(dtype=object)).astype(np.uint64), np.uint64(0))
    row_truth = truth.cat.codes.to_numpy()
    prompt_truth = np.zeros(n_prompts, dtype=np.int64)
    prompt_truth[codes] = row_truth
    answer = ev["answer_key"].to_numpy(dtype=np.uint64)
    given = answer != 0
    pairs = pd.DataFrame({"p": codes[given], "a": answer[given]})
    top = pairs.value_counts().reset_index(name="n").drop_duplicates("p").set_index("p")
    everywhere = pairs["a"].value_counts()
    top_answer = np.zeros(n_prompts, dtype=np.uint64)
    top_count = np.zeros(n_prompts, dtype=np.int64)
    top_answer[top.index.to_numpy()] = top["a"].to_numpy(dtype=np.uint64)
    top_count[top.index.to_numpy()] = top["n"].to_numpy()
    elsewhere = everywhere.reindex(top_answer).fillna(0).to_numpy() - top_count
    eligible = (samples >= MIN_SAMPLES) & short[prompt_truth]
    flagged = (eligible & ~solved & (top_count >= CONSENSUS * samples) & (top_count > 0)
               & (top_answer != truth_key[prompt_truth]) & (elsewhere < top_count))
    rows = flagged[codes]
    consensus_rows = rows & (answer == top_answer[codes])
    examples = [int(np.flatnonzero(consensus_rows & (codes == p))[0]) for p in np.flatnonzero(flagged)[:3]]
    return finding(
        "label_disagreement", flagged.sum() / eligible.sum() if eligible.any() else None, rows.sum(),
        f"prompts whose >= {MIN_SAMPLES} samples mostly (>= {CONSENSUS:.0%}) agree on one final answer that the "
        f"verifier rejects (none correct): the label may be wrong; {int(flagged.sum())} of {int(eligible.sum())} "
        "prompts with a short-answer label", examples)


def multi_turn_findings(ev: pd.DataFrame, turns_table: pd.DataFrame | None) -> list[dict]:
    if "turns" not in ev:
        return []
    turns = ev["turns"].to_numpy(dtype=float)
    if "invalid_actions" in ev:
        invalid = ev["invalid_actions"].to_numpy(dtype=float)
    elif "tool_calls" in ev:
        invalid = np.clip(turns - ev["tool_calls"].to_numpy(dtype=float), 0, None)
    else:
        return []
    out = [finding("tool_call_parse_failure_rate", invalid.sum() / turns.sum() if turns.sum() > 0 else None,
                   (invalid > 0).sum(), "share of model turns whose action did not parse as a valid tool call",
                   spread(invalid > 0))]
    if turns_table is not None and {"valid", "turn_reward", "group_id", "sample_idx"} <= set(turns_table):
        valid = turns_table["valid"].to_numpy(dtype=bool)
        hit = valid & (turns_table["turn_reward"].to_numpy(dtype=float) < 0)
        keys = set(zip(turns_table["group_id"].astype(str)[hit], turns_table["sample_idx"].astype(int)[hit],
                       strict=True))
        episode = np.fromiter(((g, int(s)) in keys for g, s in zip(ev["group_id"].astype(str), ev["sample_idx"],
                                                                     strict=True)), dtype=bool, count=len(ev))
        out.append(finding("penalised_valid_turn_rate", hit.sum() / valid.sum() if valid.any() else None,
                           episode.sum(), "share of valid tool calls whose turn-level reward credit is negative: a "
                           "reward that rejects valid calls", spread(episode)))
    return out


def curriculum_findings(pool: pd.DataFrame, weights: np.ndarray, ev: pd.DataFrame | None) -> list[dict]:
    """The curriculum's findings from its weights over the train pool (one per pool row, as training samples
    them) and the evidence it was given (None: only the starved share)."""
    weights = np.asarray(weights, dtype=float)
    kept = pool_kept_fraction(weights)
    out = [finding("curriculum_starved_share", 1.0 - kept, 0,
                   f"the curriculum samples from an effective {kept:.1%} of the {len(pool)} training prompts "
                   "(Kish effective sample size of its weights); the rest is starved")]
    if ev is None or not len(ev) or "correct" not in ev:
        return out
    worst = None
    for column in level_columns(pool, ev):
        result = starved_levels(pool[column], weights, ev[column], ev["correct"].to_numpy(dtype=bool))
        if result is not None and (worst is None or result[0] > worst[0]):
            worst = (*result, column)
    if worst is not None:
        value, rows, detail, column = worst
        out.append(finding("curriculum_starved_levels", value, rows.sum(),
                           f"share of the training pool in levels of `{column}` the curriculum draws at less than "
                           f"{STARVED_RATIO:.0%} of their pool share while the evidence shows them still teaching "
                           f"(0 < accuracy < {SOLVED_ACCURACY:.0%}): {detail}", spread(rows)))
    return out


def level_columns(pool: pd.DataFrame, ev: pd.DataFrame) -> list[str]:
    """The grouping columns the pool and the evidence share: 2..LEVEL_COLUMNS_MAX values in the pool."""
    out = []
    for column in pool.columns:
        if column in NOT_LEVELS or column not in ev or pool[column].dtype.kind == "f":
            continue
        try:
            values = pool[column].nunique(dropna=True)
        except TypeError:  # unhashable cells (lists, dicts)
            continue
        if 2 <= values <= LEVEL_COLUMNS_MAX:
            out.append(column)
    return out


def starved_levels(pool_level: pd.Series, weights: np.ndarray, ev_level: pd.Series,
                   correct: np.ndarray) -> tuple[float, np.ndarray, str] | None:
    """(pool share in starved levels that still teach, the evidence rows on them, a per-level summary)."""
    pool_key, ev_key = pool_level.astype(str), ev_level.astype(str)
    share = pool_key.value_counts(normalize=True)
    draw = pd.Series(weights, index=pool_key.index).groupby(pool_key).sum() / weights.sum()
    accuracy = pd.Series(correct, index=ev_key.index).groupby(ev_key).agg(["mean", "size"])
    starved = [lv for lv in share.index
               if draw.get(lv, 0.0) < STARVED_RATIO * share[lv] and lv in accuracy.index
               and accuracy.loc[lv, "size"] >= MIN_SAMPLES and 0 < accuracy.loc[lv, "mean"] < SOLVED_ACCURACY]
    if not len(accuracy.index.intersection(share.index)):
        return None
    detail = "; ".join(f"{lv}: draw {draw.get(lv, 0.0):.1%} / pool {share[lv]:.1%}"
                       + (f", evidence accuracy {accuracy.loc[lv, 'mean']:.2f}" if lv in accuracy.index else "")
                       for lv in sorted(share.index, key=lambda v: (len(v), v))[:LEVEL_COLUMNS_MAX])
    return float(share[starved].sum()), ev_key.isin(starved).to_numpy(), detail


def diagnose_frame(ev: pd.DataFrame, earlier_solved: set[str] | None = None, earlier_generations: int = 0,
                   turns_table: pd.DataFrame | None = None) -> list[dict]:
    """The trusted findings of an evidence frame (the projection of ``COLUMNS`` plus ``answer_key``; a frame
    with the ``response`` text instead gets its answer keys here). Missing optional columns skip findings."""
    ev = ev.reset_index(drop=True)
    if "answer_key" not in ev and "response" in ev:
        ev = ev.assign(**row_features(ev))
    out = reward_findings(ev) if {"reward", "correct", "group_id"} <= set(ev) else []
    if "truncated" in ev:
        cut = ev["truncated"].to_numpy(dtype=bool)
        out.append(finding("truncation_rate", cut.mean() if len(ev) else None, cut.sum(),
                           "responses cut at max_response_len without eos (episodes: ended without finishing)",
                           spread(cut)))
    if {"prompt_id", "correct"} <= set(ev):
        out += prompt_findings(ev, earlier_solved, earlier_generations)
    return out + multi_turn_findings(ev, turns_table)


def training_findings(logs: Mapping[str, pd.DataFrame]) -> list[dict]:
    """``train_reward_without_accuracy`` over train logs (label -> log); none without a log."""
    if not logs:
        return []
    worst, detail = 0.0, "no slot's training reward rose while its verified accuracy collapsed"
    for label, log in logs.items():
        seen = training.trend(log)
        if seen is None or "start_reward" not in seen or not training.collapsed(seen):
            continue
        spread = seen["start_reward_std"]
        spread = spread if np.isfinite(spread) and spread > EPS else max(abs(seen["start_reward"]), 1.0)
        rise = seen["end_reward"] - seen["start_reward"]
        fall = seen["start_accuracy"] - seen["end_accuracy"]
        if rise >= REWARD_RISE * spread and fall > worst:
            worst = fall
            detail = (f"{label}: training reward {seen['start_reward']:.3f} -> {seen['end_reward']:.3f} while verified "
                      f"accuracy fell {seen['start_accuracy']:.3f} -> {seen['end_accuracy']:.3f} (first step -> last "
                      f"10% of {seen['steps']} steps" + (f", z = {seen['z']:.1f}" if seen["z"] is not None else "")
                      + "): the reward pays something the verifier does not")
    return [finding("train_reward_without_accuracy", worst, 0, detail)]


def solved_prompts(paths: Iterable[str | Path]) -> tuple[set[str], int]:
    """The prompt ids with a verifier-correct row in any of the evidence files that exist, and how many did."""
    solved: set[str] = set()
    read = 0
    for path in paths:
        if not Path(path).is_file():
            continue
        for batch in pq.ParquetFile(path).iter_batches(columns=["prompt_id", "correct"]):
            solved.update(pc.unique(pc.filter(batch.column("prompt_id"), batch.column("correct"))).to_pylist())
        read += 1
    return solved, read


def diagnose_file(rollouts: str | Path, earlier: Iterable[str | Path] = (), turns: str | Path | None = None) -> list[dict]:
    """The trusted findings of an evidence file, streamed (only ``COLUMNS`` and the answer keys are held);
    ``earlier``: earlier generations' evidence files; ``turns``: the per-turn table beside it, if any."""
    ev = load_projection(rollouts, COLUMNS, row_features, FEATURE_COLUMNS)
    solved, generations = solved_prompts(earlier)
    table = None
    if turns is not None and Path(turns).is_file():
        table = pq.read_table(turns, columns=["group_id", "sample_idx", "valid", "turn_reward"]).to_pandas()
    return diagnose_frame(ev, solved, generations, table)


def merge(trusted: pd.DataFrame, harness: pd.DataFrame) -> pd.DataFrame:
    """The diagnosis: the trusted findings, then the harness's findings but those of the same name (a trusted
    finding wins); a harness finding claiming the trusted layer is relabelled ``harness``."""
    harness = harness[~harness["name"].isin(set(trusted["name"]))].copy()
    harness.loc[harness["layer"] == LAYER, "layer"] = "harness"
    return pd.concat([trusted, harness], ignore_index=True)
