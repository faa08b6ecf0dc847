"""The harness contract: a directory with recipe.yaml, reward.py, curriculum.py, diagnostics.py, and
for multi-turn (agentic) tasks an optional env.yaml (environment knobs, ``ENV_SCHEMA``).

The recipe is backend-neutral and schema-checked here (types, ranges, choices) *before* any
backend sees it, because backends accept some bad values silently (verl takes a non-numeric clip
ratio). The training budget (steps) is not part of the recipe: it belongs to the search protocol
so that every candidate and the baseline train for the same number of steps.
"""

from __future__ import annotations

import hashlib
import math
import reprlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

HARNESS_FILES = ("recipe.yaml", "reward.py", "curriculum.py", "diagnostics.py")
# present only in the harnesses of multi-turn tasks; a candidate diff may edit it where the parent has it
OPTIONAL_HARNESS_FILES = ("env.yaml",)
EDITABLE_FILES = HARNESS_FILES + OPTIONAL_HARNESS_FILES
DEFAULT_HARNESS = Path(__file__).parents[1] / "tasks" / "harnesses" / "default"


class HarnessError(ValueError):
    """A harness file violates the contract; ``label`` is the candidate failure label."""

    def __init__(self, message: str, label: str = "schema_violation"):
        super().__init__(message)
        self.label = label


_SHORT = reprlib.Repr()  # Python 3.11: no keyword arguments yet
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxtuple = 2, 4, 4, 4
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxlong = 60, 60, 40


def shown(value: Any) -> str:
    """A bounded repr for error messages: a hostile value (a YAML alias bomb) must not be walked whole."""
    return _SHORT.repr(value)


@dataclass(frozen=True)
class Field:
    kind: type
    low: float | None = None
    high: float | None = None
    choices: tuple[Any, ...] | None = None
    help: str = ""

    def check(self, key: str, value: Any, where: str) -> Any:
        if self.kind is bool:
            if not isinstance(value, bool):
                raise HarnessError(f"{where}: '{key}' must be true or false, got {shown(value)}")
            return value
        if self.choices is not None:
            if value not in self.choices:
                raise HarnessError(f"{where}: '{key}' = {shown(value)} is not allowed; choose one of {list(self.choices)}")
            return value
        if isinstance(value, str) and self.kind in (int, float):
            value = _number_or_none(value) if _number_or_none(value) is not None else value  # YAML 1.1 reads 1e-4 as a string
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise HarnessError(f"{where}: '{key}' must be a number ({self.kind.__name__}), got {shown(value)}")
        if isinstance(value, int) and abs(value) > 2**53:  # float(value) would overflow or round
            raise HarnessError(f"{where}: '{key}' = {shown(value)} is outside its range [{self.low}, {self.high}]")
        if not math.isfinite(value):  # YAML .nan / .inf / -.inf, or the strings "nan" / "inf"
            raise HarnessError(f"{where}: '{key}' must be a finite number, got {shown(value)}")
        if self.kind is int and not float(value).is_integer():
            raise HarnessError(f"{where}: '{key}' must be an integer, got {shown(value)}")
        value = self.kind(value)
        if (self.low is not None and value < self.low) or (self.high is not None and value > self.high):
            raise HarnessError(f"{where}: '{key}' = {value} is outside its range [{self.low}, {self.high}]")
        return value


