"""Population search (``search.mode=population``; docs/population.md): an archive of elites built from the
run's lineage, the choice of the next generation's parent among them, and crossover of verified changes.

A *member* is a backtest that trained and was scored (verdict promoted, kept or rejected) and whose policy is
still on disk: a policy plus the harness it was trained under. Its *fitness* is robust to selection noise: a
candidate's val accuracy counts only as far as its paired gain interval over its own control goes (control val
+ the interval's lower end, never above its val accuracy); a control's is its val accuracy.

The archive is the ``archive_size`` fittest members. The next generation's parent is drawn from it with weight

    exp((fitness - best fitness) / temperature) x (1 + productivity) x (1 + novelty) x (1 + coverage)
                                                 / (1 + children)

* productivity: the share of the member's candidate children that beat their control, Laplace-smoothed
  ((promoted + 1) / (children + 2)); an untried member gets 1/2;
* novelty: 1 - the largest Jaccard similarity between the interventions on its path (its ancestry's changes)
  and any other member's path;
* coverage: the share of all diagnosed findings targeted along the archive's paths that only its path targeted;
* children: the generations that already started from it (fewer picks for a parent that has many children).

The draw is seeded by (run seed, generation), so a resumed run picks the same parent. Before the last generation
the parent is the fittest member instead (the last generation refines the best elite; the run's final policy is
that generation's winner or its control, as in the single lineage).

Crossover: a change verified in its own generation (it beat its control by more than ``min_gain``, its interval
above zero where one was computed) that is not on the parent's path and touches other parts of the harness
than the path's changes (recipe keys count as parts of recipe.yaml; any other file is one part) is applied to
the parent's harness (recipe keys are set again on the parent's recipe, so nearby edits of the path do not
block the hunk).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from evotrainer.contracts.candidate import CONTROL
from evotrainer.contracts.lineage import ancestry

MEMBER_VERDICTS = ("promoted", "kept", "rejected")
Key = tuple[int, str]  # (generation, candidate_id) of a backtest

_RECIPE_LINE = re.compile(r"^([+-])([A-Za-z_][A-Za-z0-9_]*):[ \t]*([^#\n]*?)[ \t]*(#.*)?$")
_FILE_LINE = re.compile(r"^\+\+\+ (?:b/)?(\S+)")


@dataclass(frozen=True)
class PopulationConf:
    archive_size: int = 8
    temperature: float = 0.02
    crossover: bool = True


def key_of(row) -> Key:
    return int(row["generation"]), str(row["candidate_id"])


def parent_of(row) -> Key | None:
    generation = row.get("parent_generation")
    if generation is None or pd.isna(generation):
        return None
    return int(generation), str(row["parent_candidate_id"])


def fitness(row) -> float:
    """Val accuracy, for a candidate only as far as its gain interval over its control reaches."""
    val = float(row["val_accuracy"])
    ci_low, control = row.get("gain_ci_low"), row.get("control_val_accuracy")
    if row["candidate_id"] == CONTROL or ci_low is None or control is None or pd.isna(ci_low) or pd.isna(control):
        return val
    return min(val, float(control) + float(ci_low))


def members(table: pd.DataFrame, alive: Callable[[Key], bool] = lambda key: True) -> pd.DataFrame:
    """The lineage's members (trained, scored, policy on disk), with their fitness, fittest first (ties: the
    later generation, then candidate order)."""
    if table is None or table.empty:
        return pd.DataFrame(columns=[*(table.columns if table is not None else []), "fitness"])
    rows = table[table["verdict"].isin(MEMBER_VERDICTS) & table["val_accuracy"].notna()].copy()
    rows = rows[pd.Series([alive(key_of(r)) for r in rows.to_dict("records")], index=rows.index, dtype=bool)]
    rows["fitness"] = [fitness(r) for r in rows.to_dict("records")]
    rows["_order"] = [_candidate_index(c) for c in rows["candidate_id"]]
    rows = rows.sort_values(["fitness", "generation", "_order"], ascending=[False, False, True], kind="stable")
    return rows.drop(columns="_order").reset_index(drop=True)


def archive(table: pd.DataFrame, size: int, alive: Callable[[Key], bool] = lambda key: True) -> pd.DataFrame:
    return members(table, alive).head(max(1, int(size)))


def path_rows(table: pd.DataFrame, key: Key) -> pd.DataFrame:
    keys = ancestry(table, key)
    index = {key_of(r): i for i, r in enumerate(table.to_dict("records"))}
    return table.iloc[[index[k] for k in keys]]


def _changes(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows that changed the harness (not a control, a non-empty diff)."""
    return rows[(rows["candidate_id"] != CONTROL) & rows["diff"].fillna("").str.strip().astype(bool)]


