"""Population search (evotrainer.search.population) and the lineage's parent links (contracts.lineage): fitness
capped by the gain interval, the archive of elites, ancestry and the promoted path across generations, the seeded
choice of the next parent and its selection weights, the parts of a diff, and crossover of a verified change
from another branch re-set on the parent's recipe."""

from __future__ import annotations

import math
import re

import pandas as pd
import pytest
import yaml

from evotrainer.contracts import lineage
from evotrainer.contracts.harness import DEFAULT_HARNESS
from evotrainer.contracts.intervention import set_recipe_values, unified_diff
from evotrainer.runtime import diff_hash
from evotrainer.search import population
from evotrainer.search.population import PopulationConf

pytestmark = pytest.mark.fast

NAN = math.nan
RECIPE = (DEFAULT_HARNESS / "recipe.yaml").read_text(encoding="utf-8")


def _recipe_diff(text: str, **changes) -> str:
    return unified_diff("recipe.yaml", text, set_recipe_values(text, changes))


def _row(generation, cid, verdict, val=NAN, *, control=NAN, ci_low=NAN, delta=NAN, parent=None, diff="",
         intervention=None, findings=()):
    return {"run": "r", "generation": generation, "candidate_id": cid, "verdict": verdict, "val_accuracy": val,
            "control_val_accuracy": control, "gain_ci_low": ci_low, "delta_vs_control": delta,
            "parent_generation": parent[0] if parent else None,
            "parent_candidate_id": parent[1] if parent else None,
            "diff": diff, "diff_hash": diff_hash(diff), "intervention": intervention or cid,
            "targeted_findings": list(findings)}


def _table(*rows) -> pd.DataFrame:
    return pd.DataFrame(list(rows)).reindex(columns=lineage.SCHEMA.names)


def _keys(frame: pd.DataFrame) -> list[tuple[int, str]]:
    return [(int(g), str(c)) for g, c in zip(frame["generation"], frame["candidate_id"], strict=True)]


def _patch(text: str, diff: str) -> str | None:
    """``diff`` (one file's unified diff) applied strictly to ``text``, without fuzz; None where a hunk's context
    or removed lines do not match."""
    old, out, pos = text.splitlines(keepends=True), [], 0
    lines = diff.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        header = re.match(r"@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@", lines[i])
        i += 1
        if not header:
            continue
        start = int(header.group(1)) - (0 if header.group(2) == "0" else 1)
        if start < pos:
            return None
        out += old[pos:start]
        pos = start
        while i < len(lines) and not lines[i].startswith("@@"):
            tag, body = lines[i][0], lines[i][1:]
            if tag in " -":
                if pos >= len(old) or old[pos] != body:
                    return None
                pos += 1
                if tag == " ":
                    out.append(body)
            elif tag == "+":
                out.append(body)
            i += 1
    return "".join(out + old[pos:])


# ------------------------------------------------------------------------------------------------ fitness
def test_fitness_caps_a_noisy_candidate_at_its_control_plus_the_interval_low_end():
    noisy = {"candidate_id": "c1", "val_accuracy": 0.70, "control_val_accuracy": 0.50, "gain_ci_low": 0.05}
    assert population.fitness(noisy) == pytest.approx(0.55)
    sure = {"candidate_id": "c2", "val_accuracy": 0.60, "control_val_accuracy": 0.50, "gain_ci_low": 0.2}
    assert population.fitness(sure) == pytest.approx(0.60)  # never above its own val accuracy
    worse = {"candidate_id": "c3", "val_accuracy": 0.52, "control_val_accuracy": 0.50, "gain_ci_low": -0.1}
    assert population.fitness(worse) == pytest.approx(0.40)
    control = {"candidate_id": "control", "val_accuracy": 0.50, "control_val_accuracy": 0.50, "gain_ci_low": -0.1}
    assert population.fitness(control) == pytest.approx(0.50)
    for missing in (NAN, None):  # no interval computed: the val accuracy
        row = {"candidate_id": "c4", "val_accuracy": 0.7, "control_val_accuracy": 0.5, "gain_ci_low": missing}
        assert population.fitness(row) == pytest.approx(0.7)
    assert population.fitness({"candidate_id": "c5", "val_accuracy": 0.7}) == pytest.approx(0.7)


