"""What a user types, as the Hydra overrides ``compose`` reads: Snakemake's ``--config`` entries
(``search__generations=5``, nested mappings, ``overrides=[...]``), keys checked against the schema before Hydra
sees them (the closest spelling for a typo, ``++`` for a key its group's YAML leaves out), verl's own override
syntax, loggers as lists, and Hydra's refusals as one line.

Snakemake does not accept dots in ``--config`` keys, so nested keys are written with ``__``
(``search__generations=5``) or passed whole (``'overrides=[search.generations=5]'``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, open_dict
from omegaconf.errors import OmegaConfBaseException

from evotrainer.config.schema import (
    PACKAGED_CONF,
    Config,
    ConfigError,
    _check_renamed_overrides,
    _one_line,
    closest_hint,
    schema_key_problem,
    validate,
)

# Snakemake config keys that name a nested key (the spelling the README uses)
SNAKEMAKE_KEY_ALIASES = {"flaws_dir": "flaws.dir"}


def overrides_from_snakemake(config: dict[str, Any]) -> list[str]:
    """Hydra overrides from Snakemake's config: ``key=value`` entries (``__`` for a dot, as Snakemake's --config
    refuses dots in keys), nested mappings (a ``--configfile`` YAML, or ``--config 'search={generations: 5}'``)
    and dotted keys (a --configfile may have them) become dotted keys; ``overrides=[...]`` is Hydra's own syntax,
    passed as written. Values Hydra would read differently (commas, brackets, quotes, '=') are quoted."""
    overrides: list[str] = []
    for key, value in config.items():
        if key == "overrides":
            overrides.extend(str(o) for o in (value if isinstance(value, list) else [value]))
        else:
            key = SNAKEMAKE_KEY_ALIASES.get(str(key), str(key))
            overrides.extend(_flatten(key.replace("__", "."), value))
    return overrides


def _flatten(key: str, value: Any) -> list[str]:
    if isinstance(value, dict) and value and not key.startswith("hydra."):
        return [o for sub, item in value.items() for o in _flatten(f"{key}.{str(sub).replace('__', '.')}", item)]
    return [f"{key}={_hydra_value(value)}"]


def _hydra_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_hydra_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_hydra_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    return text if _reads_back(text) else _quoted(text)


def _reads_back(text: str) -> bool:
    """Hydra reads ``key=text`` as one plain value whose text is ``text`` (a number, a bool, a word or a path)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        value = OverridesParser.create().parse_override(f"k={text}").value()
    except Exception:
        return False
    if isinstance(value, bool | int | float) or value is None:
        return True
    return isinstance(value, str) and value == text


