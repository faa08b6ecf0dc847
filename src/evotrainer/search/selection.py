"""The selection decision (``search.selection``; docs/schedule.md, "How select decides"): given a generation's
slots judged against its control, which one is promoted, every slot's verdict, and why.

``stages/select.py`` reads the backtests, runs the gates and computes each valid candidate's paired gain interval
(``gain_interval``) at :func:`interval_confidence`; this module decides from those facts alone, so the decision
can be run without a run on disk (``benchmarks/select_power.py`` feeds it simulated gains).

The rules:

- ``greedy``: the best candidate whose val gain is above ``search.min_gain``; no interval needed.
- ``bootstrap`` (the default): the best candidate whose paired bootstrap interval at ``search.confidence`` has
  its lower end above ``min_gain``. Each candidate is tested alone: with k candidates that are not better, the
  chance that one of them is promoted grows with k (about 8% a generation at k = 3 and 95%,
  docs/measured/select-power-today.json).
- ``corrected``: ``bootstrap`` with a Bonferroni correction over the candidates compared: each interval's
  one-sided miss rate is the generation's (``(1 - confidence) / 2``) divided by their number, so the chance of
  promoting any candidate that is not better stays at or below ``(1 - confidence) / 2`` per generation,
  whatever k (2.5% at 95%). It pays for that bound in power (benchmarks/select_power.py measures both).
- ``two_look`` (rungs only): the screen (:func:`finalist`) names the best candidate not behind the control
  beyond noise on its first rung; select then has the finalist's and the control's first-rung policies answer
  ``search.confirm_prompts`` fresh val prompts, and the finalist is promoted only where that paired gain's
  interval at ``search.confirm_confidence`` is above ``min_gain`` (:func:`confirmed`). One test on prompts the
  screen never saw: promoting a candidate that is not better stays at or below ``(1 - confirm_confidence) / 2``
  a generation (5% at 0.90), and the confirmation's larger prompt set is what buys the power.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from evotrainer.contracts.candidate import CONTROL

RULES = ("bootstrap", "greedy", "corrected", "two_look")
NOT_CONFIRMED = "not_confirmed"  # two_look: the finalist whose gain the fresh prompts did not confirm
__all__ = ["RULES", "Decision", "Slot", "Verdict", "confirmed", "decide", "earned_look", "finalist",
           "interval_confidence", "survivors"]


@dataclass(frozen=True)
class Slot:
    """One backtested slot as select sees it: ``status`` from its metrics.json (``ok``, ``failed``,
    ``registered`` for a diagnostics change that passed its backtest), its val accuracy, the gates that vetoed it
    and its gain interval against the control (``gain_interval``'s dict; None for the control and invalid slots)."""

    candidate_id: str
    status: str
    val_accuracy: float | None = None
    failure_label: str | None = None
    vetoes: tuple[Mapping, ...] = ()
    interval: Mapping | None = None


@dataclass(frozen=True)
class Verdict:
    verdict: str  # kept | promoted | rejected | vetoed | failed | registered
    failure_label: str | None = None


@dataclass(frozen=True)
class Decision:
    promoted: str
    gain: float | None  # the promoted candidate's val gain over the control; None where the control is kept
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    eligible: tuple[str, ...] = ()
    confidence: float = 0.95  # the confidence each candidate's interval was judged at
    rule: str = "bootstrap"
    min_gain: float = 0.0

    def reason(self) -> str:
        """The selection's one-line reason (without what the next generation starts from)."""
        if self.promoted == CONTROL and self.rule == "two_look":
            return "no finalist not behind the control on its first rung was confirmed on the fresh prompts"
        if self.promoted == CONTROL:
            return ("no candidate beat control by more than min_gain"
                    + ("" if self.rule == "greedy" else " with its interval"))
        return f"{self.promoted} beat control by {self.gain:+.3f} (> min_gain {self.min_gain}"


def interval_confidence(rule: str, confidence: float, compared: int) -> float:
    """The two-sided confidence at which each of ``compared`` candidates' gain intervals is computed: the
    configured one, or under ``corrected`` the Bonferroni level that keeps the generation's one-sided miss rate at
    ``(1 - confidence) / 2`` over all of them."""
    if rule not in RULES:
        raise ValueError(f"search.selection={rule!r}: choose one of {RULES}")
    if rule != "corrected" or compared <= 1:
        return float(confidence)
    return 1.0 - (1.0 - float(confidence)) / int(compared)


def decide(slots: Sequence[Slot], *, rule: str = "bootstrap", min_gain: float = 0.0,
           confidence: float = 0.95, confirmation: Mapping | None = None, earned: Sequence[str] = ()) -> Decision:
    """The generation's decision. ``slots``: every slot in the order select lists them (sorted candidate ids),
    the control among them; ties in val accuracy go to the earlier slot. The control must have trained (select
    refuses a generation whose control failed before it gets here). ``two_look``: ``confirmation`` is the
    finalist's gain interval on the fresh prompts (None where the screen named no finalist); ``earned``: the
    candidates that earned a look on evidence, which the screen names first (``finalist``)."""
    if rule not in RULES:
        raise ValueError(f"search.selection={rule!r}: choose one of {RULES}")
    if rule == "two_look":
        return _decide_two_look(slots, min_gain=min_gain, confidence=confidence, confirmation=confirmation,
                                earned=earned)
    by_id = {slot.candidate_id: slot for slot in slots}
    control = by_id.get(CONTROL)
    if control is None or control.status != "ok" or control.val_accuracy is None:
        raise ValueError("the control did not train: nothing can be compared")
    order = [slot.candidate_id for slot in slots]
    valid = [slot for slot in slots
             if slot.status == "ok" and slot.candidate_id != CONTROL and not slot.vetoes and slot.val_accuracy is not None]
    if rule == "greedy":
        eligible = [s for s in valid if s.val_accuracy - control.val_accuracy > min_gain]
    else:
        missing = [s.candidate_id for s in valid if s.interval is None]
        if missing:
            raise ValueError(f"search.selection={rule}: no gain interval for {missing}")
        eligible = [s for s in valid if float(s.interval["ci_low"]) > min_gain]
    best = max(eligible, key=lambda s: (s.val_accuracy, -order.index(s.candidate_id)), default=None)
    promoted = best.candidate_id if best is not None else CONTROL
    return Decision(promoted=promoted, gain=None if best is None else best.val_accuracy - control.val_accuracy,
                    verdicts=_verdicts(slots, promoted), eligible=tuple(s.candidate_id for s in eligible),
                    confidence=confidence, rule=rule, min_gain=min_gain)


def _verdicts(slots: Sequence[Slot], promoted: str, unconfirmed: str | None = None) -> dict[str, Verdict]:
    verdicts = {}
    for slot in slots:
        if slot.status == "registered":
            verdicts[slot.candidate_id] = Verdict("registered")
        elif slot.status != "ok":
            verdicts[slot.candidate_id] = Verdict("failed", slot.failure_label)
        elif slot.vetoes:
            verdicts[slot.candidate_id] = Verdict("vetoed", f"vetoed:{slot.vetoes[0]['gate']}")
        elif slot.candidate_id == promoted:
            verdicts[slot.candidate_id] = Verdict("kept" if promoted == CONTROL else "promoted")
        elif slot.candidate_id == unconfirmed:
            verdicts[slot.candidate_id] = Verdict("rejected", NOT_CONFIRMED)
        else:
            verdicts[slot.candidate_id] = Verdict("rejected", None if slot.candidate_id == CONTROL else "no_gain")
    return verdicts


def _decide_two_look(slots: Sequence[Slot], *, min_gain: float, confidence: float,
                     confirmation: Mapping | None, earned: Sequence[str]) -> Decision:
    chosen = finalist(slots, min_gain=min_gain, earned=earned)
    if (chosen is None) != (confirmation is None):
        raise ValueError(f"search.selection=two_look: the screen's finalist is {chosen!r} but the confirmation is "
                         f"{'missing' if confirmation is None else 'there'}")
    control = next(s.val_accuracy for s in slots if s.candidate_id == CONTROL)
    ok = chosen is not None and confirmed(confirmation, min_gain=min_gain)
    promoted = chosen if ok else CONTROL
    gain = next(s.val_accuracy for s in slots if s.candidate_id == chosen) - control if ok else None
    return Decision(promoted=promoted, gain=gain, verdicts=_verdicts(slots, promoted, None if ok else chosen),
                    eligible=(chosen,) if ok else (), confidence=confidence, rule="two_look", min_gain=min_gain)


def _not_behind(slots: Sequence[Slot], min_gain: float) -> list[Slot]:
    """The valid candidates not behind the control beyond noise (their gain interval's upper end above
    ``min_gain``)."""
    return [s for s in slots if s.status == "ok" and s.candidate_id != CONTROL and not s.vetoes
            and s.val_accuracy is not None and s.interval is not None and float(s.interval["ci_high"]) > min_gain]


def finalist(slots: Sequence[Slot], *, min_gain: float = 0.0, earned: Sequence[str] = ()) -> str | None:
    """The two-look design's screen (``search.selection=two_look``): among the valid candidates not behind the
    control beyond noise, those that ``earned`` a look on evidence (``earned_look``) first, then the best val
    accuracy (ties to the earlier slot); None where every candidate is behind. The same order as the second rung's
    cut (``survivors``). Which candidate the screen names cannot raise the false promotions: the confirmation
    tests one finalist on prompts the screen never saw."""
    order = [s.candidate_id for s in slots]
    alive = _not_behind(slots, min_gain)
    proven = [s for s in alive if s.candidate_id in set(earned)]
    best = max(proven or alive, key=lambda s: (s.val_accuracy, -order.index(s.candidate_id)), default=None)
    return None if best is None else best.candidate_id


def survivors(slots: Sequence[Slot], *, min_gain: float = 0.0, keep: int = 0,
              earned: Sequence[str] = ()) -> tuple[str, ...]:
    """Who trains a second rung (``search.second_rung``), in the slots' order: the control, every valid candidate
    that ``earned`` its look on evidence (``earned_look``) whatever its first rung showed, and every valid
    candidate not behind the control beyond noise on its first rung; the control alone where none is left.
    ``keep`` m > 0 (``search.second_rung_keep``) cuts them to m slots, as successive halving keeps the best of a
    rung: the control (the comparator) always, then the earned candidates, then the others by first-rung val
    accuracy, the better first; ties go to the earlier slot."""
    order = [s.candidate_id for s in slots]
    by_id = {s.candidate_id: s for s in slots}
    valid = {s.candidate_id for s in slots if s.status == "ok" and not s.vetoes and s.val_accuracy is not None}
    proven = [cid for cid in order if cid in set(earned) and cid in valid and cid != CONTROL]
    alive = [s.candidate_id for s in _not_behind(slots, min_gain) if s.candidate_id not in proven]
    ranked = [cid for group in (proven, alive)
              for cid in sorted(group, key=lambda c: (-float(by_id[c].val_accuracy), order.index(c)))]
    if int(keep) > 0:
        ranked = ranked[:max(0, int(keep) - 1)]
    return tuple(cid for cid in order if cid == CONTROL or cid in ranked)


def confirmed(confirmation: Mapping, *, min_gain: float = 0.0) -> bool:
    """The two-look design's confirmation: the finalist's paired gain interval on fresh val prompts (its and the
    control's first-rung policies answer them) has its lower end above ``min_gain``. One test on data the screen never
    saw, so the chance of promoting a candidate that is not better is at most the interval's one-sided miss rate,
    whatever the number of candidates screened."""
    return float(confirmation["ci_low"]) > min_gain


def earned_look(targeted: Sequence[str], critical: Mapping[str, float], remeasured: Mapping[str, float],
                critical_above: Mapping[str, float]) -> dict | None:
    """Whether a candidate earns a second rung on evidence, whatever its first rung showed (``search.second_rung``;
    docs/schedule.md, "Looks that follow the evidence"): it names among its ``targeted`` findings one that the
    generation's diagnosis flags critical by trusted code (``critical``: name -> value), and its replay re-measures
    that finding (``remeasured``, by trusted code on the rescored evidence) at most half the value and below the
    critical threshold (``critical_above``). The first such finding, with its values; None where none qualifies.
    A finding the replay cannot re-measure (one of the policy's or of training) never earns a look."""
    for name in targeted:
        if name not in critical or name not in remeasured or name not in critical_above:
            continue
        before, after = float(critical[name]), float(remeasured[name])
        if after <= min(before / 2, float(critical_above[name])):
            return {"finding": name, "before": before, "after": after}
    return None