def _generations_0_and_1():
    return _table(
        _row(0, "control", "rejected", 0.50),
        _row(0, "c1", "promoted", 0.70, control=0.5, ci_low=0.05, delta=0.2),  # fitness 0.55
        _row(0, "c2", "rejected", 0.60, control=0.5, ci_low=0.15, delta=0.1),  # fitness 0.60
        _row(0, "c3", "failed"),
        _row(0, "c4", "vetoed", 0.90, control=0.5, ci_low=0.3, delta=0.4),
        _row(0, "c5", "registered", 0.95),
        _row(1, "control", "kept", 0.58, parent=(0, "c1")),
        _row(1, "c1", "rejected", 0.52, control=0.58, ci_low=-0.1, delta=-0.06, parent=(0, "c1")),  # 0.48
    )


def test_the_archive_is_the_fittest_members_and_drops_failed_vetoed_and_dead_ones():
    table = _generations_0_and_1()
    members = population.members(table)
    assert _keys(members) == [(0, "c2"), (1, "control"), (0, "c1"), (0, "control"), (1, "c1")]
    assert list(members["fitness"]) == pytest.approx([0.60, 0.58, 0.55, 0.50, 0.48])
    assert _keys(population.archive(table, 3)) == [(0, "c2"), (1, "control"), (0, "c1")]
    gone = {(0, "c2"), (1, "control")}  # their policies were deleted
    assert _keys(population.archive(table, 3, alive=lambda key: key not in gone)) == \
        [(0, "c1"), (0, "control"), (1, "c1")]
    assert population.archive(table, 8, alive=lambda key: False).empty


def test_members_of_equal_fitness_put_the_later_generation_then_the_candidate_order_first():
    table = _table(_row(0, "c10", "rejected", 0.5), _row(0, "c2", "rejected", 0.5),
                   _row(1, "control", "kept", 0.5, parent=(0, "c2")), _row(0, "control", "kept", 0.5))
    assert _keys(population.members(table)) == [(1, "control"), (0, "control"), (0, "c2"), (0, "c10")]


# ------------------------------------------------------------------------------- ancestry and promoted path
def _branching(parents: bool = True):
    """gen0 c3 is promoted; gen2 starts from it again (skipping gen1), and gen3 from gen2's winner."""
    link = (lambda g, c: (g, c)) if parents else (lambda g, c: None)
    return _table(
        _row(0, "control", "rejected", 0.50),
        _row(0, "c3", "promoted", 0.60, control=0.5, delta=0.1),
        _row(1, "control", "kept", 0.60, parent=link(0, "c3")),
        _row(1, "c1", "rejected", 0.55, parent=link(0, "c3")),
        _row(2, "control", "rejected", 0.60, parent=link(0, "c3")),
        _row(2, "c1", "promoted", 0.65, control=0.6, delta=0.05, parent=link(0, "c3")),
        _row(3, "control", "kept", 0.66, parent=link(2, "c1")),
        _row(3, "c2", "rejected", 0.62, parent=link(2, "c1")),
    )


def test_ancestry_follows_parent_links_across_skipped_generations():
    table = _branching()
    assert lineage.ancestry(table, (2, "control")) == [(0, "c3"), (2, "control")]
    assert lineage.ancestry(table, (3, "c2")) == [(0, "c3"), (2, "c1"), (3, "c2")]
    assert lineage.ancestry(table, (0, "c3")) == [(0, "c3")]
    assert lineage.ancestry(table, (5, "c1")) == []  # not in the table
    orphan = _table(_row(1, "c1", "rejected", 0.5, parent=(0, "c9")))  # its parent is not in the table
    assert lineage.ancestry(orphan, (1, "c1")) == [(1, "c1")]
    assert _keys(population.path_rows(table, (3, "c2"))) == [(0, "c3"), (2, "c1"), (3, "c2")]


