"""What counts as a repair (stages/flaws_repairs.py): a final harness that restores a flawed file to its shipped
text, up to formatting, or reaches for the package's harnesses, does not."""

from __future__ import annotations

import pytest

from evotrainer.contracts.flaw import Flaw
from evotrainer.stages.flaws_repairs import same_up_to_formatting, shipped_contact

pytestmark = pytest.mark.fast

SHIPPED = '"""Reward."""\nimport re\n\n_ANSWER = re.compile(r"^(-?\\d+)$")\n\n\ndef compute_score(d, s, g, e=None):\n    return 1.0\n'
DIFF = "--- a/reward.py\n+++ b/reward.py\n@@ -1 +1 @@\n-x\n+y\n"


def harness(folder, reward: str, recipe: str = "lr: 2.0e-4\n"):
    folder.mkdir(parents=True)
    (folder / "reward.py").write_text(reward)
    (folder / "recipe.yaml").write_text(recipe)
    return folder


def test_formatting_does_not_hide_a_restored_file(tmp_path):
    reformatted = "import re\n_ANSWER = re.compile( r'^(-?\\d+)$' )   # put back\ndef compute_score(d, s, g, e=None):\n    '''x'''\n    return 1.0\n"
    a, b = harness(tmp_path / "a", SHIPPED, "lr: 0.0002\n"), harness(tmp_path / "b", reformatted, "# c\nlr: 2.0e-4\n")
    assert same_up_to_formatting(a / "reward.py", b / "reward.py")
    assert same_up_to_formatting(a / "recipe.yaml", b / "recipe.yaml")
    changed = harness(tmp_path / "c", SHIPPED.replace("-?", ""))
    assert not same_up_to_formatting(a / "reward.py", changed / "reward.py")


def test_shipped_contact_names_restored_and_reaching_files(tmp_path):
    reference = harness(tmp_path / "reference", SHIPPED)
    flaw = Flaw(name="f", folder=tmp_path, diff=DIFF)
    restored = harness(tmp_path / "restored", SHIPPED)
    assert shipped_contact(restored, flaw, reference) == (["reward.py"], [])
    repaired = harness(tmp_path / "repaired", SHIPPED.replace("return 1.0", "return 0.5 + 0.5"))
    assert shipped_contact(repaired, flaw, reference) == ([], [])
    reaching = harness(tmp_path / "reaching", "from evotrainer.tasks.harnesses.default import reward\n"
                                              "compute_score = reward.compute_score\n")
    assert shipped_contact(reaching, flaw, reference) == ([], ["reward.py"])
    by_name = harness(tmp_path / "by_name", "import importlib\ncompute_score = importlib.import_module('x').f\n")
    assert shipped_contact(by_name, flaw, reference)[1] == ["reward.py"]
    docstring_only = harness(tmp_path / "doc", '"""Unlike evotrainer\'s shipped reward."""\ndef compute_score(*a):\n    return 0.0\n')
    assert shipped_contact(docstring_only, flaw, reference) == ([], [])


def test_code_the_starting_harness_already_had_is_not_the_loops_reach(tmp_path):
    # measured: the shipped code harness's diagnostics.py imports evotrainer.contracts.harness, so every loop on a
    # code flaw was refused as "reaches a shipped file" for a line it never wrote
    reference = harness(tmp_path / "reference", SHIPPED)
    flaw = Flaw(name="f", folder=tmp_path, diff=DIFF)
    shipped_import = "from evotrainer.contracts.harness import load_module\n\n\ndef diagnose(ev):\n    return []\n"
    start = harness(tmp_path / "start", SHIPPED.replace("return 1.0", "return 2.0"))
    (start / "diagnostics.py").write_text(shipped_import)
    repaired = harness(tmp_path / "repaired", SHIPPED.replace("return 1.0", "return 0.5 + 0.5"))
    (repaired / "diagnostics.py").write_text(shipped_import)
    assert shipped_contact(repaired, flaw, reference, start=start) == ([], [])
    # a reaching line the loop added, in the same file or another, still counts
    (repaired / "diagnostics.py").write_text(shipped_import + "from evotrainer.tasks.harnesses.code import diagnostics\n")
    assert shipped_contact(repaired, flaw, reference, start=start) == ([], ["diagnostics.py"])
    # a new use of a name the shipped import binds is a reach too
    (repaired / "diagnostics.py").write_text(shipped_import + "SHIPPED = load_module('/x', 'reward')\n")
    assert shipped_contact(repaired, flaw, reference, start=start) == ([], ["diagnostics.py"])
    (repaired / "diagnostics.py").write_text(shipped_import)
    (repaired / "reward.py").write_text("import importlib\ncompute_score = importlib.import_module('x').f\n")
    assert shipped_contact(repaired, flaw, reference, start=start) == ([], ["reward.py"])
    # without a start, every reaching line counts, as before
    assert shipped_contact(repaired, flaw, reference)[1] == ["diagnostics.py", "reward.py"]


