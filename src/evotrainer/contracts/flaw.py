"""The flaw format: a folder that turns a task's shipped harness into a flawed starting harness (docs/flaws.md).

::

    flaws/<name>/
      flaw.yaml   task: arithmetic          (or experiment: code_quick; at least one of the two)
                  overrides: {search.generations: 4}   (optional; a mapping of dotted keys, or a list of key=value)
                  knob_fixable: false       (true marks a control a recipe tuner should be able to fix)
                  description: one line     (the report's only; no agent stage reads it)
      flaw.diff   a unified diff (a/ b/ paths inside the harness, as a candidate's) against that task's shipped
                  harness; applied strictly, it makes the flawed harness the loop starts from. It adds no comment
                  or docstring text (``added_hints``): an LLM agent reads the harness through its file tools, and
                  what the flaw is belongs in flaw.yaml, which no agent stage reads

The folder's name names the flaw's runs (``<suite run>-<name>-seed<s>``), so it is a run name's characters.
A malformed flaw fails alone with a label (:class:`FlawError`); the suite goes on with the others.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FLAW_YAML = "flaw.yaml"
FLAW_DIFF = "flaw.diff"
MAX_YAML_BYTES = 64 * 1024
MAX_DIFF_BYTES = 1024 * 1024
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,59}")
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
KEYS = ("task", "experiment", "overrides", "knob_fixable", "description")
# keys the flaws runner sets for every flaw's runs; a flaw may not set them (docs/flaws.md)
RUNNER_KEYS = ("run", "results_dir", "seed", "harness.initial", "harness.reference", "skills.library_dir",
               "search.headline_seeds", "search.headline_arms", "search.baseline", "search.baseline_matched", "flaws")

# failure labels of a flaw (flaws.json "label"); the suite's other flaws go on
LABELS = {
    "flaw_invalid": "flaw.yaml is missing, unreadable or breaks the format",
    "flaw_diff_invalid": "flaw.diff is missing or does not apply to the task's shipped harness",
    "flaw_diff_hint": "flaw.diff adds comment or docstring text an agent could read (the explanation belongs in "
                      "flaw.yaml's description)",
    "flaw_config_invalid": "the flaw's config does not compose or validate",
    "flaw_run_failed": "the flaw's runs ended without every arm's test score",
    "flaw_timeout": "the flaw's runs ran past flaws.timeout_s and were stopped",
}


class FlawError(ValueError):
    """A flaw that cannot run; ``label`` is one of LABELS."""

    def __init__(self, message: str, label: str = "flaw_invalid") -> None:
        super().__init__(message)
        self.label = label


@dataclass(frozen=True)
class Flaw:
    name: str
    folder: Path
    diff: str
    task: str | None = None
    experiment: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    knob_fixable: bool = False
    description: str = ""

    def head_overrides(self) -> list[str]:
        """The flaw's experiment and task as Hydra overrides (its own keys, ``overrides``, come after the
        suite's: stages/flaws.py)."""
        return [f"experiment={self.experiment}"] * bool(self.experiment) + [f"task={self.task}"] * bool(self.task)


