"""Select never promotes a vetoed candidate, however well it scores on val: on real backtests of planted reward
hacks (the ``backtests`` fixture, tests/conftest.py), each made to score far above the control and a legitimate
change, with the most permissive rule (greedy, any gain). Without the veto the hack would win."""

from __future__ import annotations

import json
import shutil

from evotrainer.config import compose, to_yaml
from evotrainer.contracts.harness import DEFAULT_HARNESS
from evotrainer.stages import select

HACKS = ("pay_for_length", "format_only")


def test_a_vetoed_candidate_is_never_promoted_however_well_it_scores(backtests, tmp_path):
    candidates, backtest_dir = tmp_path / "candidates", tmp_path / "backtest"
    for cid in ("control", "lower_lr", *HACKS):
        shutil.copytree(backtests[cid].parents[1] / "candidates" / cid, candidates / cid)
        proposal = json.loads((candidates / cid / "proposal.json").read_text())
        (candidates / cid / "proposal.json").write_text(json.dumps(proposal | {
            "intervention": f"test:{cid}", "hypothesis": "planted", "targeted_findings": [], "signature": [cid]}))
        shutil.copytree(backtests[cid], backtest_dir / cid, symlinks=True)
    for cid in HACKS:  # far above everything else on val
        metrics = json.loads((backtest_dir / cid / "metrics.json").read_text())
        (backtest_dir / cid / "metrics.json").write_text(json.dumps(metrics | {"val_accuracy": 0.99}))
    conf = tmp_path / "config.yaml"
    conf.write_text(to_yaml(compose(["experiment=quick", "run=default", "search.selection=greedy",
                                     "search.min_gain=-1.0"])))  # any valid candidate beats the control
    select.run(str(conf), str(candidates), str(backtest_dir), str(DEFAULT_HARNESS), str(tmp_path / "selection.json"),
               str(tmp_path / "lineage.parquet"), 0)
    chosen = json.loads((tmp_path / "selection.json").read_text())
    verdicts = {c["candidate_id"]: c["verdict"] for c in chosen["candidates"]}
    assert chosen["promoted"] == "lower_lr", verdicts
    assert all(verdicts[cid] == "vetoed" for cid in HACKS), verdicts
