"""The agent-call record: one row per API call an LLM agent makes, in
``gen<g>/candidates/agent_calls.parquet``, and the per-run budget read back from those files.

A call is one logical request; its retries (429, 529, 5xx, timeouts, unusable replies) happen inside
it and are counted in ``attempts``. A failed call carries its failure label (``agent_api_error``,
``agent_timeout``, ``agent_malformed_reply``); a successful call whose usage was not believed carries
``agent_usage_invalid``. Tokens are what the endpoint reported in ``usage``, or, where it could not be
believed or an attempt's reply was lost (a timeout, an unusable body), a conservative estimate
(``usage_estimated``): the request's characters as input tokens and ``agent.max_tokens`` as output.
Cost is an estimate from ``agent.prices`` (USD per million tokens). Every field passes through
evotrainer.secrets redaction when written (evotrainer.atomic).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from evotrainer.atomic import write_parquet
from evotrainer.layout import AGENT_CALLS, RunLayout

FILE_NAME = AGENT_CALLS  # in the run's gen<g>/candidates/ (evotrainer.layout)

SCHEMA = pa.schema(
    [
        ("run", pa.string()),
        ("generation", pa.int64()),
        ("agent", pa.string()),
        ("model", pa.string()),
        ("call_index", pa.int64()),
        ("outcome", pa.string()),  # ok | rate_limited | overloaded | server_error | timeout | connection_error
        #                            | malformed_reply | api_error
        ("label", pa.string()),  # failure label of a failed call, or agent_usage_invalid; null when all is well
        ("attempts", pa.int64()),  # HTTP attempts, the SDK's retries included
        ("status_code", pa.int64()),
        ("error_type", pa.string()),
        ("error", pa.string()),
        ("stop_reason", pa.string()),
        ("tool_calls", pa.list_(pa.string())),
        ("input_tokens", pa.int64()),  # uncached input tokens
        ("output_tokens", pa.int64()),
        ("cache_read_tokens", pa.int64()),
        ("cache_creation_tokens", pa.int64()),
        ("usage_estimated", pa.bool_()),  # the tokens above are (partly) the conservative estimate
        ("request_chars", pa.int64()),  # size of the JSON the agent sent (system + tools + messages)
        ("latency_s", pa.float64()),
        ("cost_usd", pa.float64()),
        ("started_at", pa.float64()),
    ]
)


@dataclass
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_creation_tokens: int = 0

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens + self.cache_read_tokens + self.cache_creation_tokens

    def plus(self, other: Usage, times: int = 1) -> Usage:
        return Usage(self.input_tokens + times * other.input_tokens, self.output_tokens + times * other.output_tokens,
                     self.cache_read_tokens + times * other.cache_read_tokens,
                     self.cache_creation_tokens + times * other.cache_creation_tokens)

    def cost(self, prices) -> float:
        """Estimated USD; ``prices`` has input/output/cache_read/cache_write per million tokens."""
        return (self.input_tokens * prices.input + self.output_tokens * prices.output
                + self.cache_read_tokens * prices.cache_read + self.cache_creation_tokens * prices.cache_write) / 1e6


@dataclass
class CallRecord:
    run: str
    generation: int
    agent: str
    model: str
    call_index: int
    outcome: str
    attempts: int
    started_at: float
    latency_s: float
    request_chars: int
    usage: Usage = field(default_factory=Usage)
    cost_usd: float = 0.0
    status_code: int | None = None
    error_type: str | None = None
    error: str | None = None
    stop_reason: str | None = None
    tool_calls: list[str] = field(default_factory=list)
    label: str | None = None
    usage_estimated: bool = False

    def row(self) -> dict:
        row = asdict(self)
        row.update(row.pop("usage"))
        return row


def write(path: str | Path, records: list[CallRecord]) -> None:
    rows = [r.row() for r in records]
    table = pa.Table.from_pylist(rows, schema=SCHEMA) if rows else SCHEMA.empty_table()
    write_parquet(path, table)


def spent(run_dir: str | Path, before_generation: int) -> tuple[int, float]:
    """(tokens, estimated USD) the run's agent spent in generations before ``before_generation``."""
    tokens, cost = 0, 0.0
    for g in range(before_generation):
        path = RunLayout(run_dir).gen(g).agent_calls
        if not path.exists():
            continue
        table = pq.read_table(path, columns=["input_tokens", "output_tokens", "cache_read_tokens",
                                             "cache_creation_tokens", "cost_usd"]).to_pandas()
        tokens += int(table[["input_tokens", "output_tokens", "cache_read_tokens", "cache_creation_tokens"]].sum().sum())
        cost += float(table["cost_usd"].sum())
    return tokens, cost


