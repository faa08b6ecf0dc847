"""Stage `skills` (after select): turn the generation's verified outcomes into skill records, in the
run's own store (results/<run>/skills/, with skills.parquet) and in the cross-run library.

gen<g>/skills.json lists what this generation contributed; it is the rule's output, so a rerun of
the generation's select reruns this stage, which replaces (never duplicates) the generation's outcomes.
"""

from __future__ import annotations

from pathlib import Path

from evotrainer.atomic import read_json, write_json
from evotrainer.contracts import skill as skills
from evotrainer.layout import RunLayout
from evotrainer.stages.common import config


def run(config_path: str, run_dir: str, selection: str, diagnosis: str, candidates_dir: str, out: str,
        generation: int) -> None:
    cfg = config(config_path)
    domain = skills.domain_of(cfg.task)
    outcomes = []
    if cfg.skills.enabled:
        outcomes = skills.outcomes_of_generation(read_json(selection), read_json(diagnosis), candidates_dir, domain,
                                                 run_dir, cfg.skills.fail_margin)
    own = RunLayout(run_dir).skills
    touched = skills.update(own, run_dir, generation, outcomes)
    skills.write_outcomes_table(own)
    library = Path(skills.library_dir(cfg))
    touched_library = skills.update(library, run_dir, generation, outcomes) if cfg.skills.enabled else []
    write_json(out, {
        "run": cfg.run,
        "generation": generation,
        "domain": domain,
        "enabled": bool(cfg.skills.enabled),
        "library": str(library),
        "outcomes": [{k: o[k] for k in ("skill_id", "intervention", "candidate_id", "verdict", "gain", "ci_low", "ci_high")}
                     for o in outcomes],
        "skills": [{"skill_id": s["skill_id"], "verdict": s["verdict"], "status": s["status"], "domains": s["domains"]}
                   for s in touched_library or touched],
    })
