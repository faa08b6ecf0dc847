"""The read-only tools an LLM agent gets, each bounded in output size.

Every path a tool can read is fixed by the propose stage, never by the model: the parent harness
files, this generation's rollouts.parquet and diagnostics.parquet, the diagnosis findings, the run's
lineage and the skill library. Evidence queries are a whitelist of aggregations with whitelisted
group-by and filter columns and a row limit; rows of the test split are dropped on load (protocol
guard). No tool touches the network. ``submit_candidate`` and ``finish`` are handled by the
conversation loop (evotrainer.agents.llm), not here.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq

from evotrainer.contracts.harness import EDITABLE_FILES
from evotrainer.contracts.text import bounded_text
from evotrainer.scoring.trusted_findings import disagreement

MAX_ROWS = 50
MAX_EXAMPLES = 20
TEXT_CHARS = 200  # prompt/response/hypothesis text per row
DIFF_CHARS = 1500
GROUP_BY = ("difficulty", "data_source", "finish_reason", "truncated", "correct", "format_ok", "step", "sample_idx")
FILTERS = {"difficulty": int, "data_source": str, "finish_reason": str, "truncated": bool, "correct": bool,
           "format_ok": bool, "step": int}
AGGREGATIONS = {
    "overview": "rows, groups, accuracy, reward mean/std, truncation and format rates, response length, entropy",
    "group_signal": "per GRPO group: dead (zero reward variance), all-correct and all-wrong ratios, within-group reward std",
    "reward_components": "mean of each reward component column (rc_*) next to reward and accuracy",
    "length_vs_reward": "response length quartiles with reward and accuracy in each, and the length-reward correlation",
    "examples": "example rows (prompt, response, ground truth, reward, correct, truncated), texts cut to 200 chars",
    "reward_vs_verifier": "rows where the harness reward and the verifier disagree (false positives: incorrect but "
                          "paid or above the group median; false negatives: correct but not paid or below it), with "
                          "rates and 3 example rows of each",
    "diagnostics": "the rows of this generation's diagnostics.parquet",
}
_EVIDENCE_COLUMNS = ("split", "step", "prompt_id", "group_id", "sample_idx", "data_source", "prompt", "response",
                     "ground_truth", "reward", "correct", "response_tokens", "truncated", "finish_reason",
                     "mean_logprob", "entropy", "format_ok", "difficulty")

TOOL_SPECS: list[dict] = [
    {
        "name": "read_harness_file",
        "description": "Read one file of the parent harness (the files your diff may edit).",
        "parameters": {"type": "object", "properties": {"file": {"type": "string", "enum": list(EDITABLE_FILES)}},
                       "required": ["file"], "additionalProperties": False},
    },
    {
        "name": "query_evidence",
        "description": "Aggregate this generation's rollout evidence (one row per sampled response, probe split). "
                       "Aggregations: " + "; ".join(f"{k}: {v}" for k, v in AGGREGATIONS.items()) + ".",
        "parameters": {
            "type": "object",
            "properties": {
                "aggregation": {"type": "string", "enum": list(AGGREGATIONS)},
                "group_by": {"type": "string", "enum": list(GROUP_BY),
                             "description": "optional column to break the aggregation down by"},
                "where": {"type": "object", "description": "optional equality filters, e.g. {\"correct\": false}",
                          "properties": {name: {"type": {int: "integer", str: "string", bool: "boolean"}[kind]}
                                         for name, kind in FILTERS.items()},
                          "additionalProperties": False},
                "limit": {"type": "integer", "minimum": 1, "maximum": MAX_ROWS},
            },
            "required": ["aggregation"], "additionalProperties": False,
        },
    },
    {
        "name": "read_findings",
        "description": "The diagnosis of this generation: every finding (name, layer, value, threshold, severity, "
                       "affected rows, message).",
        "parameters": {"type": "object", "properties": {"flagged_only": {"type": "boolean"}},
                       "additionalProperties": False},
    },
    {
        "name": "read_lineage",
        "description": "Candidates tried earlier in this run, newest first: intervention, verdict (promoted, kept, "
                       "rejected, vetoed, failed), failure label, val accuracy and gain over control, hypothesis.",
        "parameters": {"type": "object", "properties": {
            "limit": {"type": "integer", "minimum": 1, "maximum": MAX_ROWS},
            "include_diffs": {"type": "boolean"}}, "additionalProperties": False},
    },
    {
        "name": "read_skills",
        "description": "Skills from earlier verified outcomes whose trigger (diagnostic signature) matches this "
                       "generation's: intervention diff, expected outcome, validation, verdict.",
        "parameters": {"type": "object", "properties": {"k": {"type": "integer", "minimum": 1, "maximum": 10}},
                       "additionalProperties": False},
    },
    {
        "name": "submit_candidate",
        "description": "Submit one single-variable candidate: a unified diff against the parent harness "
                       "('--- a/<file>' / '+++ b/<file>' headers, exact context lines), a falsifiable hypothesis "
                       "('if X then metric Y improves because Z'), the findings it targets and its success criterion. "
                       "The diff is checked at once; an invalid one is returned with the error for you to fix.",
        "parameters": {
            "type": "object",
            "properties": {
                "intervention": {"type": "string", "description": "short snake_case name, e.g. lower_lr"},
                "hypothesis": {"type": "string"},
                "targeted_findings": {"type": "array", "items": {"type": "string"}},
                "success_criterion": {"type": "string"},
                "diff": {"type": "string"},
            },
            "required": ["intervention", "hypothesis", "targeted_findings", "success_criterion", "diff"],
            "additionalProperties": False,
        },
    },
    {
        "name": "finish",
        "description": "End this generation's proposals (call it when no further distinct candidate is worth a backtest).",
        "parameters": {"type": "object", "properties": {"reason": {"type": "string"}}, "additionalProperties": False},
    },
]


class ToolError(ValueError):
    """A tool call the tool refuses; the message goes back to the model."""


def cap(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    note = f"\n[... cut: {len(text)} characters, tool output limit {limit}]"
    return text[: max(0, limit - len(note))] + note


def _plain(value: Any) -> Any:
    """JSON-safe, rounded values (NaN -> null) so the model reads numbers, not numpy reprs."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "tolist") and not isinstance(value, str):  # numpy scalars and arrays
        return _plain(value.tolist())
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else float(f"{value:.4g}")
    return value


