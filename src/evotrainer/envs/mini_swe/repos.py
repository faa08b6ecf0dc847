"""Seeded generation of mini_swe instances: a small Python module with one injected bug, a visible test
file with at least one failing test, and hidden tests (more cases of every function) for the reward.

Difficulty (file size): 0 = one function (with its helper, if any), 1 = three, 2 = five functions in the
module; ``bug_kinds`` restricts which bugs are injected (templates.BUG_KINDS). Expected values are
computed by running the correct template code in this process (it is ours, never the policy's).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from evotrainer.envs.base import EnvError
from evotrainer.envs.mini_swe.templates import BUG_KINDS, TEMPLATES, Template

FUNCTIONS_PER_DIFFICULTY = (1, 3, 5)
MODULE_NAMES = ("calc", "helpers", "mylib", "funcs", "ops", "toolkit")
VISIBLE_CASES, HIDDEN_CASES = 2, 4

# The test runner, run as ``python -I -B -c RUNNER TEST_FILE`` inside the sandbox. With a nonce on
# stdin it ends with "RESULT <nonce> passed=P failed=F": read before the code under test is imported,
# so an edit that exits early cannot fake a pass by exit code alone.
RUNNER = r"""
import importlib.util, os, re, sys, traceback
nonce = sys.stdin.readline().strip() if not sys.stdin.isatty() else ""
sys.stdin.close()
sys.path.insert(0, os.getcwd())
path = os.path.abspath(sys.argv[1])
try:
    spec = importlib.util.spec_from_file_location("tests_under_run", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
except BaseException as exc:
    print("ERROR while importing the tests:")
    print("".join(traceback.format_exception_only(type(exc), exc)).strip())
    sys.exit(2)
names = [n for n, f in vars(module).items() if n.startswith("test_") and callable(f)]
failed = 0
for name in names:
    try:
        getattr(module, name)()
        print("PASS", name)
    except Exception as exc:
        failed += 1
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == path]
        where = f"line {frames[-1].lineno}: {frames[-1].line}" if frames else ""
        print("FAIL", name, where)
        match = re.match(r"assert (.+) == (.+)$", frames[-1].line or "") if frames else None
        if isinstance(exc, AssertionError) and match:
            try:
                print("  got", repr(eval(match.group(1), vars(module))), "expected", match.group(2))
            except Exception:
                pass
        elif not isinstance(exc, AssertionError):
            print("  " + "".join(traceback.format_exception_only(type(exc), exc)).strip())
print(f"{len(names) - failed} passed, {failed} failed")
if nonce:
    print(f"RESULT {nonce} passed={len(names) - failed} failed={failed}")