def parts(diff: str) -> set[str]:
    """The parts of the harness a diff touches: ``recipe.yaml:<key>`` per recipe key, else the file name."""
    out, current = set(), None
    for line in (diff or "").splitlines():
        found = _FILE_LINE.match(line)
        if found:
            current = found.group(1)
            if current != "recipe.yaml":
                out.add(current)
            continue
        if current == "recipe.yaml" and not line.startswith(("---", "+++")):
            recipe = _RECIPE_LINE.match(line)
            if recipe:
                out.add(f"recipe.yaml:{recipe.group(2)}")
    return out


def recipe_changes(diff: str) -> dict | None:
    """``{key: value}`` a diff that edits only recipe.yaml's ``key: value`` lines sets; None for any other diff."""
    import yaml

    touched = parts(diff)
    if not touched or any(not p.startswith("recipe.yaml:") for p in touched):
        return None
    changes = {}
    in_recipe = False
    for line in diff.splitlines():
        found = _FILE_LINE.match(line)
        if found:
            in_recipe = found.group(1) == "recipe.yaml"
            continue
        if in_recipe and line.startswith("+") and not line.startswith("+++"):
            recipe = _RECIPE_LINE.match(line)
            if recipe:
                changes[recipe.group(2)] = yaml.safe_load(recipe.group(3)) if recipe.group(3) else None
    return changes or None


def scores(table: pd.DataFrame, elites: pd.DataFrame) -> pd.DataFrame:
    """The archive with each member's productivity, novelty, coverage, children and selection weight (unnormalised)
    at ``temperature`` 1 (``weights`` applies the temperature)."""
    records = table.to_dict("records")
    out = elites.copy()
    paths = {key_of(r): path_rows(table, key_of(r)) for r in elites.to_dict("records")}
    interventions = {k: set(_changes(p)["intervention"].fillna("")) for k, p in paths.items()}
    findings = {k: {f for fs in _changes(p)["targeted_findings"] for f in (list(fs) if fs is not None else [])}
                for k, p in paths.items()}
    everything = set().union(*findings.values()) if findings else set()
    productivity, novelty, coverage, children = [], [], [], []
    for row in elites.to_dict("records"):
        key = key_of(row)
        kids = [r for r in records if parent_of(r) == key]
        tried = [r for r in kids if r["candidate_id"] != CONTROL]
        wins = sum(r["verdict"] == "promoted" for r in tried)
        productivity.append((wins + 1) / (len(tried) + 2))
        others = [interventions[k] for k in interventions if k != key]
        novelty.append(1.0 - max((_jaccard(interventions[key], o) for o in others), default=0.0))
        own = findings[key] - set().union(*(findings[k] for k in findings if k != key))
        coverage.append(len(own) / len(everything) if everything else 0.0)
        children.append(len({int(r["generation"]) for r in kids}))
    out["productivity"], out["novelty"], out["coverage"], out["children"] = productivity, novelty, coverage, children
    return out


def weights(scored: pd.DataFrame, temperature: float) -> np.ndarray:
    fit = scored["fitness"].to_numpy(dtype=float)
    w = np.exp((fit - fit.max()) / max(float(temperature), 1e-9))
    w *= (1 + scored["productivity"].to_numpy()) * (1 + scored["novelty"].to_numpy())
    w *= (1 + scored["coverage"].to_numpy()) / (1 + scored["children"].to_numpy())
    return w / w.sum()


