import pytest

from evotrainer.agents.base import ProposalContext
from evotrainer.agents.heuristic import CATALOGUE, HeuristicAgent, unified_diff
from evotrainer.contracts import lineage
from evotrainer.contracts.candidate import CandidateError, apply_diff, touched_files
from evotrainer.contracts.harness import DEFAULT_HARNESS, HarnessError, check_recipe, harness_id, load_recipe
from evotrainer.sandbox.candidate_check import check_harness, validate


def recipe_diff(harness, old: str, new: str) -> str:
    text = (harness / "recipe.yaml").read_text()
    assert old in text
    return unified_diff("recipe.yaml", text, text.replace(old, new))


@pytest.mark.fast
def test_default_harness_passes_its_own_checks(harness, monkeypatch):
    check_harness(DEFAULT_HARNESS)
    monkeypatch.chdir(harness.parent)
    check_harness("harness")  # a relative path, as users write harness.initial
    assert load_recipe(DEFAULT_HARNESS)["group_size"] == 8


@pytest.mark.fast
def test_recipe_errors_name_the_key_and_the_fix():
    recipe = load_recipe(DEFAULT_HARNESS)
    with pytest.raises(HarnessError, match=r"'lr' = 5.0 is outside its range \[1e-07, 0.01\]"):
        check_recipe(recipe | {"lr": 5.0})
    with pytest.raises(HarnessError, match=r"unknown key\(s\) \['learning_rate'\]"):
        check_recipe(recipe | {"learning_rate": 1e-4})
    with pytest.raises(HarnessError, match=r"'loss_agg' = 'mean' is not allowed; choose one of"):
        check_recipe(recipe | {"loss_agg": "mean"})
    with pytest.raises(HarnessError, match="must be a number"):
        check_recipe(recipe | {"clip_high": "abc"})
    assert check_recipe(recipe | {"lr": "1e-4"})["lr"] == 1e-4  # YAML 1.1 reads 1e-4 as a string


@pytest.mark.fast
def test_a_valid_diff_applies_strictly(harness, tmp_path):
    diff = recipe_diff(harness, "dynamic_sampling: false", "dynamic_sampling: true")
    assert validate(harness, diff)["ok"]
    applied = apply_diff(harness, diff, tmp_path / "applied")
    assert load_recipe(applied)["dynamic_sampling"] is True
    assert harness_id(applied) != harness_id(harness)


@pytest.mark.fast
@pytest.mark.parametrize(
    ("make_diff", "label"),
    [
        (lambda h: "I think you should lower the learning rate.", "invalid_diff"),
        (lambda h: recipe_diff(h, "lr: 2.0e-4", "lr: 9.0").replace("lr: 2.0e-4", "lr: 3.0e-4"), "invalid_diff"),
        (lambda h: recipe_diff(h, "lr: 2.0e-4", "lr: 5.0"), "schema_violation"),
        (lambda h: recipe_diff(h, "loss_agg: token-mean", "loss_agg: sum"), "schema_violation"),
        (lambda h: recipe_diff(h, "lr: 2.0e-4", "lr: [oops"), "parse_error"),
        (lambda h: "--- a/../../etc/passwd\n+++ b/../../etc/passwd\n@@ -1 +1 @@\n-x\n+y\n", "forbidden_path"),
        (lambda h: "--- a/setup.py\n+++ b/setup.py\n@@ -1 +1 @@\n-x\n+y\n", "forbidden_path"),
        (lambda h: "--- /dev/null\n+++ b/evil.py\n@@ -0,0 +1 @@\n+import os\n", "forbidden_path"),
        (lambda h: unified_diff("reward.py", (h / "reward.py").read_text(),
                                (h / "reward.py").read_text().replace("def compute_score(", "def compute_score((")),
         "syntax_error"),
        (lambda h: unified_diff("reward.py", (h / "reward.py").read_text(),
                                "import no_such_module_here\n" + (h / "reward.py").read_text()), "import_error"),
        (lambda h: unified_diff("reward.py", (h / "reward.py").read_text(),
                                (h / "reward.py").read_text().replace("def compute_score(", "def score_it(")),
         "import_error"),
        (lambda h: "--- a/recipe.yaml\n+++ b/recipe.yaml\n@@ -1 +1 @@\n-\udcff\n+x\n", "invalid_diff"),
    ],
    ids=["prose", "context-mismatch", "lr-out-of-range", "unknown-choice", "broken-yaml", "path-escape",
         "non-harness-file", "new-file", "syntax-error", "import-error", "missing-entry-point", "non-utf8"],
)
def test_bad_diffs_fail_with_their_label(harness, make_diff, label):
    result = validate(harness, make_diff(harness))
    assert not result["ok"]
    assert result["failure_label"] == label, result["error"]
    assert (harness / "recipe.yaml").read_text() == (DEFAULT_HARNESS / "recipe.yaml").read_text()  # untouched