sys.exit(1 if failed else 0)
"""


@dataclass(frozen=True)
class Instance:
    seed: int
    difficulty: int
    module: str  # module name, the file is f"{module}.py"
    files: dict  # visible repository: path -> text
    hidden_tests: str  # test file text, never in the workspace before submit
    hidden_count: int  # test functions in hidden_tests
    template: str  # entry function of the bugged template
    bug_kind: str
    bug_line: int  # 1-based line in the module file
    original_line: str  # the correct text of that line
    buggy_line: str

    @property
    def module_file(self) -> str:
        return f"{self.module}.py"

    @property
    def test_file(self) -> str:
        return f"test_{self.module}.py"

    def fingerprint(self) -> str:
        """Content hash: two seeds that build the same repository share it (used to keep splits disjoint)."""
        blob = "\0".join(f"{k}\0{v}" for k, v in sorted(self.files.items())) + self.hidden_tests
        return hashlib.blake2b(blob.encode(), digest_size=12).hexdigest()


def _call(entry: str, args: tuple) -> str:
    return f"{entry}({', '.join(repr(a) for a in args)})"


def _results(code: str, entry: str, cases: list[tuple]) -> list[str]:
    namespace: dict = {}
    exec(compile(code, "<template>", "exec"), namespace)  # noqa: S102 - our own template code
    out = []
    for args in cases:
        try:
            out.append(repr(namespace[entry](*args)))
        except Exception as exc:  # a bug may raise (e.g. an index error): that case fails
            out.append(f"<{type(exc).__name__}>")
    return out


def _test_function(entry: str, cases: list[tuple], expected: list[str], suffix: str = "") -> str:
    body = "\n".join(f"    assert {_call(entry, args)} == {value}" for args, value in zip(cases, expected, strict=True))
    return f"def test_{entry}{suffix}():\n{body}\n"


def _mutate(code: str, old: str, new: str) -> tuple[str, int, str, str]:
    lines = code.split("\n")
    for i, line in enumerate(lines):
        if old in line:
            lines[i] = line.replace(old, new, 1)
            return "\n".join(lines), i, line, lines[i]
    raise ValueError(f"mutation {old!r} not found in template")


def generate(seed: int, difficulty: int = 0, bug_kinds: tuple[str, ...] | list[str] | None = None) -> Instance:
    """The instance of ``seed`` at ``difficulty``; the same arguments always give the same repository."""
    if not 0 <= difficulty < len(FUNCTIONS_PER_DIFFICULTY):
        raise EnvError(f"mini_swe: difficulty must be 0-{len(FUNCTIONS_PER_DIFFICULTY) - 1}, got {difficulty}")
    kinds = tuple(bug_kinds or BUG_KINDS)
    unknown = set(kinds) - set(BUG_KINDS)
    if unknown:
        raise EnvError(f"mini_swe: unknown bug kind(s) {sorted(unknown)}; known: {list(BUG_KINDS)}")
    rng = random.Random(f"mini_swe:{seed}:{difficulty}:{','.join(sorted(kinds))}")
    for _attempt in range(50):
        instance = _try_generate(rng, seed, difficulty, kinds)
        if instance is not None:
            return instance
    raise EnvError(f"mini_swe: no instance for seed {seed} with bug kinds {list(kinds)}")


def _try_generate(rng: random.Random, seed: int, difficulty: int, kinds: tuple[str, ...]) -> Instance | None:
    chosen: list[Template] = rng.sample(TEMPLATES, FUNCTIONS_PER_DIFFICULTY[difficulty])
    buggable = [(t, m) for t in chosen for m in t.mutations if m[0] in kinds]
    if not buggable:
        return None
    bugged, (kind, old, new) = rng.choice(buggable)
    buggy_code, line_in_template, original, buggy = _mutate(bugged.code, old, new)
    # find visible cases for the bugged function: at least one that the bug fails
    failing = None
    for _ in range(200):
        args = bugged.args(rng)
        if _results(bugged.code, bugged.entry, [args]) != _results(buggy_code, bugged.entry, [args]):
            failing = args
            break
    if failing is None:
        return None
    module = rng.choice(MODULE_NAMES)
    blocks, tests, hidden, bug_line, offset = [], [], [], 0, 0
    for template in chosen:
        code = buggy_code if template is bugged else template.code
        if template is bugged:
            bug_line = offset + line_in_template + 1
        blocks.append(code.rstrip("\n"))
        offset += code.rstrip("\n").count("\n") + 3  # the block and two blank lines
        visible = [template.args(rng) for _ in range(VISIBLE_CASES - (template is bugged))]
        if template is bugged:
            visible.insert(rng.randrange(len(visible) + 1), failing)
        extra = [template.args(rng) for _ in range(HIDDEN_CASES)]
        tests.append(_test_function(template.entry, visible, _results(template.code, template.entry, visible)))
        hidden.append(_test_function(template.entry, visible + extra,
                                     _results(template.code, template.entry, visible + extra), "_hidden"))
    entries = ", ".join(sorted(t.entry for t in chosen))
    header = f"from {module} import {entries}\n\n\n"
    files = {f"{module}.py": "\n\n\n".join(blocks) + "\n", f"test_{module}.py": header + "\n\n".join(tests)}
    return Instance(seed=seed, difficulty=difficulty, module=module, files=files,
                    hidden_tests=header + "\n\n".join(hidden), hidden_count=len(hidden), template=bugged.entry,
                    bug_kind=kind, bug_line=bug_line, original_line=original, buggy_line=buggy)