def _number_or_none(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


RECIPE_SCHEMA: dict[str, Field] = {
    "lr": Field(float, 1e-7, 1e-2, help="Adam learning rate"),
    "prompts_per_step": Field(int, 1, 1024, help="prompts per training step"),
    "group_size": Field(int, 2, 64, help="samples per prompt (GRPO group)"),
    "ppo_epochs": Field(int, 1, 8, help="optimisation passes over each batch"),
    "clip_low": Field(float, 0.0, 1.0, help="PPO ratio clip below 1"),
    "clip_high": Field(float, 0.0, 1.0, help="PPO ratio clip above 1 (clip-higher when > clip_low)"),
    "kl_coef": Field(float, 0.0, 1.0, help="KL-to-reference loss coefficient (k3 estimator); 0 = off"),
    "entropy_coef": Field(float, 0.0, 0.1, help="entropy bonus coefficient"),
    "loss_agg": Field(str, choices=("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"), help="loss aggregation"),
    "norm_adv_by_std": Field(bool, help="divide group advantages by the group std (GRPO) or not (Dr. GRPO)"),
    "temperature": Field(float, 0.1, 2.0, help="sampling temperature"),
    "top_p": Field(float, 0.05, 1.0, help="nucleus sampling"),
    "max_response_len": Field(int, 1, 4096, help="tokens per response; longer ones are truncated (the task caps it too)"),
    "dynamic_sampling": Field(bool, help="drop zero-variance groups and refill the batch (DAPO)"),
    "dynamic_sampling_max_batches": Field(int, 1, 16, help="sampling rounds per step when refilling"),
    "overlong_buffer": Field(int, 0, 64, help="soft overlong penalty over the last N tokens; 0 = off"),
    "overlong_penalty": Field(float, 0.0, 10.0, help="penalty at max length when overlong_buffer > 0"),
    "grad_clip": Field(float, 0.0, 100.0, help="gradient-norm clip; 0 = off"),
    "weight_decay": Field(float, 0.0, 1.0, help="AdamW weight decay"),
}


def check_recipe(recipe: Any, where: str = "recipe.yaml") -> dict[str, Any]:
    if not isinstance(recipe, dict):
        raise HarnessError(f"{where}: must be a mapping of knob: value, got {type(recipe).__name__}")
    unknown = sorted(map(str, set(recipe) - set(RECIPE_SCHEMA)))
    if unknown:
        raise HarnessError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(RECIPE_SCHEMA)}")
    missing = sorted(set(RECIPE_SCHEMA) - set(recipe))
    if missing:
        raise HarnessError(f"{where}: missing key(s) {missing}")
    return {key: RECIPE_SCHEMA[key].check(key, value, where) for key, value in recipe.items()}


MAX_RECIPE_BYTES = 16_000

# env.yaml: the environment knobs of a multi-turn harness (all optional; absent = the task's config)
ENV_SCHEMA: dict[str, Field] = {
    "max_turns": Field(int, 1, 64, help="model turns per episode before truncation (termination max_turns)"),
    "max_observation_chars": Field(int, 100, 20000, help="observations longer than this are cut in the middle"),
    "episode_filter": Field(str, choices=("none", "drop_context_limit", "drop_truncated", "drop_invalid"),
                            help="episodes left out of the loss"),
}


def check_env(knobs: Any, where: str = "env.yaml") -> dict[str, Any]:
    """env.yaml's values checked against ENV_SCHEMA (an empty file is no knobs)."""
    if knobs is None:
        return {}
    if not isinstance(knobs, dict):
        raise HarnessError(f"{where}: must be a mapping of knob: value, got {type(knobs).__name__}")
    unknown = sorted(map(str, set(knobs) - set(ENV_SCHEMA)))
    if unknown:
        raise HarnessError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(ENV_SCHEMA)}")
    return {key: ENV_SCHEMA[key].check(key, value, where) for key, value in knobs.items()}


class _PlainLoader(yaml.SafeLoader):
    """safe_load without anchors and aliases: a recipe is flat key: value, and an alias bomb (a billion
    shared references) would make every later walk of the value explode."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, "YAML aliases (*name) are not allowed in a recipe",
                                              event.start_mark)
        return super().compose_node(parent, index)


def _load_yaml(path: Path) -> Any:
    if path.stat().st_size > MAX_RECIPE_BYTES:
        raise HarnessError(f"{path}: larger than {MAX_RECIPE_BYTES} bytes", label="parse_error")
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=_PlainLoader)  # noqa: S506 (a SafeLoader)
    except (yaml.YAMLError, RecursionError, UnicodeDecodeError, ValueError) as err:
        raise HarnessError(f"{path}: not valid YAML ({str(err)[:300]})", label="parse_error") from err


def load_recipe(harness_dir: str | Path) -> dict[str, Any]:
    path = Path(harness_dir) / "recipe.yaml"
    return check_recipe(_load_yaml(path), where=str(path))


def load_env(harness_dir: str | Path) -> dict[str, Any]:
    """The harness's env.yaml knobs, checked; {} when the harness has no env.yaml (single-turn tasks)."""
    path = Path(harness_dir) / "env.yaml"
    if path.is_symlink():
        raise HarnessError(f"{path}: a symbolic link; harness files must be regular files", label="forbidden_path")
    if not path.exists():
        return {}
    return check_env(_load_yaml(path), where=str(path))