TOKEN_COLUMNS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_creation_tokens")


def _label(outcome: str, label) -> str | None:
    """A failed call's label; tables written before the label column existed get it from the outcome."""
    if isinstance(label, str) and label:
        return label
    if outcome == "ok":
        return None
    return {"timeout": "agent_timeout", "malformed_reply": "agent_malformed_reply"}.get(outcome, "agent_api_error")


def summarize(run_dir: str | Path) -> dict:
    """The agent's API calls over a run, from every gen<g>/candidates/agent_calls.parquet: calls, failed
    calls by label, tokens, estimated cost, and the same per generation (empty when no call was made,
    e.g. with the offline agent)."""
    per_generation = []
    for path in sorted(RunLayout(run_dir).find("agent_calls"), key=_generation):
        frame = pq.read_table(path).to_pandas()
        if frame.empty:
            continue
        labels = [_label(o, frame["label"].iloc[i] if "label" in frame else None) for i, o in enumerate(frame["outcome"])]
        failed = [lab for lab, outcome in zip(labels, frame["outcome"], strict=True) if outcome != "ok"]
        row = {"generation": _generation(path), "calls": len(frame), "failed_calls": len(failed),
               "failed_by_label": {lab: failed.count(lab) for lab in sorted(set(failed))},
               "usage_not_believed": sum(lab == "agent_usage_invalid" for lab in labels),
               "attempts": int(frame["attempts"].sum()),
               **{c: int(frame[c].sum()) for c in TOKEN_COLUMNS}, "cost_usd": float(frame["cost_usd"].sum()),
               "estimated_calls": int(frame["usage_estimated"].sum()) if "usage_estimated" in frame else 0,
               "agents": sorted(set(frame["agent"])), "models": sorted(set(frame["model"]))}
        per_generation.append(row)
    total = {"calls": 0, "failed_calls": 0, "failed_by_label": {}, "usage_not_believed": 0, "attempts": 0,
             **{c: 0 for c in TOKEN_COLUMNS}, "cost_usd": 0.0, "estimated_calls": 0}
    for row in per_generation:
        for key in total:
            if key == "failed_by_label":
                for lab, n in row[key].items():
                    total[key][lab] = total[key].get(lab, 0) + n
            else:
                total[key] += row[key]
    total["models"] = sorted({m for row in per_generation for m in row["models"]})
    return total | {"per_generation": per_generation}


def summary_table(summary: dict):
    """One row per generation plus a total row, for the report (pandas DataFrame)."""
    import pandas as pd

    columns = ["generation", "calls", "failed_calls", "failed_by_label", "attempts", *TOKEN_COLUMNS, "cost_usd"]
    rows = [{c: row[c] for c in columns} for row in summary["per_generation"]]
    rows.append({c: summary.get(c) for c in columns} | {"generation": "total"})
    table = pd.DataFrame(rows, columns=columns)
    table["failed_by_label"] = table["failed_by_label"].map(
        lambda d: ", ".join(f"{k}: {v}" for k, v in d.items()) if isinstance(d, dict) else "")
    return table


def _generation(path: Path) -> int:
    try:
        generation = RunLayout.parse(path).generation
    except ValueError:
        return -1
    return -1 if generation is None else generation
