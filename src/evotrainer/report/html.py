"""The run report: one self-contained HTML file (PNG plots embedded) plus the PNGs themselves,
which the Snakemake `report` rule also registers for `snakemake --report`.

Sections (HTML ids): val-per-generation, training-curves, lineage, findings, test, compute, agent-cost.
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from evotrainer.atomic import atomic_path, write_text  # noqa: E402
from evotrainer.contracts import agent_calls  # noqa: E402
from evotrainer.contracts import lineage as lineage_contract  # noqa: E402
from evotrainer.layout import RunLayout  # noqa: E402

SECTIONS = ("val-per-generation", "training-curves", "lineage", "findings", "test", "compute", "agent-cost")
VERDICT_COLOURS = {"promoted": "#2e7d32", "kept": "#1565c0", "rejected": "#9e9e9e", "failed": "#c62828",
                   "vetoed": "#6a1b9a", "registered": "#ef6c00", "continued": "#00838f"}
SEVERITY_LEVEL = {"ok": 0, "warn": 1, "critical": 2}
CURVES = [("reward_mean", "training reward"), ("accuracy", "training accuracy"), ("dead_group_ratio", "dead-group ratio"),
          ("entropy", "entropy"), ("kl", "KL to parent"), ("response_len_mean", "response length (tokens)")]


def _read_json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


class RunData:
    def __init__(self, run_dir: Path):
        self.dir = run_dir
        self.layout = layout = RunLayout(run_dir)
        self.init = _read_json(layout.init_metrics) or {}
        gens = [g for g in layout.generations() if layout.gen(g).selection.exists()]
        self.selections = [_read_json(layout.gen(g).selection) for g in gens]
        self.generations = gens
        self.lineage = lineage_contract.read(layout.lineage)
        self.baseline = _read_json(layout.baseline("baseline").metrics)
        self.evolved_test = _read_json(layout.test_metrics("evolved"))
        self.baseline_test = _read_json(layout.test_metrics("baseline"))
        self.matched = _read_json(layout.baseline("baseline_matched").metrics)
        self.matched_test = _read_json(layout.test_metrics("baseline_matched"))
        self.whole = _read_json(layout.baseline("baseline_search").metrics)
        self.tests = {arm: _read_json(layout.test_metrics(arm)) for arm in TEST_ARMS}
        self.tests = {arm: metrics for arm, metrics in self.tests.items() if metrics}
        self.ledger = (_read_json(layout.summary) or {}).get("ledger") or {}

    def charged(self, arm: str) -> int | None:
        """What the ledger charged an arm (evolved: its promoted path), None without a ledger."""
        node = self.ledger.get("promoted_path") if arm == "evolved" else (self.ledger.get("fixed") or {}).get(arm)
        return None if not node or node.get("charged") is None else int(node["charged"])

    def train_log(self, g: int, cid: str) -> pd.DataFrame | None:
        path = self.layout.gen(g).backtest(cid).train_log
        return pd.read_parquet(path) if path.exists() else None

    def evolved_curve(self) -> pd.DataFrame:
        frames, offset = [], 0
        for sel in self.selections:
            log = self.train_log(sel["generation"], sel["promoted"])
            if log is None:
                continue
            frames.append(log.assign(step=log["step"] + offset, generation=sel["generation"]))
            offset += len(log)
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def findings(self) -> pd.DataFrame:
        frames = [pd.read_parquet(p) for p in self.layout.find("diagnostics")]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def plot_val_per_generation(data: RunData) -> bytes:
    fig, ax = plt.subplots(figsize=(7, 3.8))
    gens = [s["generation"] for s in data.selections]
    x0 = [-1, *gens]
    init = data.init.get("val_accuracy")
    def value(x):  # a demoted generation (stages.demotion) compared nothing: a gap in the line
        return float("nan") if x is None else x

    ax.plot(x0, [value(init), *[value(s["promoted_val_accuracy"]) for s in data.selections]], "o-", color="#2e7d32",
            label="evolved (promoted per generation)")
    ax.plot(gens, [value(s["control_val_accuracy"]) for s in data.selections], "s--", color="#1565c0",
            label="control (parent harness, same steps)")
    if data.baseline and data.baseline.get("status") == "ok" and gens:
        ax.plot([gens[-1]], [data.baseline["val_accuracy"]], "D", color="#ef6c00", markersize=9,
                label="baseline (initial harness, all steps)")
    ax.set_xticks(x0, ["SFT", *[f"gen {g}" for g in gens]])
    ax.set_ylabel("val accuracy (greedy)")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    return _png(fig)


def plot_training_curves(data: RunData) -> bytes:
    evolved = data.evolved_curve()
    baseline_log = data.layout.baseline("baseline").train_log
    baseline = pd.read_parquet(baseline_log) if baseline_log.exists() else None
    fig, axes = plt.subplots(2, 3, figsize=(12, 5.5), sharex=True)
    window = max(1, len(evolved) // 60) if len(evolved) else 1
    for ax, (column, title) in zip(axes.ravel(), CURVES, strict=True):
        if len(evolved):
            ax.plot(evolved["step"], evolved[column].rolling(window, min_periods=1).mean(), color="#2e7d32", label="evolved")
            for boundary in evolved.groupby("generation")["step"].min().iloc[1:]:
                ax.axvline(boundary, color="#bbb", lw=0.8, ls=":")
        if baseline is not None:
            ax.plot(baseline["step"], baseline[column].rolling(window, min_periods=1).mean(), color="#ef6c00",
                    alpha=0.8, label="baseline")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    for ax in axes[1]:
        ax.set_xlabel("GRPO step (dotted: generation boundary)")
    return _png(fig)


def plot_lineage_tree(data: RunData) -> bytes:
    table = data.lineage
    gens = sorted(table["generation"].unique()) if len(table) else []
    height = max(3.0, 0.55 * max((table["generation"].value_counts().max() if len(table) else 1), 1) + 1)
    positions = _lineage_positions(table, gens)
    columns = int(max([x for x, _ in positions.values()] or [0])) + 1  # a run in rungs: two per generation
    fig, ax = plt.subplots(figsize=(3.2 * columns + 1, height))
    for _child, (px, py), (x, y) in _lineage_edges(table, positions):
        ax.annotate("", xy=(x - 0.42, y), xytext=(px + 0.42, py),
                    arrowprops={"arrowstyle": "->", "color": "#999", "lw": 0.8,
                                "connectionstyle": "arc3,rad=0.0" if x - px <= 1 else "arc3,rad=-0.2"})
    for (g, cid), (x, y) in positions.items():
        row = table[(table["generation"] == g) & (table["candidate_id"] == cid)].iloc[0]
        delta = row["delta_vs_control"]
        what = "" if _rung(row) >= 1 else f": {row['intervention']}"  # a continuation: its winner is its parent
        label = f"{cid}{_rung_label(row)}{what}\n" + (
            f"Δ {delta:+.3f}" if pd.notna(delta) else str(row["failure_label"]))
        ax.text(x, y, label, ha="center", va="center", fontsize=7,
                bbox={"boxstyle": "round", "fc": "white", "ec": VERDICT_COLOURS.get(row["verdict"], "#000"), "lw": 2})
    ax.set_xlim(-0.6, columns - 0.4)
    ax.set_ylim(min((p[1] for p in positions.values()), default=0) - 0.7, 0.7)
    if columns > len(gens):  # rungs: every slot's first rung, then the winner's continuation
        ax.set_xticks(range(columns), [f"gen {x // 2}: first rungs" if x % 2 == 0 else f"gen {x // 2}: winner continues"
                                       for x in range(columns)])
    else:
        ax.set_xticks(gens, [f"gen {g}" for g in gens])
    ax.set_yticks([])
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    handles = [plt.Line2D([], [], marker="s", ls="", mec=c, mfc="white", mew=2, label=v) for v, c in VERDICT_COLOURS.items()]
    ax.legend(handles=handles, loc="lower left", fontsize=7, ncol=4, bbox_to_anchor=(0, -0.25))
    return _png(fig)


def _lineage_positions(table: pd.DataFrame, gens: list) -> dict[tuple[int, str], tuple[float, float]]:
    """Where each backtest's box goes: generation g's slots in one column, top to bottom. A run spent in rungs
    (search.schedule=rungs) gives each generation two columns: its first rungs, then its winner's continuation
    (``rung`` 1) on the winner's row."""
    spread = 2 if len(table) and any(_rung(row) >= 1 for row in table.to_dict("records")) else 1
    positions: dict[tuple[int, str], tuple[float, float]] = {}
    for g in gens:
        rows = table[table["generation"] == g].reset_index(drop=True)
        later = []
        for i, row in rows.iterrows():
            if _rung(row) >= 1:
                later.append(row)
            else:
                positions[(g, row["candidate_id"])] = (spread * g, -i)
        for row in later:
            parent = positions.get((g, str(row.get("parent_candidate_id"))), (spread * g, -len(rows)))
            positions[(g, row["candidate_id"])] = (spread * g + 1, parent[1])
    return positions