def _git_section(harness, section: str) -> str:
    """A valid recipe.yaml hunk, then a ``diff --git`` section without ---/+++ headers (git applies both)."""
    return recipe_diff(harness, "dynamic_sampling: false", "dynamic_sampling: true") + section


@pytest.mark.fast
@pytest.mark.parametrize("section", [
    "diff --git a/notes b/notes\nnew file mode 120000\n@@ -0,0 +1 @@\n+/etc/passwd\n\\ No newline at end of file\n",
    "diff --git a/sitecustomize.py b/sitecustomize.py\nnew file mode 100644\n@@ -0,0 +1 @@\n+import os\n",
    "diff --git a/reward.py b/moved.py\nsimilarity index 100%\nrename from reward.py\nrename to moved.py\n",
    "diff --git a/reward.py b/reward.py\nold mode 100644\nnew mode 100755\n",
    "diff --git a/reward.py b/reward.py\ndeleted file mode 100644\n",
], ids=["new-symlink", "new-file", "rename", "mode-change", "delete"])
def test_git_sections_that_add_rename_or_retype_files_are_forbidden(harness, section):
    result = validate(harness, _git_section(harness, section))
    assert (result["ok"], result["failure_label"]) == (False, "forbidden_path"), result["error"]


@pytest.mark.fast
def test_a_git_section_naming_a_file_outside_the_harness_is_forbidden(harness):
    section = "diff --git a/setup.py b/setup.py\n@@ -1 +1 @@\n-x\n+y\n"
    assert validate(harness, _git_section(harness, section))["failure_label"] == "forbidden_path"


@pytest.mark.fast
def test_whatever_git_applied_a_harness_with_a_link_or_an_extra_file_is_refused(harness, tmp_path):
    from evotrainer.contracts.candidate import _check_same_files

    for name, make in {"notes": lambda p: p.symlink_to("/etc/passwd"), "extra.py": lambda p: p.write_text("x")}.items():
        applied = tmp_path / name / "harness"
        apply_diff(harness, "", applied)
        _check_same_files(harness, applied)  # a plain copy passes
        make(applied / name)
        with pytest.raises(CandidateError, match=name) as err:
            _check_same_files(harness, applied)
        assert err.value.label == "forbidden_path"


@pytest.mark.fast
@pytest.mark.parametrize(("value", "label"), [
    ("[" + ", ".join(["&a0 [1, 1, 1, 1, 1, 1, 1, 1, 1]"] + [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]"
                                                             for i in range(1, 10)]) + "]", "parse_error"),
    ("[" * 5000 + "]" * 5000, "parse_error"),
    ("9" * 4000, "schema_violation"),
    ("[" + ", ".join(["[1, 2, 3, 4, 5, 6]"] * 400) + "]", "schema_violation"),
], ids=["alias-bomb", "deep-nesting", "huge-int", "wide-list"])
def test_hostile_recipe_values_fail_fast_with_a_short_message(harness, value, label):
    import time

    (harness / "recipe.yaml").write_text((harness / "recipe.yaml").read_text().replace("lr: 2.0e-4", f"lr: {value}"))
    started = time.monotonic()
    with pytest.raises(HarnessError) as err:
        load_recipe(harness)
    assert err.value.label == label
    assert len(str(err.value)) < 1000 and time.monotonic() - started < 10


# tier 2: three sandboxed import probes (~4 s on 2 cores)
def test_the_backtest_does_not_repeat_the_import_probe_of_the_harness_propose_validated(harness, tmp_path):
    diff = recipe_diff(harness, "dynamic_sampling: false", "dynamic_sampling: true")
    validation = validate(harness, diff)
    applied = apply_diff(harness, diff, tmp_path / "applied")
    assert validation["ok"] and validation["harness_id"] == harness_id(applied)
    # the files still hash to what was probed: the (sandboxed, costly) import probe is skipped ...
    (applied / "reward.py").write_text("raise RuntimeError('import-time failure')\n")
    with pytest.raises(CandidateError) as err:  # ... but an edited file no longer matches: probed, and fails
        check_harness(applied, probed_id=validation["harness_id"])
    assert err.value.label == "import_error"
    check_harness(applied, probed_id=harness_id(applied))  # what a recorded id of these very files skips


