"""The one door for what a sandboxed harness returns: one function per channel turns a parsed sandbox output
(whatever JSON, a ``.npy`` array or a parquet frame can hold) into a typed, bounded value, or raises
``SandboxError`` with that channel's failure label. Trusted code never sees the raw value: ``run_tasks``
(sandbox/runner.py) and the reward worker's client (sandbox/reward_worker.py) call these before they return,
and they return only what comes out of here.

| channel            | from                                  | typed value                    | label on anything else |
|--------------------|---------------------------------------|--------------------------------|------------------------|
| findings           | ``diagnose()`` (out_findings.json)    | ``tuple[Finding, ...]``        | sandbox_bad_output     |
| rewards            | ``compute_score`` (the worker's reply, | ``RewardBatch``: scores,       | reward_error           |
|                    | or the score task's out_scores.parquet)| components, turn rewards      |                        |
| curriculum weights | ``prompt_weights`` (out_weights.npy)  | read-only float64 array        | curriculum_error       |
| program outcomes   | a policy-written program, run by the  | the outcome ``ProgramRunner``  | the test's ``error``   |
|                    | code task's verification server       | documents, each field bounded  | status (``exc`` says)  |

(Environment settings are not a sandbox output: ``env.yaml`` is data, parsed and schema-checked by trusted code,
``contracts.harness.check_env``, at the candidate check and wherever it is read.)

Bounds, beyond types: every number finite and within ``MAX_ABS_REWARD`` for rewards (a reward of 1e300 turns a
group's advantages into NaN), at most ``MAX_COMPONENTS`` reward components named by short printable strings
(each becomes an evidence column), exact lengths (one score per row, one weight per pool row, at most
``MAX_TURN_REWARDS`` turn rewards per row), findings as ``contracts.findings`` bounds them. Curriculum weights
come back scaled to a maximum of 1 (sampling is scale-free; sums and squares then cannot overflow).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from evotrainer.contracts.findings import Finding, FindingsError, parse_findings
from evotrainer.contracts.harness import MAX_TURN_REWARDS
from evotrainer.sandbox.errors import SandboxError
from evotrainer.sandbox.outputs import json_depth

FINDINGS_LABEL = "sandbox_bad_output"
REWARD_LABEL = "reward_error"
WEIGHTS_LABEL = "curriculum_error"
MAX_ABS_REWARD = 1e6
MAX_COMPONENTS = 64
MAX_COMPONENT_NAME = 64
MAX_FINDING_SETS = 1024


def _frozen(array: np.ndarray) -> np.ndarray:
    array = np.array(array, dtype=np.float64)  # a copy this module owns
    array.setflags(write=False)
    return array


@dataclass(frozen=True)
class RewardBatch:
    """A batch's rewards as trusted code gets them: one finite score per row, named components of the same
    length, and per row None or the turn-level credit (a tuple of finite numbers)."""

    scores: np.ndarray
    components: Mapping[str, np.ndarray] = field(default_factory=dict)
    turn_rewards: tuple[tuple[float, ...] | None, ...] = ()

    def turn_lists(self) -> list[list[float] | None]:
        return [None if t is None else list(t) for t in self.turn_rewards]


# ------------------------------------------------------------------------------------------------ findings


def findings(raw, where: str = "diagnostics.py") -> tuple[Finding, ...]:
    """What ``diagnose()`` returned, checked (contracts.findings); sandbox_bad_output otherwise."""
    try:
        return parse_findings(raw, where)
    except FindingsError as err:
        raise SandboxError(f"unusable findings: {err}", FINDINGS_LABEL) from None


def finding_sets(raw, sets: int, where: str = "diagnostics.py") -> tuple[tuple[Finding, ...], ...]:
    """One findings list per evidence set (``run_tasks`` with ``diagnose_sets``)."""
    if not isinstance(raw, list) or len(raw) != sets or sets > MAX_FINDING_SETS:
        got = f"a list of {len(raw)}" if isinstance(raw, list) else type(raw).__name__
        raise SandboxError(f"unusable findings: expected one list per evidence set ({sets}), got {got}",
                           FINDINGS_LABEL)
    return tuple(findings(item, f"{where} (set {i})") for i, item in enumerate(raw))


# ------------------------------------------------------------------------------------------------ rewards


def _reward_error(message: str) -> SandboxError:
    return SandboxError(f"the reward returned an unusable score: {message}", REWARD_LABEL)


def _numbers(values, n: int, what: str) -> np.ndarray:
    """``n`` finite numbers within MAX_ABS_REWARD (a list of JSON numbers, or an array)."""
    if isinstance(values, np.ndarray):
        if values.ndim != 1 or values.dtype.kind not in "fiu":
            raise _reward_error(f"{what}: expected {n} numbers, got a {values.ndim}-D {values.dtype} array")
        values = values.tolist()
    if not isinstance(values, list | tuple) or len(values) != n:
        got = f"{len(values)} values" if isinstance(values, list | tuple) else type(values).__name__
        raise _reward_error(f"{what}: expected {n} values, got {got}")
    if any(isinstance(v, bool) or not isinstance(v, int | float) for v in values):
        bad = next(v for v in values if isinstance(v, bool) or not isinstance(v, int | float))
        raise _reward_error(f"{what}: a value of type {type(bad).__name__} is not a number")
    try:
        array = np.asarray(values, dtype=np.float64)
    except OverflowError:
        raise _reward_error(f"{what}: an integer beyond a float's range") from None
    if not np.isfinite(array).all():
        raise _reward_error(f"{what}: NaN or infinite value")
    if len(array) and np.abs(array).max() > MAX_ABS_REWARD:
        raise _reward_error(f"{what}: {np.abs(array).max():.3g} is beyond the bound of ±{MAX_ABS_REWARD:g}")
    return _frozen(array)


def component_name(key) -> str:
    """A reward component's name: a short printable string (it becomes the evidence column ``rc_<name>``)."""
    if not isinstance(key, str) or not key or len(key) > MAX_COMPONENT_NAME or not key.isprintable():
        shown = repr(key)[:80]
        raise _reward_error(f"component name {shown} must be a printable string of 1 to {MAX_COMPONENT_NAME} "
                            "characters")
    return key