def _rung(row) -> int:
    value = row.get("rung") if hasattr(row, "get") else None
    return -1 if value is None or pd.isna(value) else int(value)


def _rung_label(row) -> str:
    """`` · rung r, N responses`` for a backtest of a run spent in rungs (its charged budget); nothing under flat."""
    rung = _rung(row)
    if rung < 0:
        return ""
    charge = row.get("charge")
    charged = (json.loads(charge) if isinstance(charge, str) else {}).get("charged")
    return f" · rung {rung}" + (f" ({int(charged):,})" if charged else "")


def _lineage_edges(table: pd.DataFrame, positions: dict) -> list:
    """(child, parent position, child position) per backtest: its recorded parent (a population's or PBT's DAG,
    which may skip generations), else, in a lineage written before the parent columns, the previous generation's
    promoted or kept candidate."""
    edges = []
    has_parents = "parent_generation" in table and table["parent_generation"].notna().any()
    for row in table.to_dict("records"):
        child = (row["generation"], row["candidate_id"])
        if has_parents:
            if pd.isna(row.get("parent_generation")):
                continue
            parent = (int(row["parent_generation"]), str(row["parent_candidate_id"]))
        else:
            previous = table[(table["generation"] == row["generation"] - 1) & table["verdict"].isin(["promoted", "kept"])]
            if previous.empty:
                continue
            parent = (row["generation"] - 1, previous["candidate_id"].iloc[0])
        if parent in positions and child in positions:
            edges.append((child, positions[parent], positions[child]))
    return edges