@pytest.mark.parametrize("reward", [
    "from diagnostics import load_module\nSHIPPED = load_module('/x', 'reward')\n",
    "from diagnostics import load_module as lm\nSHIPPED = lm('/x', 'reward')\n",
    "import diagnostics\nSHIPPED = diagnostics.load_module('/x', 'reward')\n",
    "import diagnostics as d\nSHIPPED = d.load_module('/x', 'reward')\n",
    "from diagnostics import *\nSHIPPED = load_module('/x', 'reward')\n",
    # two hops: helpers.py re-exports what diagnostics.py imported from the package
    "from helpers import grab\nSHIPPED = grab('/x', 'reward')\n",
    # what a sibling built from the package: a function that calls it, a value it returned
    "from helpers import fetch\nSHIPPED = fetch()\n",
    "from helpers import LOADED\ncompute_score = LOADED.compute_score\n",
])
def test_a_name_the_package_bound_in_a_sibling_file_reaches_through_it(tmp_path, reward):
    reference = harness(tmp_path / "reference", SHIPPED)
    flaw = Flaw(name="f", folder=tmp_path, diff=DIFF)
    shipped_import = "from evotrainer.contracts.harness import load_module\n\n\ndef diagnose(ev):\n    return []\n"
    start = harness(tmp_path / "start", SHIPPED.replace("return 1.0", "return 2.0"))
    (start / "diagnostics.py").write_text(shipped_import)
    repaired = harness(tmp_path / "repaired", reward)
    (repaired / "diagnostics.py").write_text(shipped_import)
    (repaired / "helpers.py").write_text("from diagnostics import load_module as grab\n\n\ndef fetch():\n"
                                         "    return grab('/x', 'reward')\n\n\nLOADED = fetch()\n")
    reaching = shipped_contact(repaired, flaw, reference, start=start)[1]
    assert "reward.py" in reaching
    # a sibling import of a name the package never bound is no reach
    (repaired / "reward.py").write_text("from diagnostics import diagnose\nSEEN = diagnose([])\n")
    (repaired / "helpers.py").unlink()
    assert shipped_contact(repaired, flaw, reference, start=start)[1] == []


def test_a_diagnostic_the_loop_adds_with_the_shipped_code_harness_helpers_is_its_own(tmp_path):
    """The shipped code harness builds its diagnostics' helpers from the default harness's (``_generic``,
    ``_finding``): a finding the loop adds with them reads no shipped file the flaw changed."""
    import shutil

    from evotrainer.stages.flaws_repairs import reaching_files
    from evotrainer.tasks import load

    start = load("code").default_harness()
    final = tmp_path / "final"
    shutil.copytree(start, final, ignore=shutil.ignore_patterns("__pycache__"))
    with (final / "diagnostics.py").open("a") as out:
        out.write("\n\ndef extra_findings(ev):\n    rows = _rows(ev)\n"
                  "    return [_finding('errors_paid', 0.0, 'ok', str(len(rows)), COLUMNS)]\n")
    assert reaching_files(final, start) == []
    with (final / "reward.py").open("a") as out:
        out.write("\nfrom diagnostics import _generic\nSHIPPED_REWARD = _generic\n")
    assert reaching_files(final, start) == ["reward.py"]


def test_an_outcome_written_under_the_old_rule_is_counted_again_from_its_loop_run(tmp_path):
    from evotrainer.layout import RunLayout
    from evotrainer.stages.flaws_repairs import recount_reaches

    loop = RunLayout(tmp_path / "results" / "r")
    shipped_import = "from evotrainer.contracts.harness import load_module\n"
    for g, reward in ((0, SHIPPED), (1, SHIPPED.replace("return 1.0", "return 0.5 + 0.5"))):
        folder = harness(loop.gen(g).harness, reward)
        (folder / "diagnostics.py").write_text(shipped_import)
    old = {"restored_shipped": [], "reaches_shipped": ["diagnostics.py"], "repair_counts": False, "repairs": [1]}
    assert recount_reaches(loop, old) == old | {"reaches_shipped": [], "repair_counts": True}
    restored = old | {"restored_shipped": ["reward.py"]}
    assert recount_reaches(loop, restored)["repair_counts"] is False
    assert recount_reaches(RunLayout(tmp_path / "gone"), old) == old  # the run is gone: the outcome stands