def components(raw, n: int) -> dict[str, np.ndarray]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise _reward_error(f"components: expected a mapping of name -> values, got {type(raw).__name__}")
    if len(raw) > MAX_COMPONENTS:
        raise _reward_error(f"{len(raw)} components (at most {MAX_COMPONENTS})")
    return {component_name(key): _numbers(values, n, f"component {key!r}") for key, values in raw.items()}


def turn_rewards(raw, n: int) -> tuple[tuple[float, ...] | None, ...]:
    """Per row None or at most MAX_TURN_REWARDS finite numbers within the bound."""
    if not isinstance(raw, list | tuple) or len(raw) != n:
        got = f"{len(raw)} entries" if isinstance(raw, list | tuple) else type(raw).__name__
        raise _reward_error(f"turn_rewards: expected {n} entries, got {got}")
    out: list[tuple[float, ...] | None] = []
    for i, row in enumerate(raw):
        if row is None:
            out.append(None)
            continue
        if not isinstance(row, list | tuple) or len(row) > MAX_TURN_REWARDS:
            got = f"{len(row)} values" if isinstance(row, list | tuple) else type(row).__name__
            raise _reward_error(f"turn_rewards of row {i}: expected at most {MAX_TURN_REWARDS} numbers, got {got}")
        out.append(tuple(_numbers(list(row), len(row), f"turn_rewards of row {i}").tolist()))
    return tuple(out)


def reward_reply(reply, n: int, turns: bool) -> RewardBatch:
    """The reward worker's reply to a batch of ``n`` rows (a parsed JSON object; keys other than these ignored)."""
    if not isinstance(reply, Mapping):
        raise _reward_error(f"the reply is a {type(reply).__name__}, not an object")
    return RewardBatch(scores=_numbers(reply.get("scores"), n, "score"), components=components(reply.get("components"), n),
                       turn_rewards=turn_rewards(reply.get("turn_rewards"), n) if turns else (None,) * n)


def score_table(frame, n: int | None, prefix: str = "rc_") -> RewardBatch:
    """The score task's table (out_scores.parquet, already parsed by ``outputs.read_frame``): a ``score`` column
    and one ``<prefix><name>`` column per component."""
    columns = [str(c) for c in frame.columns]
    rows = len(frame) if n is None else n
    extra = [c for c in columns if c != "score" and not c.startswith(prefix)]
    if extra:
        raise _reward_error(f"the scores table has unknown columns {extra[:5]}")
    parts = {c[len(prefix):]: frame[c].to_numpy() for c in columns if c.startswith(prefix)}
    if "score" not in columns:
        raise _reward_error("the scores table has no 'score' column")
    return RewardBatch(scores=_numbers(frame["score"].to_numpy(), rows, "score"), components=components(parts, rows),
                       turn_rewards=(None,) * rows)


