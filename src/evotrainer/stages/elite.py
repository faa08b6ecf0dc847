"""Stage `elite` (``search.mode=population``): the final elite re-evaluated on fresh training seeds before it is
reported (docs/population.md).

The run's final policy is its last generation's winner (or control), chosen on val among every candidate the
search compared on the same val prompts: the more candidates, the more its val accuracy flatters it (the
winner's curse). This stage trains the winner's last backtest again, from the same parent policy and under the
same harness change, with training seeds no backtest of the run used (``seed_offset`` FRESH_SEED_OFFSET), and
scores it on val. ``elite/elite.json`` holds the selection's val accuracy, the fresh one and their difference;
the summary sets them beside the test accuracy (the val-test gap). It is a measurement, not a selection: the
final policy stays the one selected, and the re-run's compute is an auxiliary column of the ledger, never
charged to the search (no arm gets a re-run).
"""

from __future__ import annotations

import json
from pathlib import Path

from evotrainer.atomic import atomic_dir, read_json, write_json
from evotrainer.layout import RunLayout

FRESH_SEED_OFFSET = 1000  # training seeds seed_index + 1000 x seeds: beyond every candidate's (search_control: 1..k)


def run(config_path: str, run_dir: str, out: str, steps: int, threads: int = 1) -> None:
    from evotrainer.stages import backtest
    from evotrainer.stages.common import config

    cfg = config(config_path)
    layout = RunLayout(Path(run_dir))
    generation = cfg.search.generations - 1
    selection = read_json(layout.gen(generation).selection)
    cid = str(selection["promoted"])
    gen = layout.gen(generation)
    selected = read_json(gen.backtest(cid).metrics)
    source = gen.candidate(cid)
    proposal = read_json(source.proposal)
    folder = layout.elite_candidate
    with atomic_dir(folder) as tmp:
        (tmp / "harness.diff").write_bytes(source.diff.read_bytes())
        (tmp / "proposal.json").write_text(json.dumps(proposal | {"seed_offset": FRESH_SEED_OFFSET}, indent=2) + "\n",
                                           encoding="utf-8")
    rerun = layout.elite_backtest
    if not rerun.metrics.exists():
        print(f"elite: generation {generation}'s {cid} ({proposal.get('intervention')}) again under fresh training seeds")
        backtest.candidate(config_path, str(gen.policy), str(gen.harness), str(folder), str(layout.data),
                           str(gen.rollouts) if gen.rollouts.exists() else None, str(rerun.dir), generation=generation,
                           steps=steps, threads=threads, seeds=cfg.search.seeds)
    fresh = read_json(rerun.metrics)
    selected_val, fresh_val = selected.get("val_accuracy"), fresh.get("val_accuracy")
    write_json(out, {
        "run": cfg.run, "generation": generation, "candidate_id": cid, "intervention": proposal.get("intervention"),
        "parent": proposal.get("parent"),
        "selection_val_accuracy": selected_val,
        "fresh_val_accuracy": fresh_val if fresh.get("status") == "ok" else None,
        "fresh_status": fresh.get("status"), "fresh_failure_label": fresh.get("failure_label"),
        "winners_curse": (selected_val - fresh_val) if fresh.get("status") == "ok" and selected_val is not None else None,
        "fresh_seed_offset": FRESH_SEED_OFFSET,
        "compute": fresh.get("compute"),  # auxiliary: never charged to the search
        "note": "the final policy is the one selected; this re-run only measures how much its val accuracy was luck",
    })
