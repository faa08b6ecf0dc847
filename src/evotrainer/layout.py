"""The run layout: every file and folder of ``results/<run>/``, named once.

Every path a stage, a command, the report or a Snakemake rule reads or writes under a run directory comes
from here: ``RunLayout(root)`` (root = ``results/<run>``) has one method or property per file or folder,
``layout.gen(g)`` one per file of generation g, ``layout.gen(g).backtest(cid)`` (and ``layout.baseline(arm)``,
which holds the same files) one per file of a training run. ``RunLayout.parse(path)`` goes the other way:
a path back to its run root, generation and candidate (instead of ``Path(p).parents[1]``).

The relative templates below (``TEMPLATES``) are the only definition of the layout. The same templates are
the Snakemake patterns of the rules (``layout.pattern.backtest_metrics`` is
``"results/{run}/gen{g}/backtest/{cid}/metrics.json"`` for ``RunLayout(Path("results/{run}"))``; wildcards
keep their names: ``{run}``, ``{g}``, ``{cid}``, ``{arm}``, ``{stage}``) and the globs of the readers
(``layout.glob("rollouts")`` is ``"gen*/rollouts.parquet"``).

Standard library only: this module is the bottom layer (stages, commands, the report and the workflow
import it; it imports nothing of evotrainer).

path under results/<run>/                            what it is (written by)
---------------------------------------------------  ---------------------------------------------------------
config.yaml                                          the resolved run config (the workflow, when jobs start)
config_history.jsonl                                 allowed config changes under existing outputs (evotrainer.provenance)
data/{split}.parquet                                 train/val/probe splits (data); test (heldout, after the loop)
init/sft_log.parquet, init/metrics.json              the SFT warm start (init; share_init for a search arm)
gen{g}/policy/, gen{g}/harness/                      what generation g starts from (init for g=0, else promote)
gen{g}/parent_train_log.parquet                      the promoted backtest's train log (promote, g >= 1)
gen{g}/rollouts.parquet, gen{g}/turns.parquet        evidence sampled on the probe split (rollout)
gen{g}/rollout.json                                  whose reward scored the evidence; a promoted reward's failure (rollout)
gen{g}/diagnostics.parquet, diagnosis.json, .md      findings, signature, readable report (diagnose)
gen{g}/candidates/{cid}/harness.diff, proposal.json  one candidate (propose; control = empty diff)
gen{g}/candidates/agent_calls.parquet, narrative.md  the agent's API calls and narrative (propose)
gen{g}/replay/{cid}.json                             the candidate's replay on the cached rollouts (replay)
gen{g}/backtest/{cid}/                               one training run (backtest): the files below
gen{g}/second_rung.json                              who trained a second rung, and for how much (second_rung)
gen{g}/selection.json, gen{g}/lineage.parquet        what was promoted; the generation's lineage rows (select)
gen{g}/skills.json                                   what the generation taught the skill stores (skills)
gen{g}/approvals/{stage}.json                        the pass record of the approval after a stage (approval)
{arm}/ (baseline, baseline_matched, baseline_search, baseline_reference)  the fixed-recipe arms' training runs: the files below
tune_then_train/                                     the tune_then_train arm's final training run (tune)
tune/{cid}/candidate/, tune/{cid}/backtest/          its trials: the recipe asked, its backtest (tune)
tune/study.json                                      its trials' outcomes and the best one (tune)
eval/{arm}/test_metrics.json, test_rollouts.parquet  an arm's test scores (evaluate; arm evolved and warm_start too)
eval/{arm}/test_rollouts_turns.parquet               multi-turn tasks' per-turn test rows (evaluate)
lineage.parquet                                      every candidate of the run (lineage)
summary.json, summary.md                             the run's result (summary)
report.html, report/{figure}.png                     the run's report and its figures (report)
skills/, skill_library/                              the run's skill store; a headline seed's own library
approvals/decisions.jsonl, approvals/abort.json      every approval decision; the abort
approvals/gen{g}_{stage}.json                        the latest decision per approval
approvals/pending/gen{g}_{stage}.json                an approval waiting for a person
logs/{job}.log, logs/gen{g}/{job}.log                the jobs' logs
benchmarks/{job}.tsv, benchmarks/gen{g}/{job}.tsv    the jobs' Snakemake benchmarks
headline.json, headline.png, headline.log            the headline comparison (in results/<run>-headline)
flaws/{flaw}/outcome.json, harness/, reference/      one flaw of the flaws suite: its outcome, flawed and shipped harness
flaws.json, flaws.md, flaws.png                      the flaws suite's table (stages/flaws.py, docs/flaws.md)

One training run (``gen{g}/backtest/{cid}/`` or a baseline arm ``{arm}/``): ``metrics.json`` (written last),
``policy/``, ``harness/``, ``train_log.parquet``, ``{split}_rollouts.parquet`` (val), ``{split}_turns.parquet``,
``exit_rollouts.parquet``, ``exit_turns.parquet``, ``train_job.json``, ``train_result.json``, ``progress.json``,
``train.log``, and ``seed{s}/`` with the same files for the extra training seeds (``rung2/``: a slot's second rung).

Runs of the headline experiment: ``<run>-seed<s>`` (``seed_run``), their search arms ``<run>-seed<s>-<arm>``
(``arm_run``), the comparison in ``<run>-headline`` (``headline_run``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

GENERATION = "gen{g}"  # a generation's folder
# beside the runs, in the results folder itself: the split secret all its runs share (evotrainer.split_secret;
# never inside a run folder, never handed to a sandbox)
SPLIT_SECRET = ".evotrainer/split_secret"

# the files of one training run (a backtest or a baseline arm), relative to its folder
TRAINING_RUN: dict[str, str] = {
    "metrics": "metrics.json",
    "policy": "policy",
    "harness": "harness",
    "train_log": "train_log.parquet",
    "val_rollouts": "val_rollouts.parquet",
    "split_rollouts": "{split}_rollouts.parquet",
    "split_turns": "{split}_turns.parquet",
    "exit_rollouts": "exit_rollouts.parquet",
    "exit_turns": "exit_turns.parquet",
    "seed": "seed{s}",
    "second_rung": "rung2",  # search.second_rung: the slot's second rung (a training run of its own)
    "train_job": "train_job.json",
    "train_result": "train_result.json",
    "progress": "progress.json",
    "train_text_log": "train.log",
}
AGENT_CALLS = "agent_calls.parquet"  # in gen{g}/candidates/
NARRATIVE = "narrative.md"  # in gen{g}/candidates/

# name -> path under results/<run>/ ({g} generation, {cid} candidate, {arm} arm, {stage} approval stage,
# {split} data split, {job} a job's log name, {figure} a report figure)
TEMPLATES: dict[str, str] = {
    "config": "config.yaml",
    "config_history": "config_history.jsonl",
    "data": "data",
    "split": "data/{split}.parquet",
    "init": "init",
    "init_sft_log": "init/sft_log.parquet",
    "init_metrics": "init/metrics.json",
    # one generation
    "gen": GENERATION,
    "policy": f"{GENERATION}/policy",
    "harness": f"{GENERATION}/harness",
    "parent_train_log": f"{GENERATION}/parent_train_log.parquet",
    "rollouts": f"{GENERATION}/rollouts.parquet",
    "turns": f"{GENERATION}/turns.parquet",
    "rollout_record": f"{GENERATION}/rollout.json",
    "diagnostics": f"{GENERATION}/diagnostics.parquet",
    "diagnosis": f"{GENERATION}/diagnosis.json",
    "diagnosis_md": f"{GENERATION}/diagnosis.md",
    "candidates": f"{GENERATION}/candidates",
    "agent_calls": f"{GENERATION}/candidates/{AGENT_CALLS}",
    "narrative": f"{GENERATION}/candidates/{NARRATIVE}",
    "candidate": f"{GENERATION}/candidates/{{cid}}",
    "candidate_diff": f"{GENERATION}/candidates/{{cid}}/harness.diff",
    "proposal": f"{GENERATION}/candidates/{{cid}}/proposal.json",
    "replays": f"{GENERATION}/replay",
    "replay": f"{GENERATION}/replay/{{cid}}.json",
    "backtests": f"{GENERATION}/backtest",
    "backtest": f"{GENERATION}/backtest/{{cid}}",
    **{f"backtest_{key}": f"{GENERATION}/backtest/{{cid}}/{rel}" for key, rel in TRAINING_RUN.items()},
    "second_rung_record": f"{GENERATION}/second_rung.json",
    "selection": f"{GENERATION}/selection.json",
    "lineage_part": f"{GENERATION}/lineage.parquet",
    # search.schedule=rungs: the winner's continuation's lineage row (stages/continuation.py)
    "lineage_continue": f"{GENERATION}/lineage_continue.parquet",
    "gen_skills": f"{GENERATION}/skills.json",
    "gen_approvals": f"{GENERATION}/approvals",
    "gen_approval": f"{GENERATION}/approvals/{{stage}}.json",
    # the fixed-recipe arms (baseline, baseline_matched): one training run each
    "baseline": "{arm}",
    **{f"baseline_{key}": f"{{arm}}/{rel}" for key, rel in TRAINING_RUN.items()},
    # the tune_then_train arm's trials (its final training is the arm's folder, "{arm}" above)
    "tune": "tune",
    "tune_study": "tune/study.json",
    "tune_candidate": "tune/{cid}/candidate",
    "tune_backtest": "tune/{cid}/backtest",
    # search.mode=population: the final elite's last backtest again under fresh training seeds (stages.elite)
    "elite": "elite",
    "elite_json": "elite/elite.json",
    "elite_candidate": "elite/candidate",
    "elite_backtest": "elite/backtest",
    # test evaluation of an arm (evolved, baseline, baseline_matched)
    "eval": "eval/{arm}",
    "test_metrics": "eval/{arm}/test_metrics.json",
    "test_rollouts": "eval/{arm}/test_rollouts.parquet",
    "test_turns": "eval/{arm}/test_rollouts_turns.parquet",
    # the whole run
    "lineage": "lineage.parquet",
    "summary": "summary.json",
    "summary_md": "summary.md",
    "report": "report.html",
    "figures": "report",
    "figure": "report/{figure}.png",
    "skills": "skills",
    "skill_library": "skill_library",
    "approvals": "approvals",
    "decisions": "approvals/decisions.jsonl",
    "abort": "approvals/abort.json",
    "approval": f"approvals/{GENERATION}_{{stage}}.json",
    "pending_approvals": "approvals/pending",
    "pending_approval": f"approvals/pending/{GENERATION}_{{stage}}.json",
    "log": "logs/{job}.log",
    "gen_log": f"logs/{GENERATION}/{{job}}.log",
    "benchmark": "benchmarks/{job}.tsv",
    "gen_benchmark": f"benchmarks/{GENERATION}/{{job}}.tsv",
    # the flaws suite (stages/flaws.py): one outcome per flaw folder, then the table
    "flaw": "flaws/{flaw}",
    "flaw_outcome": "flaws/{flaw}/outcome.json",
    "flaws_json": "flaws.json",
    "flaws_md": "flaws.md",
    "flaws_png": "flaws.png",
    # the headline experiment's folder (results/<run>-headline)
    "headline_json": "headline.json",
    "headline_png": "headline.png",
    "headline_log": "headline.log",
}

# what each placeholder matches when a path is parsed back
FIELDS: dict[str, str] = {
    "g": r"\d+",
    "cid": r"[\w-]+",
    "arm": r"evolved|baseline_matched|baseline_search|baseline_reference|baseline|tune_then_train|warm_start",
    "stage": r"diagnosis|propose|backtest|select",
    "split": r"\w+",
    "s": r"\d+",
    "job": r"[^/]+",
    "figure": r"[^/]+",
    "flaw": r"[A-Za-z0-9][A-Za-z0-9_.-]*",
}
_PLACEHOLDER = re.compile(r"\{(\w+)\}")
_GENERATION_DIR = re.compile(r"gen(\d+)")


def fill(template: str, **fields) -> str:
    """``template`` with the given placeholders replaced; the others stay (``{name}``, a wildcard)."""
    return _PLACEHOLDER.sub(lambda m: str(fields[m.group(1)]) if m.group(1) in fields else m.group(0), template)


def generation_dir(g: int) -> str:
    """A generation's folder name (``gen3``); also how a generation is named in messages."""
    return fill(GENERATION, g=int(g))