def load_module(harness_dir: str | Path, name: str) -> ModuleType:
    """Import ``<harness_dir>/<name>.py`` (candidate code: only the sandbox worker calls this)."""
    from evotrainer.loading import load_file_module

    try:
        return load_file_module(Path(harness_dir) / f"{name}.py", prefix="evotrainer_harness")
    except ImportError as err:
        raise HarnessError(str(err), label="import_error") from err


def harness_id(harness_dir: str | Path) -> str:
    """Content hash of the harness files: equal harnesses get equal ids across runs. An optional file
    counts only where present, so a harness without one keeps the id it always had."""
    digest = hashlib.sha256()
    for name in HARNESS_FILES:
        path = Path(harness_dir) / name
        digest.update(name.encode() + b"\0")
        digest.update(path.read_bytes() if path.exists() else b"<missing>")
    for name in OPTIONAL_HARNESS_FILES:
        path = Path(harness_dir) / name
        if path.is_file():
            digest.update(name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def check_layout(harness_dir: str | Path) -> None:
    harness_dir = Path(harness_dir)
    missing = [name for name in HARNESS_FILES if not (harness_dir / name).is_file()]
    if missing:
        raise HarnessError(f"{harness_dir}: harness is missing {missing}; a harness needs {list(HARNESS_FILES)}")


# ---- the reward contract: the one loop that calls a harness reward over a batch -------------------------
# A reward row is {"data_source", "solution_str", "ground_truth", "extra_info"}: verl's compute_score
# arguments. In-process scoring and the sandboxed reward worker both call score_rows, so a reward means
# the same thing wherever it runs.
TURN_REWARDS = "turn_rewards"  # reserved result key: turn-level credit of a multi-turn episode, one float per turn
MAX_TURN_REWARDS = 1024


def score_rows(compute_score, rows: list[dict], turn_rewards: list | None = None,
               ) -> tuple[list[float], dict[str, list[float]]]:
    """Call ``compute_score`` per row; a dict result's keys other than "score" and "turn_rewards" are
    reward components (0.0 where a row did not return that key). Raises ValueError on a non-finite or
    non-numeric score. With ``turn_rewards`` (a list), each row's turn-level credit is appended to it
    (checked by ``checked_turn_rewards``; None where the row gave none); without, that key is ignored."""
    scores: list[float] = []
    components: dict[str, list[float]] = {}
    for i, row in enumerate(rows):
        out = compute_score(row["data_source"], row["solution_str"], row["ground_truth"], row.get("extra_info"))
        turns = None
        if isinstance(out, dict):
            if "score" not in out:
                raise ValueError(f"reward returned a dict without 'score' (keys: {sorted(out)})")
            for key, value in out.items():
                if key == TURN_REWARDS:
                    turns = checked_turn_rewards(value)
                elif key != "score":
                    if key not in components:  # not setdefault: its default would be built every row
                        components[str(key)] = [0.0] * len(rows)
                    components[str(key)][i] = _finite(value, f"component {key!r}")
            out = out["score"]
        scores.append(_finite(out, "score"))
        if turn_rewards is not None:
            turn_rewards.append(turns)
    return scores, components


def checked_turn_rewards(value) -> list[float] | None:
    """A reward's ``turn_rewards``: None, or a list of at most MAX_TURN_REWARDS finite numbers."""
    if value is None:
        return None
    if not isinstance(value, list | tuple) or len(value) > MAX_TURN_REWARDS:
        raise ValueError(f"reward 'turn_rewards' must be a list of at most {MAX_TURN_REWARDS} numbers, "
                         f"got {type(value).__name__}" + (f" of {len(value)}" if isinstance(value, list | tuple) else ""))
    return [_finite(v, "turn_rewards value") for v in value]


def _finite(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        try:  # numpy scalars
            value = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"reward {what} must be a number, got {type(value).__name__}") from None
    value = float(value)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"reward {what} must be finite, got {value}")
    return value
