"""A job loads its config once: the backtest stage composes and validates it at its entry and hands the object
down to the forked training child and the evaluator (issue: "one typed config object loaded once per job")."""

from __future__ import annotations

import os

import pytest

import evotrainer.backends.local.trainer as local_trainer
import evotrainer.config as config_module
import evotrainer.stages.common as stage_common


@pytest.mark.parametrize("seeds", [1, 2])
def test_a_backtest_job_loads_its_config_once(tmp_path, tiny_policy, splits, monkeypatch, seeds):
    from evotrainer.atomic import write_parquet
    from evotrainer.config import compose, to_yaml
    from evotrainer.contracts.harness import DEFAULT_HARNESS
    from evotrainer.stages import backtest
    from tests.hacks import write_candidate

    conf = tmp_path / "config.yaml"
    conf.write_text(to_yaml(compose(["experiment=quick"])))
    for split in ("train", "val", "probe"):
        write_parquet(tmp_path / "data" / f"{split}.parquet", splits[split])
    loads = tmp_path / "loads.txt"  # a file, so that loads in a forked child count too
    real_load = config_module.load

    def counting_load(path, *args, **kwargs):
        with open(loads, "a") as out:
            out.write(f"{os.getpid()}\n")
        return real_load(path, *args, **kwargs)

    for module in (config_module, stage_common, local_trainer):
        monkeypatch.setattr(module, "load_config" if module is not config_module else "load", counting_load)
    folder = write_candidate(tmp_path / "candidates" / "control", "control", "")
    backtest.run(str(conf), str(tiny_policy), str(DEFAULT_HARNESS), str(folder), str(tmp_path / "data"), None,
                 str(tmp_path / "backtest"), generation=0, steps=2, seeds=seeds)
    assert (tmp_path / "backtest" / "metrics.json").exists()
    assert len(loads.read_text().splitlines()) == 1