def _dumps(value: Any) -> str:
    return json.dumps(_plain(value), ensure_ascii=False)


def _cut(text: Any, limit: int = TEXT_CHARS) -> Any:
    return text if not isinstance(text, str) or len(text) <= limit else text[:limit] + "…"


@dataclass
class Toolbox:
    harness_dir: Path
    rollouts: Path | None
    diagnostics: Path | None
    findings: list[dict]
    lineage: pd.DataFrame
    skills_dirs: list[Path] = field(default_factory=list)
    signature: list[str] = field(default_factory=list)
    skills: list[dict] | None = None  # retrieved by the propose stage when it did (evotrainer.contracts.skill)
    max_chars: int = 6000
    _evidence: pd.DataFrame | None = field(default=None, init=False, repr=False)

    NAMES = ("read_harness_file", "query_evidence", "read_findings", "read_lineage", "read_skills")

    @classmethod
    def from_context(cls, context, max_chars: int) -> Toolbox:
        extra = context.extra
        return cls(
            harness_dir=Path(context.harness_dir), rollouts=_opt_path(extra.get("rollouts")),
            diagnostics=_opt_path(extra.get("diagnostics")), findings=list(context.findings),
            lineage=context.lineage, skills_dirs=[Path(p) for p in extra.get("skills_dirs", [])],
            signature=context.signature, skills=extra.get("skills"), max_chars=max_chars,
        )

    def run(self, name: str, arguments: dict) -> str:
        if name not in self.NAMES:
            raise ToolError(f"unknown tool {name!r}; tools: {list(self.NAMES)} and submit_candidate, finish")
        if not isinstance(arguments, dict):
            raise ToolError(f"{name}: arguments must be a JSON object")
        return cap(getattr(self, name)(**_known_args(name, arguments)), self.max_chars)

    def read_harness_file(self, file: str) -> str:
        if file not in EDITABLE_FILES:  # env.yaml only where the harness has one
            raise ToolError(f"read_harness_file: {file!r} is not a harness file; choose one of {list(EDITABLE_FILES)}")
        root = self.harness_dir.resolve()
        path = (root / file).resolve()
        if path.parent != root or not path.is_file():  # a symlink out of the harness is refused too
            raise ToolError(f"read_harness_file: {file} is not a regular file inside the harness")
        return path.read_text(encoding="utf-8", errors="replace")

    def query_evidence(self, aggregation: str, group_by: str | None = None, where: dict | None = None,
                       limit: int = 20) -> str:
        if aggregation not in AGGREGATIONS:
            raise ToolError(f"query_evidence: aggregation {aggregation!r} is not one of {list(AGGREGATIONS)}")
        if group_by is not None and group_by not in GROUP_BY:
            raise ToolError(f"query_evidence: group_by {group_by!r} is not one of {list(GROUP_BY)}")
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_ROWS:
            raise ToolError(f"query_evidence: limit must be an integer in [1, {MAX_ROWS}]")
        if aggregation == "diagnostics":
            return self._diagnostics(limit)
        frame = self._filtered(where or {})
        if group_by is not None and group_by not in frame.columns:
            raise ToolError(f"query_evidence: this evidence has no column {group_by!r}")
        if aggregation == "examples":
            columns = [c for c in ("prompt_id", "sample_idx", "difficulty", "prompt", "response", "ground_truth",
                                   "reward", "correct", "truncated", "response_tokens") if c in frame.columns]
            rows = frame.sort_values(["prompt_id", "sample_idx"]).head(min(limit, MAX_EXAMPLES))[columns]
            records = [{k: _cut(v) for k, v in r.items()} for r in rows.to_dict("records")]
            return _dumps({"aggregation": aggregation, "matching_rows": len(frame), "rows": records})
        summarise = {"overview": _overview, "group_signal": _group_signal, "reward_components": _reward_components,
                     "length_vs_reward": _length_vs_reward, "reward_vs_verifier": _reward_vs_verifier}[aggregation]
        if group_by is None:
            records = [summarise(frame)]
        else:
            records = [{group_by: key, **summarise(part)} for key, part in frame.groupby(group_by, sort=True)]
        return _dumps({"aggregation": aggregation, "group_by": group_by, "groups": len(records),
                       "rows": records[:limit], "rows_cut": max(0, len(records) - limit)})

    def read_findings(self, flagged_only: bool = False) -> str:
        keep = []
        for finding in self.findings:
            if flagged_only and finding.get("severity") not in ("warn", "critical"):
                continue
            finding = dict(finding)
            for key, limit in (("name", 200), ("message", 2000)):  # a candidate's diagnostics wrote them: bounded
                if key in finding:
                    finding[key] = bounded_text(finding[key], limit)
            if isinstance(finding.get("examples"), list):  # example rows a diagnostic attached: two, cut short
                finding["examples"] = [{k: _cut(v) for k, v in e.items()} if isinstance(e, dict) else _cut(str(e))
                                       for e in finding["examples"][:2]]
            keep.append(finding)
        return _dumps({"signature": self.signature, "findings": keep})

    def read_lineage(self, limit: int = 20, include_diffs: bool = False) -> str:
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_ROWS:
            raise ToolError(f"read_lineage: limit must be an integer in [1, {MAX_ROWS}]")
        lineage = self.lineage
        if lineage is None or lineage.empty:
            return _dumps({"candidates": 0, "rows": [], "note": "nothing was tried yet in this run"})
        columns = ["generation", "candidate_id", "intervention", "verdict", "failure_label", "val_accuracy",
                   "delta_vs_control", "parent_harness_id", "targeted_findings", "hypothesis"]
        columns += ["diff"] if include_diffs else []
        rows = lineage.sort_values(["generation", "candidate_id"], ascending=[False, True]).head(limit)
        records = []
        for record in rows[[c for c in columns if c in rows.columns]].to_dict("records"):
            record["hypothesis"] = _cut(record.get("hypothesis"))
            if include_diffs:
                record["diff"] = _cut(record.get("diff"), DIFF_CHARS)
            records.append(record)
        return _dumps({"candidates": len(lineage), "rows": records})

    def read_skills(self, k: int = 5) -> str:
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 10:
            raise ToolError("read_skills: k must be an integer in [1, 10]")
        records = self.skills
        if records is None:  # the stage did not retrieve any: ask the library directly
            try:
                from evotrainer.contracts import skill as skills
            except ImportError:
                return _dumps({"skills": [], "note": "the skill library is not available in this installation"})
            records = skills.retrieve([str(p) for p in self.skills_dirs], self.signature, k=k)
        records = list(records)[:k]
        out = []
        for record in records:
            record = dict(record)
            if isinstance(record.get("diff"), str):
                record["diff"] = _cut(record["diff"], DIFF_CHARS)
            out.append(record)
        return _dumps({"signature": self.signature, "skills": out})

    # -- evidence ------------------------------------------------------------------------------------

    def _load(self) -> pd.DataFrame:
        if self._evidence is None:
            if self.rollouts is None or not self.rollouts.is_file():
                raise ToolError("query_evidence: this generation has no rollout evidence")
            # files are opened with Python's open() so that an audit hook sees every read (tests do)
            with open(self.rollouts, "rb") as handle:
                parquet = pq.ParquetFile(handle)
                present = set(parquet.schema_arrow.names)
                columns = [c for c in _EVIDENCE_COLUMNS if c in present]
                columns += sorted(c for c in present if c.startswith("rc_"))
                frame = parquet.read(columns=columns).to_pandas()
            if "split" in frame.columns:
                frame = frame[frame["split"] != "test"]  # protocol guard: never shown, whatever the file holds
            self._evidence = frame.reset_index(drop=True)
        return self._evidence

    def _filtered(self, where: dict) -> pd.DataFrame:
        if not isinstance(where, dict):
            raise ToolError("query_evidence: where must be an object of column: value")
        frame = self._load()
        for column, value in where.items():
            kind = FILTERS.get(column)
            if kind is None:
                raise ToolError(f"query_evidence: cannot filter on {column!r}; filter columns: {list(FILTERS)}")
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise ToolError(f"query_evidence: where.{column} must be a {kind.__name__}, got {value!r}")
            if column not in frame.columns:
                raise ToolError(f"query_evidence: this evidence has no column {column!r}")
            frame = frame[frame[column] == value]
        return frame

    def _diagnostics(self, limit: int) -> str:
        if self.diagnostics is None or not self.diagnostics.is_file():
            raise ToolError("query_evidence: this generation has no diagnostics.parquet")
        with open(self.diagnostics, "rb") as handle:
            frame = pq.read_table(handle).to_pandas()
        keep = [c for c in ("name", "layer", "value", "threshold", "direction", "severity", "affected_rows", "message")
                if c in frame.columns]
        rows = frame[keep].head(limit).to_dict("records")
        for row in rows:
            for key, chars in (("name", 200), ("message", 2000)):  # a candidate's diagnostics wrote them: bounded
                if key in row:
                    row[key] = bounded_text(row[key], chars)
        return _dumps({"aggregation": "diagnostics", "rows": rows,
                       "rows_cut": max(0, len(frame) - limit)})