def plot_findings_heatmap(data: RunData) -> bytes:
    findings = data.findings()
    graded = findings[findings["severity"].isin(SEVERITY_LEVEL)] if len(findings) else findings
    if graded.empty:
        fig, ax = plt.subplots(figsize=(4, 1))
        ax.text(0.5, 0.5, "no graded findings", ha="center")
        ax.axis("off")
        return _png(fig)
    grid = graded.pivot_table(index="name", columns="generation", values="severity",
                               aggfunc=lambda s: SEVERITY_LEVEL[s.iloc[0]])
    values = graded.pivot_table(index="name", columns="generation", values="value", aggfunc="first")
    fig, ax = plt.subplots(figsize=(1.3 * grid.shape[1] + 3, 0.38 * grid.shape[0] + 1))
    cmap = matplotlib.colors.ListedColormap(["#c8e6c9", "#ffe082", "#ef9a9a"])
    ax.imshow(grid.to_numpy(dtype=float), cmap=cmap, vmin=0, vmax=2, aspect="auto")
    for (i, j), value in np.ndenumerate(values.to_numpy(dtype=float)):
        if not np.isnan(value):
            ax.text(j, i, f"{value:.3g}", ha="center", va="center", fontsize=7)
    ax.set_xticks(range(grid.shape[1]), [f"gen {g}" for g in grid.columns])
    ax.set_yticks(range(grid.shape[0]), grid.index, fontsize=8)
    ax.set_title("findings: green ok, amber warn, red critical (cell: value)", fontsize=9)
    return _png(fig)