def flaw_folders(flaws_dir: str | Path, only: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The names of the flaw folders in ``flaws_dir`` (those that hold flaw.yaml or flaw.diff), sorted; ``only``
    keeps the named ones (a name that is not there is an error: a typo would silently run nothing)."""
    root = Path(flaws_dir)
    names = sorted(entry.name for entry in root.iterdir()
                   if entry.is_dir() and ((entry / FLAW_YAML).exists() or (entry / FLAW_DIFF).exists()))
    if only:
        missing = [name for name in only if name not in names]
        if missing:
            raise FlawError(f"flaws.only names {missing}, which are not flaw folders of {root}; there are: {names}")
        names = [name for name in names if name in only]
    return names


def valid_name(name: str) -> bool:
    return _NAME.fullmatch(name) is not None


def load_flaw(folder: str | Path) -> Flaw:
    """Read and check one flaw folder; raises FlawError with its label."""
    import yaml

    folder = Path(folder)
    if not valid_name(folder.name):
        raise FlawError(f"flaw folder name {folder.name!r}: letters, digits, '.', '_' and '-' only (it names runs)")
    spec_path, diff_path = folder / FLAW_YAML, folder / FLAW_DIFF
    spec_text = _read(spec_path, MAX_YAML_BYTES, "flaw_invalid")
    diff = _read(diff_path, MAX_DIFF_BYTES, "flaw_diff_invalid")
    if not diff.strip():
        raise FlawError(f"{diff_path}: empty; a flaw is a change to the shipped harness", "flaw_diff_invalid")
    try:
        spec = yaml.safe_load(spec_text)
    except yaml.YAMLError as err:
        raise FlawError(f"{spec_path}: not YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(spec, dict):
        raise FlawError(f"{spec_path}: must be a mapping with keys {list(KEYS)}")
    unknown = [str(key) for key in spec if key not in KEYS]
    if unknown:
        raise FlawError(f"{spec_path}: unknown keys {unknown}; allowed: {list(KEYS)}")
    task, experiment = _word(spec, "task", spec_path), _word(spec, "experiment", spec_path)
    if not task and not experiment:
        raise FlawError(f"{spec_path}: name the task (task: arithmetic) or the experiment (experiment: code_quick)")
    knob_fixable = spec.get("knob_fixable", False)
    if not isinstance(knob_fixable, bool):
        raise FlawError(f"{spec_path}: knob_fixable must be true or false")
    description = spec.get("description", "")
    if not isinstance(description, str) or "\n" in description.strip() or len(description) > 300:
        raise FlawError(f"{spec_path}: description must be one line of at most 300 characters")
    return Flaw(name=folder.name, folder=folder, diff=diff, task=task, experiment=experiment,
                overrides=_overrides(spec.get("overrides"), spec_path), knob_fixable=knob_fixable,
                description=description.strip())


def _read(path: Path, limit: int, label: str) -> str:
    if not path.is_file() or path.is_symlink():
        raise FlawError(f"{path}: missing (a flaw folder holds {FLAW_YAML} and {FLAW_DIFF})", label)
    if path.stat().st_size > limit:
        raise FlawError(f"{path}: larger than {limit} bytes", label)
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise FlawError(f"{path}: unreadable ({err})", label) from None


def _word(spec: dict, key: str, where: Path) -> str | None:
    value = spec.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,60}", value):
        raise FlawError(f"{where}: {key} must be a name (letters, digits, '_', '.', '-')")
    return value


def _overrides(value: Any, where: Path) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, list):
        pairs = {}
        for item in value:
            if not isinstance(item, str) or "=" not in item:
                raise FlawError(f"{where}: overrides as a list holds key=value strings; got {item!r}")
            key, text = item.split("=", 1)
            pairs[key.strip()] = _scalar(text.strip())
        value = pairs
    if not isinstance(value, dict):
        raise FlawError(f"{where}: overrides must be a mapping of dotted keys (search.generations: 4)")
    out: dict[str, Any] = {}
    for key, item in value.items():
        key = str(key)
        if not _KEY.fullmatch(key):
            raise FlawError(f"{where}: override key {key!r} is not a dotted config key")
        if any(key == owned or key.startswith(owned + ".") for owned in RUNNER_KEYS):
            raise FlawError(f"{where}: override {key!r} is set by the flaws runner for every flaw (docs/flaws.md)")
        if isinstance(item, dict):
            raise FlawError(f"{where}: override {key!r}: give nested keys dotted (harness.recipe.lr: 1e-2)")
        out[key] = item
    return out


def _scalar(text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def added_hints(reference: Path, flawed: Path) -> list[str]:
    """Comment and docstring text the flawed harness has that the shipped one (``reference``) does not, per file:
    Python comments and docstrings, YAML comments (``file: text`` each). A flaw may remove or keep such text; it
    may not add any, since the loop's agent reads the harness and a comment would tell it the flaw."""
    found = []
    for path in sorted(Path(flawed).rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        name = str(path.relative_to(flawed))
        before = Path(reference) / name
        old = _notes(before) if before.is_file() else []
        remaining = list(old)
        for note in _notes(path):
            if note in remaining:
                remaining.remove(note)
            else:
                found.append(f"{name}: {note[:120]}")
    return found


def _notes(path: Path) -> list[str]:
    """The comment and docstring texts of a Python or YAML file, stripped (empty for other files)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix == ".py":
        return _python_notes(text)
    if path.suffix in (".yaml", ".yml"):
        return [match.group(1).strip() for match in re.finditer(r"(?:^|\s)#(.*)$", text, flags=re.M)
                if match.group(1).strip()]
    return []


def _python_notes(text: str) -> list[str]:
    import ast
    import io
    import tokenize

    notes = []
    try:
        notes += [token.string.lstrip("#").strip() for token in tokenize.generate_tokens(io.StringIO(text).readline)
                  if token.type == tokenize.COMMENT and token.string.lstrip("#").strip()]
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return [line.strip() for line in text.splitlines() if "#" in line]  # unreadable: every line with a '#'
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return notes
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            doc = ast.get_docstring(node, clean=True)
            if doc:
                notes.append(doc.strip())
    return notes