# ---------------------------------------------------------------------------------------------- run names
def seed_run(run: str, seed: int) -> str:
    """The headline experiment's run of ``run`` under seed ``seed``."""
    return f"{run}-seed{seed}"


def arm_run(seed_run_name: str, arm: str) -> str:
    """A headline search arm (search_control, random) of one seed's run."""
    return f"{seed_run_name}-{arm}"


def headline_run(run: str) -> str:
    """The folder of the headline comparison of ``run``'s seeds."""
    return f"{run}-headline"


# ---------------------------------------------------------------------------------------------- layouts
class _Entry:
    """One file or folder of a layout as an attribute: ``layout.rollouts`` is ``layout._at("rollouts")``."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __get__(self, layout, owner=None):
        return self if layout is None else layout._at(self.key)


@dataclass(frozen=True)
class TrainingRunLayout:
    """One training run's folder: ``gen{g}/backtest/{cid}/``, a baseline arm's ``{arm}/``, or a ``seed{s}/``
    inside either (the extra training seeds)."""

    dir: Path

    def _at(self, key: str, **fields) -> Path:
        return self.dir / fill(TRAINING_RUN[key], **fields)

    metrics = _Entry("metrics")
    policy = _Entry("policy")
    harness = _Entry("harness")
    train_log = _Entry("train_log")
    val_rollouts = _Entry("val_rollouts")

    def rollouts(self, split: str) -> Path:
        """``{split}_rollouts.parquet`` (the evaluation split's rollouts; val in the loop)."""
        return self._at("split_rollouts", split=split)

    def turns(self, split: str) -> Path:
        return self._at("split_turns", split=split)

    exit_rollouts = _Entry("exit_rollouts")
    exit_turns = _Entry("exit_turns")

    def seed(self, index: int) -> TrainingRunLayout:
        """The training run of seed ``index`` (0: this folder itself, else ``seed{index}/``)."""
        return self if int(index) == 0 else TrainingRunLayout(self._at("seed", s=int(index)))

    @property
    def second_rung(self) -> TrainingRunLayout:
        """``rung2/``: a slot's second rung (search.second_rung), trained on from its seed 0's policy."""
        return TrainingRunLayout(self._at("second_rung"))

    train_job = _Entry("train_job")
    train_result = _Entry("train_result")
    progress = _Entry("progress")
    train_text_log = _Entry("train_text_log")


@dataclass(frozen=True)
class CandidateLayout:
    """``gen{g}/candidates/{cid}/``: the candidate's diff and proposal."""

    dir: Path

    @property
    def diff(self) -> Path:
        return self.dir / "harness.diff"

    @property
    def proposal(self) -> Path:
        return self.dir / "proposal.json"


@dataclass(frozen=True)
class GenerationLayout:
    """``gen{g}/`` of one run."""

    run: RunLayout
    g: int

    def _at(self, key: str, **fields) -> Path:
        return self.run.path(key, g=self.g, **fields)

    dir = _Entry("gen")

    @property
    def name(self) -> str:
        return generation_dir(self.g)

    policy = _Entry("policy")
    harness = _Entry("harness")
    parent_train_log = _Entry("parent_train_log")
    rollouts = _Entry("rollouts")
    turns = _Entry("turns")
    rollout_record = _Entry("rollout_record")
    diagnostics = _Entry("diagnostics")
    diagnosis = _Entry("diagnosis")
    diagnosis_md = _Entry("diagnosis_md")
    candidates = _Entry("candidates")
    agent_calls = _Entry("agent_calls")
    narrative = _Entry("narrative")

    def candidate(self, cid: str) -> CandidateLayout:
        return CandidateLayout(self._at("candidate", cid=cid))

    replays = _Entry("replays")

    def replay(self, cid: str) -> Path:
        return self._at("replay", cid=cid)

    backtests = _Entry("backtests")

    def backtest(self, cid: str) -> TrainingRunLayout:
        return TrainingRunLayout(self._at("backtest", cid=cid))

    second_rung_record = _Entry("second_rung_record")
    selection = _Entry("selection")

    @property
    def lineage(self) -> Path:
        """This generation's lineage rows (a part of the run's lineage.parquet)."""
        return self._at("lineage_part")

    @property
    def lineage_continue(self) -> Path:
        """The winner's continuation's lineage row (search.schedule=rungs; a part of the run's lineage.parquet)."""
        return self._at("lineage_continue")

    skills = _Entry("gen_skills")
    approvals = _Entry("gen_approvals")

    def approval(self, stage: str) -> Path:
        """The approval after ``stage`` passed (``gen{g}/approvals/{stage}.json``)."""
        return self._at("gen_approval", stage=stage)

    def log(self, job: str) -> Path:
        return self._at("gen_log", job=job)

    def benchmark(self, job: str) -> Path:
        return self._at("gen_benchmark", job=job)


@dataclass(frozen=True)
class Location:
    """What ``RunLayout.parse`` found: the run, which layout entry (``key`` of TEMPLATES) and its fields.
    ``rest`` is what follows the entry when the path lies inside it (``seed1/val_rollouts.parquet`` for a
    path inside ``gen0/backtest/c1``), else empty."""

    layout: RunLayout
    key: str
    fields: dict[str, str] = field(default_factory=dict)
    rest: str = ""

    @property
    def generation(self) -> int | None:
        return int(self.fields["g"]) if "g" in self.fields else None

    @property
    def candidate(self) -> str | None:
        return self.fields.get("cid")

    @property
    def root(self) -> Path:
        return self.layout.root


class Patterns:
    """The layout as Snakemake patterns: ``patterns.rollouts`` is ``"<root>/gen{g}/rollouts.parquet"``;
    ``patterns("split", split="train")`` fills some placeholders and leaves the others as wildcards."""

    def __init__(self, root: Path):
        self._root = root.as_posix()

    def __call__(self, key: str, **fields) -> str:
        return f"{self._root}/{fill(TEMPLATES[key], **fields)}"

    def __getattr__(self, key: str) -> str:
        if key.startswith("_") or key not in TEMPLATES:
            raise AttributeError(key)
        return self(key)


def _compile(template: str) -> re.Pattern:
    body = "".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>{FIELDS[p]})"
                   for i, p in enumerate(_PLACEHOLDER.split(template)))
    return re.compile(rf"^(?:(?P<root>.*)/)?{body}(?P<rest>/.*)?$")


