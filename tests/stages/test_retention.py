"""Retention of trained policies (search.retention, stages/select.retain): with `needed`, once select has
promoted, the policies no later stage reads go (the candidates not promoted, every extra training seed's),
each leaving a marker, and the generation's retention.json says what was freed and kept; with `all`
(the default) nothing is touched. On a generation folder laid out as the backtest stage writes it, and through
select.run on the session's real backtests (the ``backtests`` fixture)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from evotrainer.config import compose
from evotrainer.layout import RunLayout
from evotrainer.stages import select

CANDIDATES = ("control", "c1", "c2", "d_diag")  # d_diag: a diagnostics-only candidate, never trained


def _cfg(retention: str, seeds: int = 2):
    """The run config with search.retention and search.seeds (a plain copy, whatever the schema holds)."""
    cfg = OmegaConf.create(OmegaConf.to_container(compose(["experiment=quick"]), resolve=True))
    cfg.search.retention, cfg.search.seeds = retention, seeds
    return cfg


def _generation(root: Path, seeds: int = 2) -> RunLayout:
    """gen0 of a run: every trained candidate has a policy per seed (a few KB of 'weights'), its harness and
    metrics; the diagnostics-only candidate has metrics only."""
    run = RunLayout(root / "results" / "r")
    for cid in CANDIDATES:
        folder = run.gen(0).backtest(cid)
        folder.dir.mkdir(parents=True)
        folder.metrics.write_text(json.dumps({"status": "registered" if cid == "d_diag" else "ok", "seeds": seeds}))
        if cid == "d_diag":
            continue
        (folder.harness).mkdir()
        (folder.harness / "recipe.yaml").write_text("lr: 1.0e-4\n")
        for s in range(seeds):
            policy = folder.seed(s).policy
            policy.mkdir(parents=True)
            (policy / "model.safetensors").write_bytes(b"\0" * 20_000)
            (policy / "config.json").write_text("{}")
    return run


def _retain(cfg, run: RunLayout, promoted: str, seeds: int = 2):
    return select.retain(cfg, run.gen(0).backtests, promoted, 0, record=run.gen(0).selection.with_name("retention.json"),
                         seeds={cid: seeds for cid in CANDIDATES})


@pytest.mark.fast
def test_needed_keeps_the_promoted_policy_only_and_records_what_went(tmp_path):
    run = _generation(tmp_path)
    summary = _retain(_cfg("needed"), run, "c1")
    gen = run.gen(0)
    assert gen.backtest("c1").policy.is_dir()  # promote copies it into gen1/policy
    for gone in (gen.backtest("c1").seed(1), gen.backtest("control"), gen.backtest("control").seed(1),
                 gen.backtest("c2"), gen.backtest("c2").seed(1)):
        assert not gone.policy.exists(), gone.dir
        marker = json.loads(gone.policy.with_name(select.DELETED_MARKER).read_text())
        assert marker["deleted_by"] == "search.retention=needed" and marker["bytes"] >= 20_000
    for kept in CANDIDATES[:3]:  # what the gates, reports and the diagnostics backtest read stays
        assert gen.backtest(kept).metrics.exists() and (gen.backtest(kept).harness / "recipe.yaml").exists()
    record = json.loads(gen.selection.with_name("retention.json").read_text())
    assert record == summary
    assert sorted(e["path"] for e in record["deleted"]) == [
        "c1/seed1/policy", "c2/policy", "c2/seed1/policy", "control/policy", "control/seed1/policy"]
    assert [k["path"] for k in record["kept"]] == ["c1/policy"]
    assert record["freed_bytes"] == sum(e["bytes"] for e in record["deleted"]) >= 5 * 20_000
    assert record["failed"] == []
    # a rerun of select (e.g. --forcerun select) deletes nothing more and still lists what went
    again = _retain(_cfg("needed"), run, "c1")
    assert sorted(e["path"] for e in again["deleted"]) == sorted(e["path"] for e in record["deleted"])
    assert gen.backtest("c1").policy.is_dir()


@pytest.mark.fast
def test_control_kept_when_nothing_beats_it(tmp_path):
    run = _generation(tmp_path, seeds=1)
    _retain(_cfg("needed", seeds=1), run, "control", seeds=1)
    gen = run.gen(0)
    assert gen.backtest("control").policy.is_dir()
    assert not gen.backtest("c1").policy.exists() and not gen.backtest("c2").policy.exists()


@pytest.mark.fast
def test_all_keeps_everything_and_writes_no_record(tmp_path):
    run = _generation(tmp_path)
    assert _retain(_cfg("all"), run, "c1") is None
    assert all(run.gen(0).backtest(c).seed(s).policy.is_dir() for c in CANDIDATES[:3] for s in range(2))
    assert not run.gen(0).selection.with_name("retention.json").exists()
    from evotrainer.config import ConfigError

    with pytest.raises(ConfigError, match=r"search.retention"):  # a typo fails when the config is composed
        compose(["search.retention=some"])


@pytest.mark.fast
def test_the_default_config_keeps_everything():
    assert compose(["experiment=quick"]).search.retention == "all"
    assert compose(["experiment=quick", "search.retention=needed"]).search.retention == "needed"


def test_select_applies_retention_after_writing_its_selection(backtests, tmp_path):
    """select.run on real backtests (the control, a good change and the planted hacks): the selection and lineage
    are written as ever, then only the promoted candidate's policy is left."""
    import shutil

    from evotrainer.config import to_yaml
    from evotrainer.contracts.harness import DEFAULT_HARNESS

    source = next(iter(backtests.values())).parent
    gen = tmp_path / "gen0"
    shutil.copytree(source, gen / "backtest")  # the session's backtests stay as they are for other tests
    shutil.copytree(source.parent / "candidates", gen / "candidates")
    for proposal in (gen / "candidates").glob("*/proposal.json"):  # what propose adds to the fixture's proposals
        written = json.loads(proposal.read_text())
        proposal.write_text(json.dumps({"intervention": proposal.parent.name, "hypothesis": "", "targeted_findings": [],
                                        "signature": []} | written))
    conf = tmp_path / "config.yaml"
    conf.write_text(to_yaml(compose(["experiment=quick", "search.retention=needed"])))
    select.run(str(conf), str(gen / "candidates"), str(gen / "backtest"), str(DEFAULT_HARNESS), str(gen / "selection.json"),
               str(gen / "lineage.parquet"), generation=0)
    promoted = json.loads((gen / "selection.json").read_text())["promoted"]
    assert (gen / "lineage.parquet").exists()
    assert sorted(p.parent.name for p in (gen / "backtest").glob("*/policy")) == [promoted]
    record = json.loads((gen / select.RETENTION_RECORD).read_text())
    trained = sorted(p.parent.name for p in source.glob("*/policy"))
    assert sorted(e["path"] for e in record["deleted"]) == [f"{c}/policy" for c in trained if c != promoted]
    assert record["freed_bytes"] > 0 and record["promoted"] == promoted
