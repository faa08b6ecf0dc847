"""The trusted half of code verification: find the program, read the tests, judge the runner's outcomes.

Programs come from the LAST fenced block of a response whose language tag is empty, ``python``, ``py`` or
``python3`` (the embedded task uses the bare ```` ``` ```` fence to keep responses short); a response
without one has ``no_code``.

Tests come in verl's code format (prime_code's): ``{"inputs": [...], "outputs": [...], "fn_name"?}``,
as a dict or a JSON string. Without ``fn_name`` a test is stdin -> stdout (an input or output given as a
list of lines is joined with newlines). With ``fn_name`` it is a call: an input string holds one JSON
value per line (the arguments, as prime_code reads them), an input list IS the argument list; an output
string is JSON-decoded. ``{"style": "script", "test": ..., "entry_point": ...}`` is a HumanEval record:
the program passes when ``test`` + ``check(entry_point)`` run without an error.

Comparison (in this trusted process; the sandbox never sees an expected output):

- stdout: equal after normalising line ends and trailing whitespace (each line right-stripped, blank
  lines at the start and end dropped); else equal as whitespace-separated token sequences, two tokens
  matching when identical or both numbers with |a - b| <= 1e-8 + 1e-5 |b| (numpy.allclose's tolerance,
  as prime_code). Unlike prime_code there is no order-insensitive (set) fallback.
- call results: the returned value (tuples as lists) equals the expected value, numbers compared with
  the same tolerance; an expected one-element list also matches its element (prime_code's wrapping).

Failure category of a program: ``no_code``, ``syntax_error`` (it does not compile), else that of its first
failing test in order: ``runtime_error`` (an exception, a non-zero exit, a signal, a dead server),
``timeout`` (over the per-test limit; the tests after it are skipped and fail), ``memory`` (MemoryError or
killed for memory), ``wrong_answer`` (a wrong output, or more output than the cap); None when all pass.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[ \t]*\r?\n(.*?)```", re.DOTALL)
PYTHON_TAGS = ("", "python", "py", "python3")
# the runner's per-test status -> failure category (None: ran cleanly, the output is compared next)
STATUS_CATEGORY = {"ok": None, "error": "runtime_error", "timeout": "timeout", "skipped": "timeout",
                   "memory": "memory", "output_limit": "wrong_answer"}


def extract_code(response: str) -> str | None:
    """The last complete fenced Python block of a response, or None."""
    blocks = [body for tag, body in _FENCE.findall(response or "") if tag.lower() in PYTHON_TAGS]
    return blocks[-1] if blocks and blocks[-1].strip() else None


@dataclass(frozen=True)
class TestSpec:
    style: str  # "stdio", "call" or "script"
    inputs: tuple  # stdin strings (stdio, script) or argument lists (call)
    outputs: tuple  # expected stdout strings or values; None for script
    fn_name: str | None = None
    script: str = ""  # script style: the test code appended to the program

    def __len__(self) -> int:
        return len(self.inputs)


def _lines(value: Any) -> str:
    return "\n".join(str(v) for v in value) if isinstance(value, list | tuple) else str(value)


def _args(value: Any) -> list:
    if isinstance(value, str):
        return [json.loads(line) for line in value.split("\n") if line.strip()]
    return list(value) if isinstance(value, list | tuple) else [value]


def _expected_value(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def parse_tests(ground_truth: Any) -> TestSpec:
    """Tests from verl's code ground truth (a JSON string or a dict) or a HumanEval record."""
    truth = json.loads(ground_truth) if isinstance(ground_truth, str | bytes) else dict(ground_truth)
    if not isinstance(truth, dict):
        raise ValueError(f"code ground truth must be a JSON object, got {type(truth).__name__}")
    if truth.get("style") == "script":
        entry = truth["entry_point"]
        return TestSpec("script", ("",), (None,), entry, f"\n\n{truth['test']}\n\ncheck({entry})\n")
    inputs, outputs = list(truth.get("inputs") or []), list(truth.get("outputs") or [])
    if not inputs or len(inputs) != len(outputs):
        raise ValueError(f"code ground truth needs as many inputs as outputs (>= 1), got {len(inputs)} and {len(outputs)}")
    fn_name = truth.get("fn_name") or None
    if fn_name:
        return TestSpec("call", tuple(_args(i) for i in inputs), tuple(_expected_value(o) for o in outputs), fn_name)
    return TestSpec("stdio", tuple(_lines(i) for i in inputs), tuple(_lines(o) for o in outputs))


def _numbers_close(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        try:
            return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= 1e-8 + 1e-5 * abs(b)
        except OverflowError:  # an int past float range (a program may return 3**900): only equality counts
            return a == b
    return False


def _token_match(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        return _numbers_close(float(a), float(b))
    except ValueError:
        return False


def stdout_matches(got: str, expected: str) -> bool:
    def lines(text: str) -> list[str]:
        out = [line.rstrip() for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
        while out and not out[-1]:
            out.pop()
        while out and not out[0]:
            out.pop(0)
        return out

    if lines(got) == lines(expected):
        return True
    got_tokens, expected_tokens = got.split(), expected.split()
    return len(got_tokens) == len(expected_tokens) and all(map(_token_match, got_tokens, expected_tokens))


def _values_equal(got: Any, expected: Any) -> bool:
    if isinstance(got, list) and isinstance(expected, list):
        return len(got) == len(expected) and all(map(_values_equal, got, expected))
    if isinstance(got, dict) and isinstance(expected, dict):
        return got.keys() == expected.keys() and all(_values_equal(got[k], expected[k]) for k in got)
    return got == expected or _numbers_close(got, expected)


def value_matches(got_json: str | None, expected: Any) -> bool:
    if got_json is None:
        return False
    try:
        got = json.loads(got_json)
    except ValueError:
        return False
    if _values_equal(got, expected):
        return True
    return isinstance(expected, list) and len(expected) == 1 and _values_equal(got, expected[0])


@dataclass(frozen=True)
class Judgement:
    passed: tuple[bool, ...]
    category: str | None  # of the first failing test (None when all pass)
    categories: tuple[str | None, ...]
    time_s: float
    errors: tuple[str | None, ...] = ()  # per test: the exception name, compile error or status; None if passed

    @property
    def error(self) -> str | None:
        return next((e for e in self.errors if e is not None), None)

    def slice(self, start: int, stop: int | None = None) -> Judgement:
        passed, categories = self.passed[start:stop], self.categories[start:stop]
        first = next((c for c in categories if c is not None), None)
        return Judgement(passed, first, categories, self.time_s, self.errors[start:stop])


def judge(raw: dict, spec: TestSpec) -> Judgement:
    """Compare the runner's raw outcome (``ProgramRunner.run``) with the expected outputs."""
    if raw.get("compile_error"):
        n = len(spec)
        return Judgement((False,) * n, "syntax_error", ("syntax_error",) * n, 0.0, (raw["compile_error"][:200],) * n)
    passed, categories, errors = [], [], []
    for test, expected in zip(raw["tests"], spec.outputs, strict=True):
        category = STATUS_CATEGORY[test["status"]]
        if category is None and spec.style == "stdio" and not stdout_matches(test["stdout"], expected) or category is None and spec.style == "call" and not value_matches(test["result"], expected):
            category = "wrong_answer"
        passed.append(category is None)
        categories.append(category)
        errors.append(None if category is None else test.get("exc") or category)
    first = next((c for c in categories if c is not None), None)
    return Judgement(tuple(passed), first, tuple(categories), sum(t["time_s"] for t in raw["tests"]), tuple(errors))