def _opt_path(value) -> Path | None:
    return None if value is None else Path(value)


def _known_args(name: str, arguments: dict) -> dict:
    spec = next(s for s in TOOL_SPECS if s["name"] == name)["parameters"]
    unknown = sorted(set(arguments) - set(spec.get("properties", {})))
    if unknown:
        raise ToolError(f"{name}: unknown argument(s) {unknown}; arguments: {sorted(spec.get('properties', {}))}")
    missing = [a for a in spec.get("required", []) if a not in arguments]
    if missing:
        raise ToolError(f"{name}: missing argument(s) {missing}")
    return arguments


def _rate(frame: pd.DataFrame, column: str) -> float | None:
    return float(frame[column].mean()) if column in frame.columns and len(frame) else None


def _overview(frame: pd.DataFrame) -> dict:
    return {
        "rows": len(frame), "groups": int(frame["group_id"].nunique()) if "group_id" in frame else None,
        "accuracy": _rate(frame, "correct"), "reward_mean": _rate(frame, "reward"),
        "reward_std": float(frame["reward"].std()) if len(frame) > 1 else None,
        "truncation_rate": _rate(frame, "truncated"), "format_ok_rate": _rate(frame, "format_ok"),
        "response_tokens_mean": _rate(frame, "response_tokens"), "entropy_mean": _rate(frame, "entropy"),
        "mean_logprob": _rate(frame, "mean_logprob"),
    }