# the arms of a run's test section, and what each fixed-recipe arm's budget was (stages.summary.FIXED_ARMS)
TEST_ARMS = ("evolved", "baseline_search", "baseline_matched", "baseline")
TEST_LABELS = {"evolved": "evolved (the returned policy)", "baseline_matched": "fixed recipe, equal charged responses",
               "baseline_search": "fixed recipe, the whole search's budget", "baseline": "fixed recipe, equal steps"}


def primary_arm(data: RunData) -> str | None:
    """The fixed-recipe arm the report compares with first: the whole search's charge (what a user with the same
    compute would otherwise run) where the run has it, else equal charged responses, else equal steps."""
    return next((arm for arm in ("baseline_search", "baseline_matched", "baseline") if arm in data.tests), None)


def test_difference(data: RunData, arm: str | None = "baseline") -> dict | None:
    """Paired bootstrap (scipy) over test prompts of evolved minus the fixed-recipe ``arm``'s correctness."""
    if arm is None:
        return None
    a, b = data.layout.test_rollouts("evolved"), data.layout.test_rollouts(arm)
    if not (a.exists() and b.exists()):
        return None
    from scipy.stats import bootstrap

    ev = pd.read_parquet(a, columns=["prompt_id", "correct"]).set_index("prompt_id")["correct"]
    bl = pd.read_parquet(b, columns=["prompt_id", "correct"]).set_index("prompt_id")["correct"]
    ev, bl = ev.groupby(level=0).mean(), bl.groupby(level=0).mean()
    common = ev.index.intersection(bl.index)
    x, y = ev.loc[common].to_numpy(float), bl.loc[common].to_numpy(float)
    result = bootstrap((x, y), lambda p, q, axis=-1: p.mean(axis=axis) - q.mean(axis=axis), paired=True,
                       n_resamples=2000, confidence_level=0.95, random_state=0, vectorized=True)
    return {"arm": arm, "label": TEST_LABELS[arm], "difference": float(x.mean() - y.mean()),
            "ci_low": float(result.confidence_interval.low), "ci_high": float(result.confidence_interval.high),
            "prompts": int(len(common))}


TEST_COLOURS = {"evolved": "#2e7d32", "baseline_matched": "#8d6e63", "baseline_search": "#f9a825", "baseline": "#ef6c00"}