def _diff(file: str, added: str) -> str:
    return f"--- a/{file}\n+++ b/{file}\n@@ -1 +1,2 @@\n x\n+{added}\n"


def test_a_repair_is_a_reward_curriculum_or_environment_change_with_a_measured_effect():
    from evotrainer.stages.flaws_repairs import classify

    verdict = _diff("reward.py", 'ok = (extra_info or {}).get("verification", {}).get("correct")')
    assert classify(verdict, {"rows": 256, "reward_rows_changed": 31}) == {
        "kind": "reward", "effect": "31 of 256 cached rows rescored otherwise than the parent",
        "verifier_fallback": True}
    own_logic = classify(_diff("reward.py", "score = 1.0 if value == truth else 0.0"), {"rows": 9, "reward_rows_changed": 2})
    assert own_logic["kind"] == "reward" and not own_logic["verifier_fallback"]
    # a reward edit that scores every cached row as the parent did is no repair; a knob move is listed apart
    assert classify(_diff("reward.py", "pass"), {"rows": 9, "reward_rows_changed": 0})["kind"] == "other"
    assert classify(_diff("reward.py", "pass"), None)["effect"] == "no replay on record"
    assert classify(_diff("recipe.yaml", "lr: 1.0e-4"), {"reward_rows_changed": 0})["kind"] == "knob"
    assert classify(_diff("curriculum.py", "w[:3] = 0"), {"curriculum_weights_changed": 3})["kind"] == "curriculum"
    assert classify(_diff("env.yaml", "max_turns: 6"), None)["kind"] == "environment"
    assert classify(_diff("diagnostics.py", "pass"), {"reward_rows_changed": 0})["kind"] == "other"


def test_the_loops_promoted_changes_are_sorted_into_repairs_knob_moves_and_others(tmp_path):
    import pandas as pd

    from evotrainer.atomic import write_json
    from evotrainer.layout import RunLayout
    from evotrainer.stages.flaws_repairs import loop_repairs

    loop = RunLayout(tmp_path / "loop")
    rows = [(0, "c1", "pay_only_verified", _diff("reward.py", 'extra_info["verification"]["correct"]'), None),
            (1, "c2", "lower_lr", _diff("recipe.yaml", "lr: 1.0e-4"), (0, "c1")),
            (2, "control", "", "", (1, "c2"))]
    loop.root.mkdir(parents=True)
    pd.DataFrame([{"generation": g, "candidate_id": cid, "intervention": name, "diff": diff, "verdict": "promoted",
                   "targeted_findings": ["reward_false_positive_rate"], "hypothesis": "h",
                   "parent_generation": parent[0] if parent else None,
                   "parent_candidate_id": parent[1] if parent else None}
                  for g, cid, name, diff, parent in rows]).to_parquet(loop.lineage)
    write_json(loop.gen(0).replay("c1"), {"rows": 256, "reward_rows_changed": 12})
    out = loop_repairs(loop, Flaw(name="f", folder=tmp_path, diff=DIFF), tmp_path)
    assert [(r["candidate_id"], r["kind"], r["verifier_fallback"]) for r in out["repairs"]] == [("c1", "reward", True)]
    assert [m["intervention"] for m in out["knob_moves"]] == ["lower_lr"] and out["other_changes"] == []


# ---------------------------------------------------------------- a repair that lands on the shipped text
LR_FLAW = "--- a/recipe.yaml\n+++ b/recipe.yaml\n@@ -1 +1 @@\n-lr: 2.0e-4\n+lr: 8.0e-4\n"


