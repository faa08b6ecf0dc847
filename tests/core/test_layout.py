"""The run layout (evotrainer.layout): paths and their parse round-trip, the Snakemake patterns, and the rule
that no other module or workflow file builds a generation path by string."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from evotrainer.layout import (
    FIELDS,
    TEMPLATES,
    RunLayout,
    TrainingRunLayout,
    arm_run,
    generation_dir,
    headline_run,
    seed_run,
)

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[2]
SAMPLE = {"g": "3", "cid": "c2", "arm": "baseline_matched", "stage": "backtest", "split": "probe", "s": "1",
          "job": "replay_c2", "figure": "lineage_tree", "flaw": "arith_reward_period"}
ROOTS = [Path("results/r"), Path("/tmp/x/results/run-seed0-random"), Path("results/baseline"), Path("gen")]


def _fields(key: str) -> dict[str, str]:
    return {name: SAMPLE[name] for name in re.findall(r"\{(\w+)\}", TEMPLATES[key])}


@pytest.mark.parametrize("root", ROOTS, ids=str)
@pytest.mark.parametrize("key", sorted(TEMPLATES))
def test_every_entry_parses_back_to_itself(root, key):
    fields = _fields(key)
    path = RunLayout(root).path(key, **fields)
    found = RunLayout.parse(path)
    assert (found.key, found.fields, found.root, found.rest) == (key, fields, root, "")
    assert RunLayout.parse(str(path)).key == key  # a str as well as a Path
    if "g" in fields:
        assert found.generation == int(fields["g"])
    if "cid" in fields:
        assert found.candidate == fields["cid"]


def test_the_typed_accessors_are_the_entries():
    run = RunLayout(Path("results/r"))
    gen = run.gen(3)
    assert gen.dir == Path("results/r/gen3") and gen.name == generation_dir(3) == "gen3"
    pairs = {
        run.config: "results/r/config.yaml", run.split("train"): "results/r/data/train.parquet",
        run.init_metrics: "results/r/init/metrics.json", run.init_sft_log: "results/r/init/sft_log.parquet",
        gen.policy: "results/r/gen3/policy", gen.harness: "results/r/gen3/harness",
        gen.parent_train_log: "results/r/gen3/parent_train_log.parquet", gen.rollouts: "results/r/gen3/rollouts.parquet",
        gen.turns: "results/r/gen3/turns.parquet", gen.diagnostics: "results/r/gen3/diagnostics.parquet",
        gen.diagnosis: "results/r/gen3/diagnosis.json", gen.diagnosis_md: "results/r/gen3/diagnosis.md",
        gen.candidates: "results/r/gen3/candidates", gen.agent_calls: "results/r/gen3/candidates/agent_calls.parquet",
        gen.candidate("c1").diff: "results/r/gen3/candidates/c1/harness.diff",
        gen.candidate("c1").proposal: "results/r/gen3/candidates/c1/proposal.json",
        gen.replay("c1"): "results/r/gen3/replay/c1.json", gen.backtests: "results/r/gen3/backtest",
        gen.backtest("c1").metrics: "results/r/gen3/backtest/c1/metrics.json",
        gen.backtest("c1").policy: "results/r/gen3/backtest/c1/policy",
        gen.backtest("c1").train_log: "results/r/gen3/backtest/c1/train_log.parquet",
        gen.backtest("c1").val_rollouts: "results/r/gen3/backtest/c1/val_rollouts.parquet",
        gen.backtest("c1").exit_rollouts: "results/r/gen3/backtest/c1/exit_rollouts.parquet",
        gen.backtest("c1").seed(2).val_rollouts: "results/r/gen3/backtest/c1/seed2/val_rollouts.parquet",
        gen.selection: "results/r/gen3/selection.json", gen.lineage: "results/r/gen3/lineage.parquet",
        gen.skills: "results/r/gen3/skills.json", gen.approval("select"): "results/r/gen3/approvals/select.json",
        gen.log("rollout"): "results/r/logs/gen3/rollout.log", gen.benchmark("rollout"): "results/r/benchmarks/gen3/rollout.tsv",
        run.baseline().metrics: "results/r/baseline/metrics.json",
        run.baseline("baseline_matched").train_log: "results/r/baseline_matched/train_log.parquet",
        run.test_metrics("evolved"): "results/r/eval/evolved/test_metrics.json",
        run.test_rollouts("baseline"): "results/r/eval/baseline/test_rollouts.parquet",
        run.test_turns("evolved"): "results/r/eval/evolved/test_rollouts_turns.parquet",
        run.lineage: "results/r/lineage.parquet", run.summary: "results/r/summary.json",
        run.report: "results/r/report.html", run.figure("lineage_tree"): "results/r/report/lineage_tree.png",
        run.skills: "results/r/skills", run.approval(1, "select"): "results/r/approvals/gen1_select.json",
        run.pending_approval(1, "select"): "results/r/approvals/pending/gen1_select.json",
        run.abort: "results/r/approvals/abort.json", run.decisions: "results/r/approvals/decisions.jsonl",
        run.log("data"): "results/r/logs/data.log",
    }
    for path, expected in pairs.items():
        assert path == Path(expected)
    assert TrainingRunLayout(Path("x")).seed(0) == TrainingRunLayout(Path("x"))  # seed 0 is the folder itself


def test_patterns_and_globs_come_from_the_same_templates():
    pattern = RunLayout(Path("results/{run}")).pattern
    assert pattern.backtest_metrics == "results/{run}/gen{g}/backtest/{cid}/metrics.json"
    assert pattern.gen_approval == "results/{run}/gen{g}/approvals/{stage}.json"
    assert pattern("split", split="train") == "results/{run}/data/train.parquet"
    assert pattern("policy", g=0) == "results/{run}/gen0/policy"
    assert pattern("gen_log", job="replay_{cid}") == "results/{run}/logs/gen{g}/replay_{cid}.log"
    with pytest.raises(AttributeError):
        _ = pattern.no_such_entry
    assert RunLayout.glob("rollouts") == "gen*/rollouts.parquet"
    assert RunLayout.glob("backtest_train_log") == "gen*/backtest/*/train_log.parquet"
    assert RunLayout.glob("baseline_metrics", arm="baseline") == "baseline/metrics.json"
    with pytest.raises(ValueError, match="needs"):
        RunLayout(Path("results/r")).path("backtest_metrics", g=1)  # no candidate


def test_parse_inside_an_entry_and_outside_any(tmp_path):
    found = RunLayout.parse("results/r/gen1/backtest/control/seed2/val_rollouts.parquet")
    assert (found.root, found.generation, found.candidate) == (Path("results/r"), 1, "control")
    assert (found.key, found.fields["s"], found.rest) == ("backtest_seed", "2", "val_rollouts.parquet")
    assert RunLayout.of("gen0/rollouts.parquet").root == Path(".")
    assert RunLayout.of("results/gen5/gen0/rollouts.parquet").root == Path("results/gen5")  # a run named gen5
    assert RunLayout.of(tmp_path / "r" / "gen0" / "candidates").root == tmp_path / "r"
    with pytest.raises(ValueError, match="not a path of a run"):
        RunLayout.parse(tmp_path / "somewhere" / "else.txt")


def test_generations_are_the_existing_generation_folders(tmp_path):
    run = RunLayout(tmp_path / "r")
    for g in (0, 2, 10):
        run.gen(g).dir.mkdir(parents=True)
    (run.root / "genx").mkdir()
    (run.root / "gen7").write_text("a file, not a generation")
    assert run.generations() == [0, 2, 10]
    run.gen(2).selection.write_text("{}")
    assert run.find("selection") == [run.gen(2).selection]


def test_run_names_of_the_headline_experiment():
    assert seed_run("r", 2) == "r-seed2"
    assert arm_run(seed_run("r", 2), "random") == "r-seed2-random"
    assert headline_run("r") == "r-headline"


def test_the_layout_module_imports_only_the_standard_library():
    tree = ast.parse((REPO / "src" / "evotrainer" / "layout.py").read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"__future__", "re", "dataclasses", "pathlib"}, imported
    assert set(FIELDS) >= {name for t in TEMPLATES.values() for name in re.findall(r"\{(\w+)\}", t)}


# a generation folder built by string: "gen{", "gen%d", "gen" + ..., a literal gen<number> path, a gen* glob
GENERATION_PATH = re.compile(r"""gen\{|gen%d|["']gen["']\s*\+|["'/]gen\d|gen\*""")


def _sources() -> list[Path]:
    files = sorted((REPO / "src").rglob("*.py")) + sorted((REPO / "workflow").rglob("*.smk"))
    return [*files, REPO / "Snakefile"]


def test_no_module_but_the_layout_builds_a_generation_path():
    layout = REPO / "src" / "evotrainer" / "layout.py"
    found = [f"{path.relative_to(REPO)}:{n}: {line.strip()}"
             for path in _sources() if path != layout
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if GENERATION_PATH.search(line)]
    assert found == [], "build these paths with evotrainer.layout.RunLayout:\n" + "\n".join(found)
    assert GENERATION_PATH.search(layout.read_text())  # the scan does see the layout's own templates