def _quoted(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def compose(overrides: list[str] | None = None, conf_dir: str | Path | None = None) -> DictConfig:
    """The validated config: ``conf_dir``/config.yaml (default: the package's conf/) with ``overrides``.
    Every mistake is one ConfigError line naming the key, what is allowed and the closest spelling: an
    unknown key (with or without '+'), a config group's unknown option (``experiment=quik``), a bad value.
    A key the schema knows is set even where its group's YAML leaves it out (no '+' needed)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException, MissingConfigException

    conf = Path(conf_dir if conf_dir is not None else PACKAGED_CONF).resolve()
    if not (conf / "config.yaml").is_file():
        raise ConfigError(f"config: no config.yaml in {conf} (the conf/ folder beside the Snakefile)")
    overrides = [str(o) for o in overrides or []]
    _check_renamed_overrides(overrides)
    overrides = [_checked_override(o) for o in overrides]
    preset_run = _preset_run(overrides)
    try:
        with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
            cfg = hydra_compose(config_name="config", overrides=overrides)
    except MissingConfigException as err:
        raise ConfigError(_missing_option(err, conf)) from None
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(_hydra_error(err)) from None
    if preset_run and cfg.get("run") == "default":  # the preset's YAML set no run of its own
        with open_dict(cfg):
            cfg.run = preset_run
    return validate(cfg)


def _preset_run(overrides: list[str]) -> str | None:
    """``experiment=quick`` without ``run=``: the preset's own run, ``results/quick/`` (so that a preset never
    writes into ``results/default`` and the plain command afterwards is not refused as another config). A preset
    whose YAML sets ``run:`` keeps it, and ``run=`` given on the command line wins over both."""
    chosen = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0].lstrip("+") == "experiment" and "=" in o]
    if not chosen or any(o.split("=", 1)[0].lstrip("+") == "run" for o in overrides if "=" in o):
        return None
    name = chosen[-1].strip().strip("'\"").replace("/", "-")
    return name if name and name != "null" else None


def _missing_option(err: Any, conf: Path) -> str:
    missing = str(getattr(err, "missing_cfg_file", "") or "")
    options = sorted(str(o) for o in (getattr(err, "options", None) or []))
    group, _, option = missing.rpartition("/")
    if not group:
        return f"config: {_one_line(err)}"
    message = (f"config: {group}={option} is not an option of the config group '{group}' ({conf}/{group}/ and "
               f"hydra.searchpath); choose one of {options}")
    return message + closest_hint(option, options)


def _checked_override(override: str) -> str:
    """An override whose key the schema knows, as Hydra must read it: ``++key=value`` (set, whether or not its
    group's YAML has the key); a group choice (``task=math``, ``experiment=quick``, a group of a
    hydra.searchpath folder), a deletion and ``hydra.*`` unchanged. An unknown dotted key: ConfigError with the
    closest known key (an unknown plain word is Hydra's to refuse, see ``_hydra_error``)."""
    import dataclasses

    if override.lstrip("~").split("=", 1)[0] == "logger":  # ~logger: no loggers (the schema would put its default back)
        return "++logger=[]" if override.startswith("~") else f"++logger={_as_list(override.split('=', 1)[1])}"
    if "=" not in override or override.startswith("~"):
        return override
    key, value = override.split("=", 1)
    bare = key.lstrip("+")
    if bare == "trainer.verl.overrides":  # verl's own syntax, [a.b=1,c=d], as Hydra must read it: quoted elements
        value = _quoted_elements(value)
    if bare == "policy.name":  # the group's file carries the policy's own settings (recipe, SFT steps and lr)
        raise ConfigError(f"config: choose the policy with its group, policy={value} (policy.name={value} alone keeps "
                          "the other policy's settings: its recipe, SFT steps and learning rate; conf/policy/)")
    if bare.split(".")[0] == "hydra":
        return override
    if "." not in bare:
        if bare not in {f.name for f in dataclasses.fields(Config)} or bare in _GROUP_FIELDS:  # a config group (or an unknown word: Hydra decides)
            return override
        return f"++{bare}={value}"
    problem = schema_key_problem(bare)
    if problem:
        raise ConfigError(problem)
    return f"++{bare}={value}"


def _quoted_elements(value: str) -> str:
    """``[a.b=1,c=[x,y]]`` as ``["a.b=1","c=[x,y]"]`` (split at the commas outside brackets and quotes); a value
    that is no bracketed list, or whose elements are quoted already, unchanged."""
    text = value.strip()
    if not (text.startswith("[") and text.endswith("]")) or not text[1:-1].strip():
        return value
    parts, depth, quote, start = [], 0, "", 1
    for i, char in enumerate(text[1:-1], start=1):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:-1])
    parts = [part.strip() for part in parts]
    if all(part[:1] in "'\"" for part in parts):
        return value
    return "[" + ",".join(part if part[:1] in "'\"" else '"' + part.replace('"', '\\"') + '"' for part in parts) + "]"


def _as_list(value: str) -> str:
    """``logger=console`` or ``logger=console,tensorboard`` as the list the schema holds (``[...]`` unchanged)."""
    value = value.strip()
    return value if value.startswith("[") else "[" + value + "]"


# Config fields that are also config groups (conf/<name>/): ``task=math`` chooses a file, it sets no value
_GROUP_FIELDS = ("task", "policy", "trainer", "rollout", "agent", "harness", "search")


def _hydra_error(err: Exception) -> str:
    """Hydra's refusal as one line; an override of a key no group has names the closest known key."""

    found = re.search(r"Could not override '([^']+)'", str(err))
    problem = schema_key_problem(found.group(1)) if found else None
    return problem or f"config: {_one_line(err)}"


