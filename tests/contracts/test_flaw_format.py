"""The flaw format (contracts/flaw.py): what loads, and every malformed folder fails alone with its label."""

from __future__ import annotations

import pytest

from evotrainer.contracts.flaw import FlawError, flaw_folders, load_flaw

pytestmark = pytest.mark.fast

DIFF = "--- a/recipe.yaml\n+++ b/recipe.yaml\n@@ -1 +1 @@\n-lr: 2.0e-4\n+lr: 2.0e-3\n"


def flaw(tmp_path, name="f1", spec="task: arithmetic\n", diff=DIFF):
    folder = tmp_path / name
    folder.mkdir(parents=True)
    if spec is not None:
        (folder / "flaw.yaml").write_text(spec)
    if diff is not None:
        (folder / "flaw.diff").write_text(diff)
    return folder


def test_a_flaw_loads_with_its_overrides_in_either_spelling(tmp_path):
    one = load_flaw(flaw(tmp_path, "a", "experiment: code_quick\nknob_fixable: true\ndescription: lr off\n"
                                         "overrides: {search.generations: 4, harness.recipe.lr: 1.0e-3}\n"))
    assert one.experiment == "code_quick" and one.knob_fixable and one.description == "lr off"
    assert one.head_overrides() == ["experiment=code_quick"]
    assert one.overrides == {"search.generations": 4, "harness.recipe.lr": 1.0e-3}
    two = load_flaw(flaw(tmp_path, "b", "task: arithmetic\noverrides: ['search.generations=4', 'agent.name=tpe']\n"))
    assert two.head_overrides() == ["task=arithmetic"]
    assert two.overrides == {"search.generations": 4, "agent.name": "tpe"}


@pytest.mark.parametrize("spec, diff, label, words", [
    (None, DIFF, "flaw_invalid", "missing"),
    ("task: arithmetic\n", None, "flaw_diff_invalid", "missing"),
    ("task: arithmetic\n", "  \n", "flaw_diff_invalid", "empty"),
    ("[not: a mapping", DIFF, "flaw_invalid", "not YAML"),
    ("- a list\n", DIFF, "flaw_invalid", "mapping"),
    ("knob_fixable: false\n", DIFF, "flaw_invalid", "name the task"),
    ("task: arithmetic\ncolour: red\n", DIFF, "flaw_invalid", "unknown keys"),
    ("task: 'arith; rm -rf /'\n", DIFF, "flaw_invalid", "must be a name"),
    ("task: arithmetic\nknob_fixable: maybe\n", DIFF, "flaw_invalid", "true or false"),
    ("task: arithmetic\ndescription: |\n  two\n  lines\n", DIFF, "flaw_invalid", "one line"),
    ("task: arithmetic\noverrides: {run: other}\n", DIFF, "flaw_invalid", "set by the flaws runner"),
    ("task: arithmetic\noverrides: {harness.initial: /etc}\n", DIFF, "flaw_invalid", "set by the flaws runner"),
    ("task: arithmetic\noverrides: {flaws.seeds: 9}\n", DIFF, "flaw_invalid", "set by the flaws runner"),
    ("task: arithmetic\noverrides: {'a b': 1}\n", DIFF, "flaw_invalid", "not a dotted config key"),
    ("task: arithmetic\noverrides: {search: {generations: 2}}\n", DIFF, "flaw_invalid", "dotted"),
    ("task: arithmetic\noverrides: [generations]\n", DIFF, "flaw_invalid", "key=value"),
])
def test_a_malformed_flaw_fails_with_its_label(tmp_path, spec, diff, label, words):
    with pytest.raises(FlawError) as err:
        load_flaw(flaw(tmp_path, spec=spec, diff=diff))
    assert err.value.label == label and words in str(err.value)


def test_names_that_cannot_name_a_run_and_oversized_or_linked_files_fail(tmp_path):
    with pytest.raises(FlawError, match="flaw folder name"):
        load_flaw(flaw(tmp_path, "bad name"))
    big = flaw(tmp_path, "big", diff=DIFF + "+" * (1024 * 1024 + 1))
    with pytest.raises(FlawError, match="larger than") as err:
        load_flaw(big)
    assert err.value.label == "flaw_diff_invalid"
    linked = flaw(tmp_path, "linked", diff=None)
    (linked / "flaw.diff").symlink_to("/etc/passwd")
    with pytest.raises(FlawError, match="missing"):
        load_flaw(linked)


def test_the_folders_of_a_suite_and_only(tmp_path):
    for name in ("b", "a"):
        flaw(tmp_path, name)
    (tmp_path / "notes").mkdir()  # no flaw.yaml or flaw.diff: not a flaw
    assert flaw_folders(tmp_path) == ["a", "b"]
    assert flaw_folders(tmp_path, ["b"]) == ["b"]
    with pytest.raises(FlawError, match=r"\['c'\]"):
        flaw_folders(tmp_path, ["b", "c"])