@pytest.mark.fast
def test_a_hanging_import_is_a_sandbox_timeout(harness, tmp_path):
    diff = unified_diff("curriculum.py", (harness / "curriculum.py").read_text(),
                        "while True:\n    pass\n" + (harness / "curriculum.py").read_text())
    applied = apply_diff(harness, diff, tmp_path / "applied")
    with pytest.raises(CandidateError) as err:
        check_harness(applied, import_timeout_s=2)
    assert err.value.label == "sandbox_timeout"


@pytest.mark.fast
def test_touched_files_lists_harness_files():
    diff = "--- a/recipe.yaml\n+++ b/recipe.yaml\n@@ -1 +1 @@\n-a\n+b\n"
    assert touched_files(diff) == ["recipe.yaml"]


def _context(harness, findings, lineage_frame=None):
    return ProposalContext(generation=0, harness_dir=harness, harness_id=harness_id(harness), findings=findings,
                           lineage=lineage.empty() if lineage_frame is None else lineage_frame)


def _finding(name, severity):
    return {"name": name, "severity": severity, "value": 0.9, "threshold": 0.4}


def test_every_catalogue_intervention_is_a_valid_single_file_diff(harness):
    agent = HeuristicAgent()
    proposals = agent.propose(_context(harness, []), k=len(CATALOGUE))
    assert len(proposals) == len(CATALOGUE)
    for proposal in proposals:
        result = validate(harness, proposal.diff)
        assert result["ok"], (proposal.intervention, result)
        assert len(result["files"]) == 1


@pytest.mark.fast
def test_heuristic_agent_ranks_interventions_by_findings(harness):
    agent = HeuristicAgent()
    dead = agent.propose(_context(harness, [_finding("dead_group_ratio", "critical")]), k=2)
    assert dead[0].intervention == "dynamic_sampling" and "dead_group_ratio" in dead[0].targeted_findings
    trunc = agent.propose(_context(harness, [_finding("truncation_rate", "critical")]), k=1)
    assert trunc[0].intervention == "overlong_shaping"


@pytest.mark.fast
def test_heuristic_agent_does_not_repeat_a_tried_diff(harness):
    import pandas as pd

    from evotrainer.runtime import diff_hash

    agent = HeuristicAgent()
    first = agent.propose(_context(harness, [_finding("dead_group_ratio", "critical")]), k=1)[0]
    tried = pd.DataFrame({"parent_harness_id": [harness_id(harness)], "diff_hash": [diff_hash(first.diff)]})
    again = agent.propose(_context(harness, [_finding("dead_group_ratio", "critical")], tried), k=1)[0]
    assert again.intervention != first.intervention


@pytest.mark.fast
def test_every_listed_failure_label_is_emitted_by_some_code_path():
    """The lineage's label list holds no label that nothing emits (every label appears in code besides the list)."""
    import re
    from pathlib import Path

    from evotrainer.contracts.lineage import FAILURE_LABELS

    src = Path(__file__).resolve().parents[2] / "src" / "evotrainer"
    code = "\n".join(p.read_text(encoding="utf-8") for p in src.rglob("*.py") if p.name != "lineage.py")
    for label in FAILURE_LABELS:
        name = label.removeprefix("vetoed:")
        assert re.search(rf"[\"']{re.escape(name)}[\"']|\b{re.escape(name.upper())}\b|gate\(\"{re.escape(name)}\"", code) \
            or f'"{name}"' in code or f"'{name}'" in code, f"{label} is listed but never emitted"


def test_the_baseline_agents_propose_valid_arms(harness):
    from evotrainer.agents import make_agent
    from evotrainer.config import compose

    control = make_agent(compose(["agent.name=search_control"]).agent).propose(_context(harness, []), k=3)
    assert [(p.diff, p.seed_offset) for p in control] == [("", 1), ("", 2), ("", 3)]
    agent = make_agent(compose(["agent.name=random"]).agent)
    proposals = agent.propose(_context(harness, []), k=4)
    assert len(proposals) == 4 and len({p.diff for p in proposals}) == 4
    assert [p.diff for p in agent.propose(_context(harness, []), k=4)] == [p.diff for p in proposals]  # reproducible
    for p in proposals:
        result = validate(harness, p.diff)
        assert result["ok"] and result["files"] == ["recipe.yaml"], (p.intervention, result["error"])
        changed = [line for line in p.diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
        assert len(changed) == 1 and changed[0][1:].split(":")[0] == p.intervention.split(":")[1]  # one knob
