"""Diagnostics changes an offline agent can propose from what the lineage shows.

A diagnostics-only candidate is never trained: it is backtested on the run's archived evidence
(evotrainer.search.diagnostic_backtest) and, if it flags the known-bad branches and passes the good ones,
registered into the next generation's harness. Each idea here is an appended wrapper around the
current ``diagnose`` so it composes with whatever the diagnostics file already does.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from evotrainer.agents.base import ProposalContext
from evotrainer.contracts.candidate import Proposal
from evotrainer.contracts.intervention import unified_diff


@dataclass(frozen=True)
class DiagnosticIdea:
    name: str  # the finding it adds
    triggered_by: tuple[str, ...]  # lineage failure labels that call for it
    code: str
    hypothesis: str


REWARD_WITHOUT_CORRECTNESS = DiagnosticIdea(
    name="reward_without_correctness",
    triggered_by=("vetoed:reward_hacking", "vetoed:reward_correctness", "vetoed:reward_false_positives",
                  "vetoed:format_exploitation", "vetoed:length_gaming"),
    code='''

# evolved diagnostic: reward_without_correctness (proposed after a validity gate vetoed a reward hack)
_diagnose_before_reward_without_correctness = diagnose


def diagnose(evidence, train_log, recipe):
    findings = _diagnose_before_reward_without_correctness(evidence, train_log, recipe)
    reward = evidence["reward"].to_numpy(dtype=float)
    correct = evidence["correct"].to_numpy(dtype=bool)
    top = reward.max() if len(reward) else 0.0
    paid = reward >= 0.5 * top if top > 0 else np.zeros(len(reward), dtype=bool)
    wrong = paid & ~correct
    findings.append(_finding(
        "reward_without_correctness", "signal", wrong.sum() / max(int(paid.sum()), 1), threshold=0.2,
        critical=0.5, affected_rows=int(wrong.sum()), examples=_rows(wrong),
        message="share of well-rewarded responses (>= half the top reward) that the verifier marks wrong"))
    return findings
''',
    hypothesis=("A validity gate had to veto a reward hack that the diagnostics did not see. A finding for "
                "well-rewarded but unverified responses flags such branches from their own rollouts, before "
                "select: it should flag every vetoed branch in the archive and none of the promoted ones."),
)

IDEAS = (REWARD_WITHOUT_CORRECTNESS,)


def propose_diagnostics(context: ProposalContext, tried: set[str]) -> list[Proposal]:
    """Diagnostics-only proposals the lineage calls for (not yet in the harness, not yet tried)."""
    from evotrainer.runtime import diff_hash

    lineage = context.lineage if context.lineage is not None else pd.DataFrame()
    labels = set(lineage["failure_label"].dropna()) if "failure_label" in lineage else set()
    source = (context.harness_dir / "diagnostics.py").read_text(encoding="utf-8")
    out = []
    for idea in IDEAS:
        seen = sorted(labels & set(idea.triggered_by))
        if not seen or f'"{idea.name}"' in source:
            continue
        diff = unified_diff("diagnostics.py", source, source.rstrip("\n") + "\n" + idea.code)
        if diff_hash(diff) in tried:
            continue
        out.append(Proposal(f"diagnostic:{idea.name}", idea.hypothesis, seen,
                            "flags every known-bad archived branch and no known-good one", diff))
    return out