def next_parent(table: pd.DataFrame, conf: PopulationConf, *, seed: int, generation: int, fittest: bool,
                alive: Callable[[Key], bool] = lambda key: True) -> dict | None:
    """The parent of generation ``generation + 1`` from the lineage up to ``generation``: drawn from the archive
    (``fittest``: the fittest member). None when nothing in the lineage can be a parent."""
    elites = archive(table, conf.archive_size, alive)
    if elites.empty:
        return None
    scored = scores(table, elites)
    w = weights(scored, conf.temperature)
    if fittest:
        index, how = 0, "the fittest member (the last generation refines the best elite)"
    else:
        rng = np.random.default_rng(_stream(seed, generation))
        index, how = int(rng.choice(len(scored), p=w)), "drawn from the archive by weight"
    chosen = scored.iloc[index]
    return {
        "generation": int(chosen["generation"]), "candidate_id": str(chosen["candidate_id"]),
        "fitness": float(chosen["fitness"]), "val_accuracy": float(chosen["val_accuracy"]), "how": how,
        "archive": [{"generation": int(r["generation"]), "candidate_id": str(r["candidate_id"]),
                     "intervention": r["intervention"], "val_accuracy": float(r["val_accuracy"]),
                     "fitness": round(float(r["fitness"]), 6), "productivity": round(float(r["productivity"]), 4),
                     "novelty": round(float(r["novelty"]), 4), "coverage": round(float(r["coverage"]), 4),
                     "children": int(r["children"]), "weight": round(float(p), 6)}
                    for r, p in zip(scored.to_dict("records"), w, strict=True)],
    }


def verified_changes(table: pd.DataFrame, min_gain: float) -> pd.DataFrame:
    """Changes that beat their own control by more than ``min_gain`` (with the interval above zero where one was
    computed), best lower bound first."""
    if table is None or table.empty:
        return table
    rows = _changes(table[table["verdict"].isin(("promoted", "rejected"))])
    rows = rows[rows["delta_vs_control"].notna() & (rows["delta_vs_control"] > min_gain)]
    rows = rows[rows["gain_ci_low"].isna() | (rows["gain_ci_low"] > 0)]
    order = rows["gain_ci_low"].fillna(rows["delta_vs_control"])
    return rows.assign(_order=order).sort_values("_order", ascending=False, kind="stable").drop(columns="_order")


def crossover(table: pd.DataFrame, parent: Key | None, recipe_text: str, min_gain: float,
              apply: Callable[[str], bool], tried: Iterable[str] = ()) -> dict | None:
    """The best verified change not on ``parent``'s path, touching other parts than the path's changes, as a diff
    against the parent's harness (``recipe_text``: its recipe.yaml) that ``apply`` accepts; None if there is none.
    Returns ``{"diff", "row"}`` (the lineage row of the change)."""
    from evotrainer.contracts.intervention import set_recipe_values, unified_diff
    from evotrainer.runtime import diff_hash

    on_path = _changes(path_rows(table, parent)) if parent is not None else table.iloc[0:0]
    path_hashes = set(on_path["diff_hash"])
    path_parts = set().union(*(parts(d) for d in on_path["diff"])) if len(on_path) else set()
    tried, seen = set(tried), set()
    for row in verified_changes(table, min_gain).to_dict("records"):
        if row["diff_hash"] in path_hashes or row["diff_hash"] in seen:
            continue
        seen.add(row["diff_hash"])
        touched = parts(row["diff"])
        if not touched or touched & path_parts:
            continue
        changes = recipe_changes(row["diff"])
        try:
            diff = (unified_diff("recipe.yaml", recipe_text, set_recipe_values(recipe_text, changes))
                    if changes else row["diff"])
        except KeyError:
            continue
        if not diff.strip() or diff_hash(diff) in tried or not apply(diff):
            continue
        return {"diff": diff, "row": row}
    return None


def _jaccard(a: set, b: set) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def _stream(seed: int, generation: int) -> int:
    return int.from_bytes(hashlib.sha256(f"population:{seed}:{generation}".encode()).digest()[:8], "little")


def _candidate_index(candidate_id: str) -> int:
    digits = "".join(ch for ch in str(candidate_id) if ch.isdigit())
    return int(digits) if digits else 0
