"""The agent interface: narrate a diagnosis, propose k single-variable candidates."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pandas as pd

from evotrainer.contracts.candidate import Proposal

INCONCLUSIVE = "diagnostic_unverifiable"
# A candidate that answers a trusted finding still critical now, and whose every earlier test from this parent
# gained over control but not surely (no_gain with a positive delta), is tried again, up to this many tries in all
RETRY_LIMIT = 3
TRUSTED = "trusted"


@dataclass
class ProposalContext:
    generation: int
    harness_dir: Path
    harness_id: str
    findings: list[dict]  # diagnosis findings (diagnostics.parquet rows as dicts)
    lineage: pd.DataFrame  # every candidate tried so far in this run (may be empty)
    feedback: str | None = None  # human feedback from a `revise` at an approval, when there is one
    extra: dict = field(default_factory=dict)
    seed: int = 0  # the run's seed (cfg.seed): each headline seed's random arm draws its own stream
    generations: int | None = None  # the run's search.generations: a tuner sizes its random startup by it

    @property
    def signature(self) -> list[str]:
        return sorted(f["name"] for f in self.findings if f["severity"] in ("warn", "critical"))

    def tried_diffs(self) -> set[str]:
        """diff_hash of every candidate already tried from this parent harness with a conclusive outcome
        (a diagnostics change that could not be verified yet, for want of archived evidence, may return)."""
        lineage = self.lineage
        if lineage is None or lineage.empty:
            return set()
        conclusive = lineage["failure_label"] != INCONCLUSIVE if "failure_label" in lineage else True
        same_parent = lineage[(lineage["parent_harness_id"] == self.harness_id) & conclusive]
        return set(same_parent["diff_hash"]) - self.worth_retrying(same_parent)

    def worth_retrying(self, same_parent: pd.DataFrame) -> set[str]:
        """diff_hash of the candidates tried from this parent that deserve another test: a finding they targeted
        is still critical in the trusted layer (the defect is still there), every try gained over control but
        not surely (``no_gain`` with a positive delta), fewer than ``RETRY_LIMIT`` tries. A new generation's
        policy gives an independent test, and a flaw's harm often grows with training (a starving curriculum)
        where one slot's gain is too small to clear zero."""
        critical = {f["name"] for f in self.findings if f.get("severity") == "critical" and f.get("layer") == TRUSTED}
        needed = {"diff_hash", "failure_label", "delta_vs_control", "targeted_findings"}
        if not critical or not needed <= set(same_parent.columns):
            return set()
        out = set()
        for digest, rows in same_parent.groupby("diff_hash"):
            targeted = {str(t) for ts in rows["targeted_findings"] if ts is not None for t in list(ts)}
            gained = (rows["failure_label"] == "no_gain").all() and (rows["delta_vs_control"] > 0).all()
            if gained and len(rows) < RETRY_LIMIT and targeted & critical:
                out.add(digest)
        return out


@dataclass
class FailedProposal(Proposal):
    """A candidate the agent could not produce validly (after retries): it is written with its failure
    label so the lineage records it as failed, and is never replayed or trained."""

    failure_label: str = "invalid_diff"
    error: str = ""

    def __post_init__(self) -> None:
        # what the model sent may hold lone surrogates (invalid UTF-8); keep a printable copy
        self.diff = self.diff.encode("utf-8", errors="replace").decode("utf-8")

    @property
    def failure(self) -> dict:
        return {"ok": False, "failure_label": self.failure_label, "error": self.error, "files": []}


@dataclass
class FallbackProposal(Proposal):
    """A candidate of the offline agent standing in for an LLM agent whose endpoint failed, budget ran
    out or step deadline passed (agent.fallback: heuristic); proposal.json carries these fields."""

    fallback: bool = True
    proposed_by: str = "heuristic-fallback"
    fallback_reason: str = ""


class Agent(Protocol):
    name: str

    def narrate(self, context: ProposalContext) -> str:
        """A short readable account of what the findings say."""
        ...

    def propose(self, context: ProposalContext, k: int) -> list[Proposal]:
        """Up to k candidates, each a single-variable change as a unified diff against the harness."""
        ...