def _group_signal(frame: pd.DataFrame) -> dict:
    if not len(frame):
        return {"groups": 0}
    groups = frame.groupby("group_id")
    reward_std = groups["reward"].std(ddof=0)
    correct = groups["correct"].mean()
    return {"groups": int(len(reward_std)), "dead_group_ratio": float((reward_std == 0).mean()),
            "all_correct_ratio": float((correct == 1).mean()), "all_wrong_ratio": float((correct == 0).mean()),
            "within_group_reward_std_mean": float(reward_std.mean())}


def _reward_components(frame: pd.DataFrame) -> dict:
    out = {"rows": len(frame), "reward_mean": _rate(frame, "reward"), "accuracy": _rate(frame, "correct")}
    for column in sorted(c for c in frame.columns if c.startswith("rc_")):
        out[column] = _rate(frame, column)
    return out


def _reward_vs_verifier(frame: pd.DataFrame) -> dict:
    """The trusted findings' reward/verifier disagreement (scoring.trusted_findings.disagreement) on these rows."""
    if not len(frame):
        return {"rows": 0}
    false_pos, false_neg = disagreement(frame.reset_index(drop=True))
    columns = [c for c in ("prompt_id", "sample_idx", "response", "ground_truth", "reward", "correct") if c in frame]
    correct = frame["correct"].to_numpy(dtype=bool)

    def examples(mask) -> list[dict]:
        return [{k: _cut(v) for k, v in r.items()} for r in frame[columns][mask].head(3).to_dict("records")]

    return {"rows": len(frame), "false_positives": int(false_pos.sum()), "false_negatives": int(false_neg.sum()),
            "false_positive_rate": float(false_pos.sum() / max(int((~correct).sum()), 1)),
            "false_negative_rate": float(false_neg.sum() / max(int(correct.sum()), 1)),
            "false_positive_examples": examples(false_pos), "false_negative_examples": examples(false_neg)}


def _length_vs_reward(frame: pd.DataFrame) -> dict:
    if len(frame) < 2:
        return {"rows": len(frame)}
    lengths = frame["response_tokens"].astype(float)
    bins = pd.qcut(lengths, q=4, duplicates="drop")
    by_bin = frame.groupby(bins, observed=True).agg(rows=("reward", "size"), reward_mean=("reward", "mean"),
                                                   accuracy=("correct", "mean"))
    corr = lengths.corr(frame["reward"].astype(float))
    return {"rows": len(frame), "length_reward_correlation": None if pd.isna(corr) else float(corr),
            "quartiles": [{"tokens": str(interval), **values} for interval, values in by_bin.to_dict("index").items()]}