# most specific first: more literal characters, then fewer placeholders
_PARSERS = sorted(((key, _compile(t)) for key, t in TEMPLATES.items()),
                  key=lambda kt: (-len(_PLACEHOLDER.sub("", TEMPLATES[kt[0]])), len(_PLACEHOLDER.findall(TEMPLATES[kt[0]]))))


@dataclass(frozen=True)
class RunLayout:
    """``results/<run>/``: one method or property per file or folder (see the module's table)."""

    root: Path

    def __post_init__(self):
        object.__setattr__(self, "root", Path(self.root))

    @classmethod
    def at(cls, results_dir: str | Path, run: str) -> RunLayout:
        return cls(Path(results_dir) / run)

    @classmethod
    def of(cls, path: str | Path) -> RunLayout:
        """The layout of the run ``path`` lies in (a path of this layout)."""
        return cls.parse(path).layout

    @classmethod
    def parse(cls, path: str | Path) -> Location:
        """Which file of which run ``path`` is: its run root, layout entry, generation and candidate. A path
        inside an entry (``gen0/backtest/c1/seed1/...``) gives that entry with the ``rest``; an exact entry
        wins over an enclosing one. Raises ValueError for a path that is not in a run layout. (A run named like a
        generation folder, ``gen<N>``, makes its run-level files ambiguous: ``gen5/lineage.parquet`` parses as
        generation 5's lineage part.)"""
        text = Path(path).as_posix()
        found = None
        for key, regex in _PARSERS:
            match = regex.match(text)
            if match and not match.group("rest"):
                found = (key, match)
                break
            if match and found is None:
                found = (key, match)
        if found is None:
            raise ValueError(f"{path}: not a path of a run's layout (results/<run>/...)")
        key, match = found
        fields = {k: v for k, v in match.groupdict().items() if k not in ("root", "rest") and v is not None}
        return Location(cls(Path(match.group("root") or ".")), key, fields, (match.group("rest") or "").lstrip("/"))

    # -- generic access by entry name (the templates)
    def path(self, key: str, **fields) -> Path:
        """The path of layout entry ``key`` (a TEMPLATES name) with every placeholder given."""
        rel = self.relative(key, **fields)
        if _PLACEHOLDER.search(rel):
            raise ValueError(f"layout entry {key!r} ({TEMPLATES[key]}) needs {_PLACEHOLDER.findall(rel)}")
        return self.root / rel

    _at = path  # what the entries (_Entry) call

    @staticmethod
    def relative(key: str, **fields) -> str:
        """Entry ``key`` relative to the run folder, placeholders not given kept as ``{name}``."""
        return fill(TEMPLATES[key], **fields)

    @staticmethod
    def glob(key: str, **fields) -> str:
        """Entry ``key`` as a glob relative to the run folder: placeholders not given match anything."""
        return _PLACEHOLDER.sub("*", fill(TEMPLATES[key], **fields))

    def find(self, key: str, **fields) -> list[Path]:
        """The existing paths of entry ``key`` (placeholders not given: any), in path order."""
        return sorted(self.root.glob(self.glob(key, **fields)))

    @property
    def pattern(self) -> Patterns:
        """The layout as Snakemake patterns under this root (``RunLayout(Path("results/{run}")).pattern``)."""
        return Patterns(self.root)

    def generations(self) -> list[int]:
        """The generations that have a folder, in order."""
        found = (_GENERATION_DIR.fullmatch(p.name) for p in self.root.glob(self.glob("gen")) if p.is_dir())
        return sorted(int(m.group(1)) for m in found if m)

    # -- the run's files
    config = _Entry("config")
    config_history = _Entry("config_history")
    data = _Entry("data")

    def split(self, name: str) -> Path:
        return self.path("split", split=name)

    init = _Entry("init")
    init_sft_log = _Entry("init_sft_log")
    init_metrics = _Entry("init_metrics")

    def gen(self, g: int) -> GenerationLayout:
        return GenerationLayout(self, int(g))

    def baseline(self, arm: str = "baseline") -> TrainingRunLayout:
        """A fixed-recipe arm's training run (``baseline`` or ``baseline_matched``)."""
        return TrainingRunLayout(self.path("baseline", arm=arm))

    tune_study = _Entry("tune_study")

    def tune_candidate(self, cid: str) -> Path:
        """A tune_then_train trial's candidate folder (harness.diff, proposal.json)."""
        return self.path("tune_candidate", cid=cid)

    def tune_backtest(self, cid: str) -> TrainingRunLayout:
        """A tune_then_train trial's backtest from the generation-0 policy."""
        return TrainingRunLayout(self.path("tune_backtest", cid=cid))

    elite_json = _Entry("elite_json")
    elite_candidate = _Entry("elite_candidate")

    @property
    def elite_backtest(self) -> TrainingRunLayout:
        """search.mode=population: the final elite's last backtest again, under fresh training seeds."""
        return TrainingRunLayout(self.path("elite_backtest"))

    def eval(self, arm: str) -> Path:
        return self.path("eval", arm=arm)

    def test_metrics(self, arm: str) -> Path:
        return self.path("test_metrics", arm=arm)

    def test_rollouts(self, arm: str) -> Path:
        return self.path("test_rollouts", arm=arm)

    def test_turns(self, arm: str) -> Path:
        return self.path("test_turns", arm=arm)

    lineage = _Entry("lineage")
    summary = _Entry("summary")
    summary_md = _Entry("summary_md")
    report = _Entry("report")
    figures = _Entry("figures")

    def figure(self, name: str) -> Path:
        return self.path("figure", figure=name)

    skills = _Entry("skills")
    skill_library = _Entry("skill_library")
    approvals = _Entry("approvals")
    decisions = _Entry("decisions")
    abort = _Entry("abort")

    def approval(self, g: int, stage: str) -> Path:
        return self.path("approval", g=int(g), stage=stage)

    pending_approvals = _Entry("pending_approvals")

    def pending_approval(self, g: int, stage: str) -> Path:
        return self.path("pending_approval", g=int(g), stage=stage)

    def log(self, job: str) -> Path:
        return self.path("log", job=job)

    def benchmark(self, job: str) -> Path:
        return self.path("benchmark", job=job)

    headline_json = _Entry("headline_json")
    headline_png = _Entry("headline_png")
    headline_log = _Entry("headline_log")
    flaws_json = _Entry("flaws_json")
    flaws_md = _Entry("flaws_md")
    flaws_png = _Entry("flaws_png")

    def flaw_outcome(self, flaw: str) -> Path:
        return self.path("flaw_outcome", flaw=flaw)