def test_the_promoted_path_walks_back_from_the_last_generation_and_skips_unrelated_winners():
    path = lineage.promoted_path(_branching())
    assert _keys(path) == [(0, "c3"), (2, "c1"), (3, "control")]  # gen1's kept control is on another branch


def test_the_promoted_path_falls_back_to_the_verdict_rows_without_parent_columns():
    path = lineage.promoted_path(_branching(parents=False))
    assert _keys(path) == [(0, "c3"), (1, "control"), (2, "c1"), (3, "control")]
    without = _branching().drop(columns=["parent_generation", "parent_candidate_id"])
    assert _keys(lineage.promoted_path(without)) == [(0, "c3"), (1, "control"), (2, "c1"), (3, "control")]


# ----------------------------------------------------------------------------------------- next parent
def _four_alike(best: str | None = None):
    return _table(*[_row(0, cid, "kept" if cid == "control" else "rejected", 0.52 if cid == best else 0.50,
                         diff="" if cid == "control" else _recipe_diff(RECIPE, lr=1e-4 * (i + 1)),
                         intervention=f"lr{i}")
                    for i, cid in enumerate(["control", "c1", "c2", "c3"])])


def test_next_parent_is_seeded_by_run_seed_and_generation():
    table, conf = _four_alike(), PopulationConf(archive_size=8, temperature=1.0)
    first = population.next_parent(table, conf, seed=3, generation=2, fittest=False)
    assert first == population.next_parent(table, conf, seed=3, generation=2, fittest=False)
    assert first["how"] == "drawn from the archive by weight"
    assert sum(m["weight"] for m in first["archive"]) == pytest.approx(1.0, abs=1e-5)
    picked = {population.next_parent(table, conf, seed=seed, generation=2, fittest=False)["candidate_id"]
              for seed in range(12)}
    assert len(picked) >= 2, picked
    by_generation = {population.next_parent(table, conf, seed=3, generation=g, fittest=False)["candidate_id"]
                     for g in range(12)}
    assert len(by_generation) >= 2, by_generation


def test_next_parent_fittest_takes_the_head_of_the_archive():
    table, conf = _four_alike(best="c2"), PopulationConf(archive_size=8, temperature=1.0)
    assert population.archive(table, 8).iloc[0]["candidate_id"] == "c2"
    for seed in range(5):
        chosen = population.next_parent(table, conf, seed=seed, generation=1, fittest=True)
        assert (chosen["generation"], chosen["candidate_id"]) == (0, "c2")
        assert chosen["fitness"] == pytest.approx(0.52) and "fittest" in chosen["how"]


def test_next_parent_is_none_when_no_member_is_alive():
    conf = PopulationConf()
    assert population.next_parent(_four_alike(), conf, seed=0, generation=0, fittest=False,
                                  alive=lambda key: False) is None
    assert population.next_parent(lineage.empty(), conf, seed=0, generation=0, fittest=False) is None


def test_next_parent_is_none_for_a_lineage_without_members():
    table = _table(_row(0, "control", "failed"), _row(0, "c1", "vetoed", 0.9))
    assert population.next_parent(table, PopulationConf(), seed=0, generation=0, fittest=False) is None


# ----------------------------------------------------------------------------------- scores and weights
def _gen0_pair():
    return [_row(0, "control", "kept", 0.5),
            _row(0, "c1", "rejected", 0.5, diff=_recipe_diff(RECIPE, lr=3e-4), intervention="lr up")]


def _weight_of(table, key, alive=lambda key: key[0] == 0):
    elites = population.archive(table, 8, alive)
    scored = population.scores(table, elites)
    weights = population.weights(scored, 0.02)
    index = _keys(scored).index(key)
    return weights[index], scored.iloc[index]


def test_more_children_lower_a_members_weight():
    kids = [_row(1, "control", "rejected", 0.5, parent=(0, "c1")), _row(2, "control", "rejected", 0.5, parent=(0, "c1"))]
    weight = {}
    for n in range(3):
        w, scored = _weight_of(_table(*_gen0_pair(), *kids[:n]), (0, "c1"))
        assert scored["children"] == n and scored["productivity"] == pytest.approx(0.5)  # control kids: untried
        weight[n] = w
    assert weight[0] > weight[1] > weight[2]
    same_generation = _table(*_gen0_pair(), _row(1, "control", "rejected", 0.5, parent=(0, "c1")),
                             _row(1, "c1", "rejected", 0.4, parent=(0, "c1")))
    assert _weight_of(same_generation, (0, "c1"))[1]["children"] == 1  # generations, not rows