def _loop_with_path(tmp_path, path: list[tuple[str, str, str]], final: dict[str, str], tools: list[str] | None = None):
    """A loop whose promoted path is ``path`` ((candidate id, file, hypothesis) per generation) and whose last
    generation's harness holds ``final``; ``tools``: an LLM agent's tool calls in generation 0."""
    import pandas as pd

    from evotrainer.contracts import agent_calls
    from evotrainer.layout import RunLayout

    loop = RunLayout(tmp_path / "loop")
    loop.root.mkdir(parents=True)
    rows, parent = [], None
    for g, (cid, file, hypothesis) in enumerate(path):
        rows.append({"generation": g, "candidate_id": cid, "intervention": cid, "diff": _diff(file, "z"),
                     "verdict": "promoted", "targeted_findings": [] if not hypothesis else ["f"],
                     "hypothesis": hypothesis, "parent_generation": parent[0] if parent else None,
                     "parent_candidate_id": parent[1] if parent else None})
        parent = (g, cid)
    pd.DataFrame(rows).to_parquet(loop.lineage)
    harness(loop.gen(0).harness, SHIPPED.replace("return 1.0", "return 2.0"), "lr: 8.0e-4\n")
    last = loop.gen(len(path)).harness
    last.mkdir(parents=True)
    for name, text in final.items():
        (last / name).write_text(text)
    if tools is not None:
        call = agent_calls.CallRecord(run="r", generation=0, agent="claude", model="m", call_index=0, outcome="ok",
                                      attempts=1, started_at=0.0, latency_s=0.0, request_chars=1, tool_calls=tools)
        loop.gen(0).agent_calls.parent.mkdir(parents=True, exist_ok=True)
        agent_calls.write(loop.gen(0).agent_calls, [call])
    return loop


def test_a_path_that_halves_the_rate_back_to_the_shipped_value_is_the_loops_repair(tmp_path):
    from evotrainer.stages.flaws_repairs import loop_repairs

    reference = harness(tmp_path / "reference", SHIPPED, "lr: 2.0e-4\n")
    flaw = Flaw(name="lr_x4", folder=tmp_path, diff=LR_FLAW)
    halves = [("lower_lr", "recipe.yaml", "val accuracy flat, loss spikes: the rate is too high")] * 2
    out = loop_repairs(_loop_with_path(tmp_path / "a", halves, {"reward.py": SHIPPED, "recipe.yaml": "lr: 0.0002\n"}),
                       flaw, reference)
    assert out["restored_shipped"] == ["recipe.yaml"] and out["provenance"]["blind"] and out["repair_counts"]
    # the same path through an LLM agent whose calls are its read-only tools counts too
    tools = ["read_harness_file", "query_evidence", "read_findings", "submit_candidate"]
    loop = _loop_with_path(tmp_path / "b", halves, {"recipe.yaml": "lr: 2.0e-4\n"}, tools=tools)
    assert loop_repairs(loop, flaw, reference)["repair_counts"]
    # a tool the agent does not have, or a step with no evidence behind it, leaves the shipped text unexplained
    loop = _loop_with_path(tmp_path / "c", halves, {"recipe.yaml": "lr: 2.0e-4\n"}, tools=["read_file"])
    out = loop_repairs(loop, flaw, reference)
    assert out["provenance"]["tools_outside"] == ["read_file"] and not out["repair_counts"]
    bare = [("lower_lr", "recipe.yaml", "")] * 2
    out = loop_repairs(_loop_with_path(tmp_path / "d", bare, {"recipe.yaml": "lr: 2.0e-4\n"}), flaw, reference)
    assert out["provenance"]["without_evidence"] == ["generation 0 lower_lr", "generation 1 lower_lr"] and not out["repair_counts"]


def test_an_exact_one_line_reward_fix_counts_and_an_import_of_the_shipped_reward_does_not(tmp_path):
    from evotrainer.stages.flaws_repairs import loop_repairs

    reference = harness(tmp_path / "reference", SHIPPED)
    flaw = Flaw(name="pays_two", folder=tmp_path, diff="--- a/reward.py\n+++ b/reward.py\n@@ -1 +1 @@\n-x\n+y\n")
    fix = [("fix_return", "reward.py", "the reward pays 2.0 where the verifier pays 1.0")]
    out = loop_repairs(_loop_with_path(tmp_path / "a", fix, {"reward.py": SHIPPED}), flaw, reference)
    assert out["restored_shipped"] == ["reward.py"] and out["repair_counts"]
    reach = {"reward.py": "from evotrainer.tasks.harnesses.default import reward\ncompute_score = reward.compute_score\n"}
    out = loop_repairs(_loop_with_path(tmp_path / "b", fix, reach), flaw, reference)
    assert out["reaches_shipped"] == ["reward.py"] and out["provenance"]["blind"] and not out["repair_counts"]