def plot_test(data: RunData, diff: dict | None) -> bytes:
    """Every arm's test accuracy, each bar named with the compute the ledger charged it."""
    arms = [arm for arm in TEST_ARMS if arm in data.tests]
    fig, ax = plt.subplots(figsize=(1.6 * len(arms) + 2.5, 3.8))
    unit = data.ledger.get("unit", "responses")
    for i, arm in enumerate(arms):
        metrics = data.tests[arm]
        err = 1.96 * (metrics.get("test_stderr") or 0.0)
        ax.bar(i, metrics["test_accuracy"], yerr=err, color=TEST_COLOURS[arm], capsize=6, alpha=0.85)
        ax.text(i, metrics["test_accuracy"] + err + 0.01, f"{metrics['test_accuracy']:.3f}", ha="center", fontsize=9)
    labels = [TEST_LABELS[arm].replace(", ", ",\n") + (f"\ncharged {data.charged(arm):,} {unit}"
                                                        if data.charged(arm) is not None else "") for arm in arms]
    ax.set_xticks(range(len(arms)), labels, fontsize=7)
    ax.set_ylabel("test accuracy (greedy)")
    if diff:
        ax.set_title(f"evolved - {diff['label']}: {diff['difference']:+.3f}, 95% CI [{diff['ci_low']:+.3f}, "
                     f"{diff['ci_high']:+.3f}] (test prompts only)", fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return _png(fig)


COMPUTE_COLUMNS = {"optimizer_steps": "optimizer steps", "sampled_responses": "sampled responses",
                   "generated_tokens": "generated tokens", "trained_tokens": "trained tokens",
                   "train_wall_s": "train wall s", "train_cpu_s": "train CPU s"}


def compute_per_arm(data: RunData) -> pd.DataFrame:
    """What each arm cost (from the lineage's per-backtest records and the baseline's metrics), beside the
    accuracy it bought: the promoted path (backtests whose policies were carried on), the whole search
    (every backtest: candidates, controls, extra seeds) and the baseline."""
    arms = (lineage_contract.arm_compute(data.lineage, data.baseline, data.matched, data.whole)
            if len(data.lineage) else {})
    accuracy = {"promoted_path": (data.evolved_test or {}).get("test_accuracy"), "whole_search": None,
                "baseline": (data.baseline_test or {}).get("test_accuracy"),
                "baseline_matched": (data.matched_test or {}).get("test_accuracy"),
                "baseline_search": (data.tests.get("baseline_search") or {}).get("test_accuracy")}
    charged = {"promoted_path": data.charged("evolved"), "whole_search": (data.ledger.get("search") or {}).get("charged"),
               **{arm: data.charged(arm) for arm in ("baseline", "baseline_matched", "baseline_search")}}
    rows = [{"arm": arm.replace("_", " "), "test accuracy": accuracy.get(arm), "charged": charged.get(arm),
             **{label: cost.get(key) for key, label in COMPUTE_COLUMNS.items()}} for arm, cost in arms.items()]
    return pd.DataFrame(rows)


def plot_compute(table: pd.DataFrame) -> bytes:
    fig, ax = plt.subplots(figsize=(6, 3.2))
    if len(table):
        colours = ["#2e7d32", "#9e9e9e", "#ef6c00", "#8d6e63", "#f9a825"][: len(table)]
        ax.barh(table["arm"], table["sampled responses"], color=colours, alpha=0.85)
        for i, row in enumerate(table.to_dict("records")):
            acc, sampled = row["test accuracy"], int(row["sampled responses"])
            label = (f"{sampled:,} responses" + (f" (charged {int(row['charged']):,})" if row["charged"] == row["charged"]
                                                and row["charged"] is not None else "")
                     + (f" · test {acc:.3f}" if acc is not None and acc == acc else ""))
            ax.text(sampled, i, " " + label, va="center", fontsize=8)
        ax.set_xlim(0, table["sampled responses"].max() * 1.6 or 1)
    ax.set_xlabel("sampled responses (training)")
    ax.set_title("compute per arm, with the test accuracy it bought", fontsize=9)
    return _png(fig)


def _gain_interval(selection: dict) -> str:
    interval = (selection.get("intervals") or {}).get(selection["promoted"]) or selection.get("promoted_gain_interval")
    if not interval:
        return ""
    return f"[{interval['ci_low']:+.3f}, {interval['ci_high']:+.3f}]"


def _noise(selection: dict) -> float | None:
    """The median half-width of the candidates' paired-bootstrap gain intervals: the val noise of this generation."""
    widths = [(i["ci_high"] - i["ci_low"]) / 2 for i in (selection.get("intervals") or {}).values()]
    return float(np.median(widths)) if widths else None


def _table(frame: pd.DataFrame) -> str:
    return frame.to_html(index=False, escape=True, border=0, classes="t", na_rep="", float_format=lambda v: f"{v:.3f}")


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}"/>'


def _test_note(diff: dict | None) -> str:
    if not diff:
        return "No fixed-recipe arm in this run."
    return (f"Evolved against the {diff['label']} (<code>{diff['arm']}</code>): paired bootstrap over "
            f"{diff['prompts']} test prompts (scipy.stats.bootstrap, 2000 resamples): "
            f"difference {diff['difference']:+.3f}, 95% CI [{diff['ci_low']:+.3f}, {diff['ci_high']:+.3f}]. This interval "
            "covers test-set sampling only, not seed-to-seed variation; the headline experiment measures that.")