# ------------------------------------------------------------------------------------------------ curriculum


def curriculum_weights(raw, pool_rows: int) -> np.ndarray:
    """One finite, non-negative weight per pool row, not all zero; returned scaled to a maximum of 1."""
    array = raw if isinstance(raw, np.ndarray) else None
    if (array is None or array.ndim != 1 or array.dtype.kind not in "fiu" or len(array) != pool_rows
            or not np.isfinite(array).all() or (array < 0).any() or not (array > 0).any()):
        shape = f"shape {array.shape}, dtype {array.dtype}" if array is not None else type(raw).__name__
        raise SandboxError(f"curriculum.prompt_weights returned an invalid array ({shape}); it must return one "
                           f"finite, non-negative weight per pool row ({pool_rows}), not all zero", WEIGHTS_LABEL)
    array = array.astype(np.float64)
    return _frozen(array / array.max())


# ------------------------------------------------------------------------------------------------ program outcomes

PROGRAM_STATUSES = ("ok", "error", "timeout", "skipped", "memory", "output_limit")
MAX_RESULT_DEPTH = 64  # a call-style test's return value, as JSON text: the judge parses it (recursively)
MAX_TEST_SECONDS = 1e6
_TEXT_FIELDS = ("stdout", "stderr")


def _program_error(exc: str) -> dict:
    return {"status": "error", "time_s": 0.0, "stdout": "", "stderr": "", "result": None, "exit": None,
            "signal": None, "exc": exc}


def _small_int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and -(2**31) <= value < 2**31 else None


def program_test(raw, output_limit: int) -> dict:
    """One test's outcome, every field of the documented type and bound. A value the program could shape
    (its return value as JSON text, its output) that breaks a bound turns the test into an ``error`` whose
    ``exc`` says which bound."""
    if not isinstance(raw, Mapping):
        return _program_error("BadOutcome")
    status = raw.get("status") if raw.get("status") in PROGRAM_STATUSES else None
    if status is None:
        return _program_error("BadOutcome")
    seconds = raw.get("time_s", 0.0)
    seconds = float(seconds) if isinstance(seconds, int | float) and not isinstance(seconds, bool) else -1.0
    out = {"status": status, "time_s": seconds if 0.0 <= seconds <= MAX_TEST_SECONDS else 0.0,
           "result": None, "exit": _small_int(raw.get("exit")), "signal": _small_int(raw.get("signal")),
           "exc": raw["exc"][:200] if isinstance(raw.get("exc"), str) else None}
    for key in _TEXT_FIELDS:
        text = raw.get(key, "")
        out[key] = text if isinstance(text, str) and len(text) <= 4 * output_limit else ""
    result = raw.get("result")
    if result is not None:
        if not isinstance(result, str) or len(result) > output_limit:
            return out | {"status": "error", "exc": "ResultTooLarge"}
        if json_depth(result.encode("utf-8", "surrogatepass")) > MAX_RESULT_DEPTH:
            return out | {"status": "error", "exc": "ResultTooDeep"}
        out["result"] = result
    return out


def program_outcome(raw, tests: int, output_limit: int) -> dict:
    """The verification server's reply for ``tests`` tests as ``ProgramRunner.run`` documents it (a compile error
    and no tests, or one outcome per test); a reply of another shape makes every test an ``error`` (``exc``
    "BadOutcome"), so the judge never reads a raw one."""
    if isinstance(raw, Mapping) and isinstance(raw.get("compile_error"), str) and raw["compile_error"]:
        return {"compile_error": raw["compile_error"][:4000], "tests": []}  # nothing ran
    if not isinstance(raw, Mapping) or not isinstance(raw.get("tests"), list) or len(raw["tests"]) != tests:
        return {"compile_error": None, "tests": [_program_error("BadOutcome") for _ in range(tests)]}
    return {"compile_error": None, "tests": [program_test(test, output_limit) for test in raw["tests"]]}