@pytest.mark.parametrize(("verdicts", "expected"), [
    ((), 0.5),  # untried: Laplace's 1/2
    (("promoted", "promoted", "rejected"), 3 / 5),
    (("rejected", "failed"), 1 / 4),
])
def test_productivity_is_laplace_smoothed_over_candidate_children(verdicts, expected):
    kids = [_row(1, "control", "kept", 0.5, parent=(0, "c1"))]  # the control is no try
    kids += [_row(1, f"c{i}", verdict, 0.5, parent=(0, "c1")) for i, verdict in enumerate(verdicts, 1)]
    _, scored = _weight_of(_table(*_gen0_pair(), *kids), (0, "c1"))
    assert scored["productivity"] == pytest.approx(expected)


def test_novelty_and_coverage_come_from_the_members_paths():
    table = _table(
        _row(0, "control", "kept", 0.5),
        _row(0, "c1", "rejected", 0.5, diff=_recipe_diff(RECIPE, lr=3e-4), intervention="lr", findings=["f1", "f2"]),
        _row(0, "c2", "rejected", 0.5, diff=_recipe_diff(RECIPE, lr=4e-4), intervention="lr", findings=["f2"]),
        _row(0, "c3", "rejected", 0.5, diff=_recipe_diff(RECIPE, group_size=16), intervention="gs"),
    )
    scored = population.scores(table, population.archive(table, 8)).set_index("candidate_id")
    assert scored.loc["c1", "novelty"] == pytest.approx(0.0)  # c2's path made the same intervention
    assert scored.loc["c3", "novelty"] == pytest.approx(1.0)
    assert scored.loc["c1", "coverage"] == pytest.approx(0.5)  # f1 only on its path, of {f1, f2}
    assert scored.loc["c2", "coverage"] == pytest.approx(0.0)


# ----------------------------------------------------------------------------------------------- parts
def test_parts_of_a_recipe_diff_are_its_keys_and_of_a_code_diff_the_file():
    recipe = _recipe_diff(RECIPE, lr=3e-4, group_size=16)
    assert population.parts(recipe) == {"recipe.yaml:lr", "recipe.yaml:group_size"}
    assert population.recipe_changes(recipe) == {"lr": pytest.approx(3e-4), "group_size": 16}
    code = unified_diff("reward.py", "A = 1\nB = 2\n", "A = 1\nB = 3\n")
    assert population.parts(code) == {"reward.py"}
    assert population.recipe_changes(code) is None
    assert population.parts(recipe + code) == {"recipe.yaml:lr", "recipe.yaml:group_size", "reward.py"}
    assert population.recipe_changes(recipe + code) is None  # not a recipe-only diff
    assert population.parts("") == set() and population.recipe_changes("") is None


# ------------------------------------------------------------------------------------ verified changes
def test_verified_changes_beat_their_control_with_the_interval_above_zero_best_first():
    table = _table(
        _row(0, "control", "kept", 0.5, delta=0.0),
        _row(0, "c1", "promoted", 0.6, delta=0.10, ci_low=0.04, diff=_recipe_diff(RECIPE, lr=3e-4)),
        _row(0, "c2", "rejected", 0.58, delta=0.08, diff=_recipe_diff(RECIPE, group_size=16)),  # no interval
        _row(0, "c3", "rejected", 0.55, delta=0.05, ci_low=-0.01, diff=_recipe_diff(RECIPE, top_p=0.9)),
        _row(0, "c4", "rejected", 0.505, delta=0.005, diff=_recipe_diff(RECIPE, temperature=0.9)),
        _row(0, "c5", "failed", 0.7, delta=0.2, diff=_recipe_diff(RECIPE, kl_coef=0.01)),
        _row(0, "c6", "vetoed", 0.7, delta=0.2, ci_low=0.1, diff=_recipe_diff(RECIPE, ppo_epochs=2)),
    )
    assert list(population.verified_changes(table, 0.01)["candidate_id"]) == ["c2", "c1"]