def build(run_dir: str | Path, out_html: str | Path, figures_dir: str | Path | None = None) -> dict[str, bytes]:
    data = RunData(Path(run_dir))
    diff = test_difference(data, primary_arm(data))
    figures = {
        "val_per_generation": plot_val_per_generation(data),
        "training_curves": plot_training_curves(data),
        "lineage_tree": plot_lineage_tree(data),
        "findings_heatmap": plot_findings_heatmap(data),
        "test_accuracy": plot_test(data, diff),
    }
    compute = compute_per_arm(data)
    figures["compute_per_arm"] = plot_compute(compute)
    if figures_dir:
        for name, png in figures.items():
            with atomic_path(Path(figures_dir) / f"{name}.png") as tmp:
                tmp.write_bytes(png)
    lineage_cols = ["generation", "candidate_id", "rung", "intervention", "hypothesis", "val_accuracy",
                    "delta_vs_control", "verdict", "failure_label"]
    agent = agent_calls.summarize(data.dir)  # every gen<g>/candidates/agent_calls.parquet
    if agent["calls"]:
        agent_html = (f"<p>{agent['calls']} API call(s) ({html.escape(', '.join(agent['models']))}), "
                      f"{agent['failed_calls']} failed; {agent['input_tokens'] + agent['cache_read_tokens'] + agent['cache_creation_tokens']}"
                      f" input and {agent['output_tokens']} output tokens; estimated cost ${agent['cost_usd']:.4f}.</p>"
                      + _table(agent_calls.summary_table(agent)))
    else:
        agent_html = "<p>The agent made no API calls in this run (the offline <code>heuristic</code> agent): no agent cost.</p>"
    gens = pd.DataFrame([{**{k: s[k] for k in ("generation", "promoted", "intervention", "control_val_accuracy",
                                                 "promoted_val_accuracy", "gain_vs_control")},
                          "gain 95% interval": _gain_interval(s), "val noise (±)": _noise(s), "reason": s["reason"]}
                         for s in data.selections])
    test_table = pd.DataFrame([{"arm": arm, "what": TEST_LABELS[arm], "charged": data.charged(arm),
                                **{k: data.tests[arm].get(k) for k in ("test_accuracy", "test_stderr", "test_prompts")}}
                               for arm in TEST_ARMS if arm in data.tests])
    run_name = html.escape(data.dir.name)
    body = f"""<!doctype html><html><head><meta charset="utf-8"><title>EvoTrainer report: {run_name}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}}
h2{{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}} img{{max-width:100%}}
table.t{{border-collapse:collapse;font-size:12px}} table.t td,table.t th{{border:1px solid #ddd;padding:3px 6px;vertical-align:top}}
.note{{color:#555;font-size:13px}}</style></head><body>
<h1>EvoTrainer report — run <code>{run_name}</code></h1>
<p class="note">SFT warm start: val accuracy {data.init.get('val_accuracy', float('nan')):.3f}. Generations: {len(data.selections)}.
Candidates backtested: {len(data.lineage)}.</p>
<h2 id="val-per-generation">Val accuracy per generation</h2>{_img(figures['val_per_generation'], 'val accuracy per generation')}
{_table(gens) if len(gens) else ''}
<h2 id="training-curves">Training curves across generations</h2>{_img(figures['training_curves'], 'training curves')}
<h2 id="lineage">Lineage</h2>{_img(figures['lineage_tree'], 'lineage tree')}
{_table(data.lineage[lineage_cols]) if len(data.lineage) else '<p>empty</p>'}
<h2 id="findings">Findings (diagnostic × generation)</h2>{_img(figures['findings_heatmap'], 'findings heatmap')}
<h2 id="test">Final test score: evolved vs the fixed recipe</h2>{_img(figures['test_accuracy'], 'test accuracy')}
{_table(test_table)}
<p class="note">{_test_note(diff)}</p>
<h2 id="compute">Compute per arm</h2>{_img(figures['compute_per_arm'], 'compute per arm')}
{_table(compute) if len(compute) else '<p>no compute records</p>'}
<p class="note">Training compute summed from every backtest's <code>compute</code> record (lineage) and the fixed-recipe
arms' metrics; evaluation (val/test scoring) is not included. <b>charged</b>: what the compute ledger charged
(docs/compute-ledger.md): every backtest slot its full budget, failed and rejected ones included. The promoted path is what the evolved policy was trained
with; the whole search adds every candidate, control and extra seed that was backtested. Compare arms at equal
compute before reading a gain: "val noise (±)" above is the median half-width of the generation's paired-bootstrap
gain intervals over (seed, val prompt).</p>
<h2 id="agent-cost">Agent cost</h2>{agent_html}
</body></html>
"""
    write_text(out_html, body)
    return figures
