"""The agent-call record: one row per API call an LLM agent makes, in
``gen<g>/candidates/agent_calls.parquet``, and the per-run budget read back from those files.

A call is one logical request; the SDK's own retries (429, 529, 5xx, timeouts) happen inside it and
are counted in ``attempts``. Tokens and cost are what the endpoint reported in ``usage``; cost is an
estimate from ``agent.prices`` (USD per million tokens).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from evotrainer.atomic import write_parquet

FILE_NAME = "agent_calls.parquet"

SCHEMA = pa.schema(
    [
        ("run", pa.string()),
        ("generation", pa.int64()),
        ("agent", pa.string()),
        ("model", pa.string()),
        ("call_index", pa.int64()),
        ("outcome", pa.string()),  # ok | rate_limited | overloaded | server_error | timeout | connection_error | api_error
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
        path = Path(run_dir) / f"gen{g}" / "candidates" / FILE_NAME
        if not path.exists():
            continue
        table = pq.read_table(path, columns=["input_tokens", "output_tokens", "cache_read_tokens",
                                             "cache_creation_tokens", "cost_usd"]).to_pandas()
        tokens += int(table[["input_tokens", "output_tokens", "cache_read_tokens", "cache_creation_tokens"]].sum().sum())
        cost += float(table["cost_usd"].sum())
    return tokens, cost