# ------------------------------------------------------------------------------------------- crossover
PATH_TEXT = set_recipe_values(RECIPE, {"lr": 3e-4})
PARENT_TEXT = set_recipe_values(PATH_TEXT, {"prompts_per_step": 48})  # the parent's harness: both path changes
D_LR = _recipe_diff(RECIPE, lr=3e-4)
D_PPS = _recipe_diff(PATH_TEXT, prompts_per_step=48)
D_GS = _recipe_diff(RECIPE, group_size=16)


def _crossover_table(other_diff: str = D_GS, other_delta: float = 0.08, other_ci: float = 0.02):
    """gen0 c1 (lr) promoted, gen1 c1 (prompts_per_step, from gen0 c1) promoted: the parent (1, c1)'s path;
    gen0 c2 (``other_diff``) beat its control on another branch."""
    return _table(
        _row(0, "control", "rejected", 0.50),
        _row(0, "c1", "promoted", 0.60, control=0.5, delta=0.10, ci_low=0.04, diff=D_LR, intervention="lr"),
        _row(0, "c2", "rejected", 0.5 + other_delta, control=0.5, delta=other_delta, ci_low=other_ci,
             diff=other_diff, intervention="other"),
        _row(1, "control", "rejected", 0.60, parent=(0, "c1")),
        _row(1, "c1", "promoted", 0.63, control=0.6, delta=0.03, ci_low=0.01, diff=D_PPS, parent=(0, "c1"),
             intervention="pps"),
    )


def _applies(diff: str) -> bool:
    return _patch(PARENT_TEXT, diff) is not None


def test_crossover_re_sets_a_verified_change_of_another_branch_on_the_parents_recipe():
    assert _patch(PARENT_TEXT, D_GS) is None  # the change as verified does not apply next to the path's edit
    found = population.crossover(_crossover_table(), (1, "c1"), PARENT_TEXT, 0.01, _applies)
    assert found is not None
    assert (found["row"]["generation"], found["row"]["candidate_id"]) == (0, "c2")
    assert population.parts(found["diff"]) == {"recipe.yaml:group_size"}
    crossed = yaml.safe_load(_patch(PARENT_TEXT, found["diff"]))
    assert crossed["group_size"] == 16 and crossed["prompts_per_step"] == 48 and crossed["lr"] == pytest.approx(3e-4)
    tried = population.crossover(_crossover_table(), (1, "c1"), PARENT_TEXT, 0.01, _applies,
                                 tried={diff_hash(found["diff"])})
    assert tried is None  # already tried from this parent
    assert population.crossover(_crossover_table(), (1, "c1"), PARENT_TEXT, 0.01, lambda diff: False) is None


def test_crossover_passes_a_code_change_as_verified():
    code = unified_diff("reward.py", "A = 1\n", "A = 2\n")
    found = population.crossover(_crossover_table(other_diff=code), (1, "c1"), PARENT_TEXT, 0.01, lambda d: True)
    assert found is not None and found["diff"] == code


@pytest.mark.parametrize("table", [
    pytest.param(_crossover_table(other_diff=_recipe_diff(RECIPE, lr=5e-4)), id="same-key-as-the-path"),
    pytest.param(_crossover_table(other_diff=_recipe_diff(RECIPE, prompts_per_step=64)), id="same-key-later-on-path"),
    pytest.param(_crossover_table(other_delta=0.005), id="only-the-paths-changes-verified"),
    pytest.param(_crossover_table(other_diff=D_LR), id="same-change-as-on-the-path"),
    pytest.param(_crossover_table(other_ci=-0.01), id="interval-not-above-zero"),
])
def test_crossover_finds_nothing_that_touches_the_paths_parts_or_is_on_it(table):
    assert population.crossover(table, (1, "c1"), PARENT_TEXT, 0.01, _applies) is None
