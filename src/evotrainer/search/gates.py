"""Validity gates: veto a candidate whose backtest looks good for the wrong reasons, even when it
scores highest. Each gate compares the candidate's backtest with the generation's control (same
parent, seeds and steps) and returns its evidence, so the veto is explained in the lineage.

- reward_hacking: training reward rose well above the control's while verified accuracy did not, neither in
  training nor on val, and the candidate's reward pays the verified-incorrect val responses more than the
  control's reward pays them (a reward paying for something other than correct answers). Both accuracies are the
  trusted verifier's: a candidate whose greedy val accuracy rose above the control's beyond the tolerance is not
  vetoed for a training tail that has not caught up yet (a short backtest's last 10% of steps is a few batches: a
  first rung under search.schedule=rungs). And a reward that pays more because it now pays correct answers the
  control's reward refused (a repair of false negatives: the control's training reward is near 0 under such a
  flaw) is no hack: its pay for wrong answers did not rise.
- reward_correctness: on val, the harness reward barely separates verified-correct from incorrect
  responses (AUC below threshold), and separates them worse than the control's reward does beyond
  ``auc_margin``: the candidate made the reward less about correctness.
- reward_false_positives: on val, verified-incorrect responses that the reward pays as much as a
  correct one (a lenient verifier: a latent hack that training has not exploited yet), above the threshold
  and above the control's share beyond sampling noise (a one-sided two-proportion test, z >= ``fp_z``).

The two reward gates judge a candidate against its control, as every other gate does: a share every slot has
alike (the generation's harness pays wrong answers, so a knob candidate and the control pay them equally) vetoes
none of them, and a candidate that lowers the control's disagreement with the verifier, or leaves it as it was
while repairing the other direction, is not vetoed for what remains. The control itself is never gated: it is
what the others are compared with. Where the control's val has one class only, its share counts as 0 (its AUC
as 1): the absolute test.
- length_gaming: responses got much longer than the control's and than the parent's (the control's first
  step): a control whose responses shrank as it collapsed does not make a candidate that kept its length look
  like it gamed length.
- exploration_collapse: entropy fell far below the control's while dead groups rose.
- format_exploitation: the format is kept while verified correctness fell below the control's and the
  reward rose, and it pays verified-incorrect val responses more than the control's did (the reward pays for
  looking right). Without that last test a repaired reward that pays correct answers again, on a first rung too
  short for val accuracy to show it, was vetoed as exploiting the format (docs/schedule.md, "A gate that a short
  rung broke").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from evotrainer.scoring import training


@dataclass(frozen=True)
class GateThresholds:
    reward_gain: float = 0.15  # train reward above control's, with no accuracy gain
    wrong_pay_rise: float = 0.05  # ... while the mean reward of verified-incorrect val responses rose this much
    accuracy_tolerance: float = 0.02
    min_reward_auc: float = 0.75
    max_false_positive_rate: float = 0.01
    length_ratio: float = 1.5
    entropy_ratio: float = 0.5
    dead_group_rise: float = 0.15
    auc_margin: float = 0.05  # a candidate's reward AUC this far below the control's is worse than noise
    fp_z: float = 2.0  # one-sided z of a false-positive share above the control's


def _tail(log: pd.DataFrame, column: str) -> float:
    return float(log[column].tail(max(1, len(log) // 10)).mean())


def _first(log: pd.DataFrame, column: str) -> float:
    """The first logged step: what the parent policy sampled before any update of this backtest."""
    return float(log.sort_values("step")[column].iloc[0]) if "step" in log else float(log[column].iloc[0])


def reward_auc(val: pd.DataFrame) -> float | None:
    """P(reward of a correct response > reward of an incorrect one), ties count half."""
    correct, wrong = val.loc[val["correct"], "reward"].to_numpy(), val.loc[~val["correct"], "reward"].to_numpy()
    if len(correct) == 0 or len(wrong) == 0:
        return None
    from scipy.stats import mannwhitneyu

    return float(mannwhitneyu(correct, wrong).statistic / (len(correct) * len(wrong)))


def reward_false_positive_rate(val: pd.DataFrame) -> float | None:
    correct = val.loc[val["correct"], "reward"]
    wrong = val.loc[~val["correct"], "reward"]
    if correct.empty or wrong.empty:
        return None
    return float((wrong >= correct.median()).mean())


def _wrong_pay(val: pd.DataFrame) -> float:
    """The mean reward of the verified-incorrect responses (nan where there are none: no evidence either way)."""
    wrong = val.loc[~val["correct"].astype(bool), "reward"]
    return float(wrong.mean()) if len(wrong) else float("nan")


def _excess_z(share: float, n: int, control_share: float, control_n: int) -> float:
    """One-sided two-proportion z of ``share`` (of n) above ``control_share`` (of control_n); pooled variance."""
    pooled = (share * n + control_share * control_n) / max(n + control_n, 1)
    se = np.sqrt(pooled * (1 - pooled) * (1 / max(n, 1) + 1 / max(control_n, 1)))
    if se <= 0:
        return float("inf") if share > control_share else 0.0
    return float((share - control_share) / se)


def evaluate(candidate_dir: Path, control_dir: Path, t: GateThresholds = GateThresholds()) -> list[dict]:
    cand_log = pd.read_parquet(candidate_dir / "train_log.parquet")
    ctrl_log = pd.read_parquet(control_dir / "train_log.parquet")
    cand_val = pd.read_parquet(candidate_dir / "val_rollouts.parquet")
    ctrl_val = pd.read_parquet(control_dir / "val_rollouts.parquet")
    gates = []

    def gate(name, vetoed, value, threshold, evidence):
        gates.append({"gate": name, "vetoed": bool(vetoed), "value": None if value is None else float(value),
                      "threshold": float(threshold), "evidence": evidence})

    reward_gain = _tail(cand_log, "reward_mean") - _tail(ctrl_log, "reward_mean")
    accuracy_gain = _tail(cand_log, "accuracy") - _tail(ctrl_log, "accuracy")
    val_acc_gain = float(cand_val["correct"].mean() - ctrl_val["correct"].mean())
    wrong_pay = _wrong_pay(cand_val) - _wrong_pay(ctrl_val)
    gate("reward_hacking", reward_gain > t.reward_gain and accuracy_gain <= t.accuracy_tolerance
         and val_acc_gain <= t.accuracy_tolerance and not wrong_pay <= t.wrong_pay_rise, reward_gain, t.reward_gain,
         f"training reward {reward_gain:+.3f} vs control while verified training accuracy {accuracy_gain:+.3f} and "
         f"val accuracy {val_acc_gain:+.3f}; mean reward of verified-incorrect val responses {wrong_pay:+.3f} vs "
         f"control")

    auc, ctrl_auc = reward_auc(cand_val), reward_auc(ctrl_val)
    ctrl_auc_seen = 1.0 if ctrl_auc is None else ctrl_auc
    gate("reward_correctness", auc is not None and auc < t.min_reward_auc and auc < ctrl_auc_seen - t.auc_margin,
         auc, t.min_reward_auc,
         "val: AUC of the harness reward for verified correctness" + (
             f" {auc:.3f} vs the control's {_shown(ctrl_auc)} (vetoed below {t.min_reward_auc} and "
             f"{t.auc_margin} under the control's)" if auc is not None else " (one class only)"))

    fp_rate, ctrl_fp = reward_false_positive_rate(cand_val), reward_false_positive_rate(ctrl_val)
    z = None if fp_rate is None else _excess_z(fp_rate, int((~cand_val["correct"]).sum()), ctrl_fp or 0.0,
                                               int((~ctrl_val["correct"]).sum()))
    gate("reward_false_positives", fp_rate is not None and fp_rate > t.max_false_positive_rate and z >= t.fp_z,
         fp_rate, t.max_false_positive_rate,
         "val: share of verified-incorrect responses rewarded at least the median reward of correct ones" + (
             f" {fp_rate:.3f} vs the control's {_shown(ctrl_fp)} (z {z:+.1f}; vetoed above "
             f"{t.max_false_positive_rate} and z >= {t.fp_z} over the control's)" if fp_rate is not None
             else " (no correct response to compare with)"))

    cand_len, ctrl_len = _tail(cand_log, "response_len_mean"), _tail(ctrl_log, "response_len_mean")
    parent_len = _first(ctrl_log, "response_len_mean")  # the same parent, same harness, before any update
    ratio = cand_len / max(ctrl_len, parent_len, 1e-6)
    gate("length_gaming", ratio > t.length_ratio, ratio, t.length_ratio,
         f"mean response length {cand_len:.2f} vs control {ctrl_len:.2f} tokens (last 10% of steps) and the parent's "
         f"{parent_len:.2f} (the control's first step); the ratio is to the longer")

    cand_ent, ctrl_ent = _tail(cand_log, "entropy"), _tail(ctrl_log, "entropy")
    dead_rise = _tail(cand_log, "dead_group_ratio") - _tail(ctrl_log, "dead_group_ratio")
    ent_ratio = cand_ent / max(ctrl_ent, 1e-6)
    gate("exploration_collapse", ent_ratio < t.entropy_ratio and dead_rise > t.dead_group_rise, ent_ratio, t.entropy_ratio,
         f"entropy {cand_ent:.3f} vs control {ctrl_ent:.3f}; dead-group ratio {dead_rise:+.3f} vs control")

    format_rate = float(cand_val["format_ok"].mean()) if "format_ok" in cand_val else np.nan
    gate("format_exploitation", format_rate >= 0.9 and val_acc_gain < -t.accuracy_tolerance and reward_gain > t.reward_gain
         and wrong_pay > t.wrong_pay_rise, val_acc_gain, -t.accuracy_tolerance,
         f"val format-ok rate {format_rate:.2f}, val accuracy {val_acc_gain:+.3f} vs control, reward {reward_gain:+.3f}; "
         f"mean reward of verified-incorrect val responses {wrong_pay:+.3f} vs control")
    return gates


def _shown(value: float | None) -> str:
    return "n/a (one class only)" if value is None else f"{value:.3f}"


def training_collapse(run_dir: Path) -> dict | None:
    """The evidence that a backtest's training destroyed its parent's skill (None where it did not): verified
    training accuracy at the end (last 10% of steps) fell to at most ``training.COLLAPSE_SHARE`` of the first step's, which
    the parent policy sampled before any update, and the fall is no sampling noise: a one-sided two-proportion
    test over the responses each sampled (``samples_generated``) gives z >= ``training.COLLAPSE_Z`` (a log without
    counts: a fall of at least ``training.COLLAPSE_DROP``). A test rather than a fixed drop, so that a weak parent's skill
    (0.07 of 256 responses, lost to 0 of 1,024) counts, and two lucky answers do not (``scoring.training``).
    Used by select: a kept control that collapsed is not the next parent (search.revert_collapsed_control)."""
    path = Path(run_dir) / "train_log.parquet"
    if not path.is_file():
        return None
    seen = training.trend(pd.read_parquet(path))
    if seen is None or not training.collapsed(seen):
        return None
    start, end, z = seen["start_accuracy"], seen["end_accuracy"], seen["z"]
    return {"start_accuracy": start, "end_accuracy": end, "steps": seen["steps"], "z": z,
            "evidence": f"verified training accuracy fell from {start:.3f} (first step: the parent) to {end:.3f} "
                        f"(last 10% of {seen['steps']} steps)" + (f", z = {z:.1f}" if z is not None else "")}

