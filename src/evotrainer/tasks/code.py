"""``task=code``: programs scored by running them against hidden tests in the sandbox.

Sources (``task.source``):

- ``embedded`` (default): write a one-line Python function from three input/output examples
  (``code_data.procedural``: graded difficulty, five hidden tests on other inputs, so hard-coding the
  visible examples is detectable), generated in code from the seed; the tiny policy can learn it.
- ``verl``: your verl-format code parquet in ``task.data_dir`` (train/val/test.parquet, as for
  ``task=math``; data_source codecontests / apps / taco / codeforces; ``reward_model.ground_truth`` is
  prime_code's JSON ``{"inputs", "outputs", "fn_name"?}``). All its tests are hidden.
- ``humaneval``: the 164 HumanEval problems as an evaluation set (all in the test split).

``verify(response, ground_truth, metadata)`` extracts the last fenced Python block, runs it in the
persistent sandboxed server (``sandbox.program_runner``) on the row's visible tests (``metadata["visible"]``,
where the task has them) and hidden tests (the ground truth) in one child, and judges the outcomes here
(``code_data.judge``: comparison rules and failure categories). ``correct`` = every hidden test passes;
``details`` = {passed, total, exec_time_s, error, visible_passed, visible_total (only with visible tests),
server_died (only when true)}. The policy never sees the hidden tests; the sandbox never sees any output.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import queue
import threading
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from evotrainer.contracts.config_fields import path_field
from evotrainer.contracts.task import Task, TaskError, Verification, messages, metadata_of
from evotrainer.sandbox.program_runner import ProgramRunner
from evotrainer.tasks.code_data import humaneval, procedural
from evotrainer.tasks.code_data.judge import TestSpec, extract_code, judge, parse_tests
from evotrainer.tasks.harnesses import complete, with_recipe_values

HARNESS = Path(__file__).parent / "harnesses" / "code"
SOURCES = ("embedded", "verl", "humaneval")
TIME_LIMIT_S = {"embedded": 1.0, "verl": 4.0, "humaneval": 3.0}
MAX_RESPONSE_LEN = {"embedded": 32, "verl": 2048, "humaneval": 1024}


class RunnerPool:
    """Up to ``size`` persistent verification servers shared by the threads of one process."""

    def __init__(self, size: int, **runner_options):
        self.size, self.options = max(1, int(size)), runner_options
        self._free: queue.LifoQueue[ProgramRunner] = queue.LifoQueue()
        self._all: list[ProgramRunner] = []
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def runner(self) -> Iterator[ProgramRunner]:
        try:
            runner = self._free.get_nowait()
        except queue.Empty:
            with self._lock:
                runner = ProgramRunner(**self.options) if len(self._all) < self.size else None
                if runner is not None:
                    self._all.append(runner)
            runner = runner or self._free.get()
        try:
            yield runner
        finally:
            self._free.put(runner)

    def start(self) -> list[ProgramRunner]:
        """Start every server now (else each starts on first use, ~0.3 s)."""
        with contextlib.ExitStack() as stack:
            for _ in range(self.size if len(self._all) < self.size else 0):  # hold all: new ones start
                stack.enter_context(self.runner()).run("pass", [""])
        return list(self._all)

    def close(self) -> None:
        for runner in self._all:
            runner.close()


_POOLS: dict[tuple, RunnerPool] = {}
_POOLS_LOCK = threading.Lock()


def runner_pool(size: int = 2, **options) -> RunnerPool:
    """The process-wide pool for these runner options (servers start on first use, stop at exit)."""
    key = (size, *sorted(options.items()))
    with _POOLS_LOCK:
        if key not in _POOLS:
            _POOLS[key] = RunnerPool(size, **options)
        return _POOLS[key]


@atexit.register
def _close_pools() -> None:
    for pool in _POOLS.values():
        pool.close()


@dataclass
class CodeConfig:
    """``task.data_dir`` (source=verl), ``task.weights`` (source=embedded) (conf/task/code.yaml); the rest
    (source, time_limit_s, memory_mb, workers, ...) comes as ``task.options``."""

    data_dir: str | None = path_field(  # source=verl: a folder with train/val/test.parquet in verl's format
        holds=("train.parquet", "test.parquet"), what="verl-format code parquet files (val.parquet optional)")
    weights: list[float] = field(default_factory=list)  # sampling weight of each embedded difficulty level; empty = default


class CodeTask(Task):
    """Programs verified by executing hidden tests in the OS sandbox (embedded functions, verl code, HumanEval)."""

    name = "code"
    description = "programs run against hidden tests in the sandbox: one-line functions (embedded), verl code, HumanEval"
    supports = frozenset({"single_turn", "code_execution"})  # programs run against hidden tests in the sandbox
    Config = CodeConfig

    def __init__(self, source: str = "embedded", data_dir: str | Path | None = None, weights: Any = None,
                 time_limit_s: float | None = None, memory_mb: int = 256, workers: int = 2,
                 isolation: str | None = None, prelude: bool | None = None):
        if source not in SOURCES:
            raise TaskError(f"task.source={source!r}: use one of {list(SOURCES)}")
        self.source = source
        self.max_response_len = MAX_RESPONSE_LEN[source]
        self.weights = tuple(float(w) for w in (weights or procedural.DEFAULT_WEIGHTS))  # per difficulty level
        self.prelude = source == "verl" if prelude is None else bool(prelude)  # prime_code's implicit imports
        self.alphabet = procedural.ALPHABET if source == "embedded" else None
        self._pool_options = {"size": workers, "time_limit_s": float(time_limit_s or TIME_LIMIT_S[source]),
                              "memory_mb": int(memory_mb), "isolation": isolation}
        self._verl = None
        if source == "verl":
            from evotrainer.tasks.math import MathTask

            if not data_dir:
                raise TaskError("task.data_dir is required for task=code source=verl: a folder with train.parquet, "
                                "val.parquet, test.parquet in verl's format (code ground truth in reward_model)")
            self._verl = MathTask(data_dir)  # the same verl parquet reading and disjoint sampling
        self._cache: OrderedDict[tuple, Verification] = OrderedDict()
        self._cache_lock = threading.Lock()

    # ------------------------------------------------------------------ data
    def splits(self, sizes: dict[str, int], seed: int) -> dict[str, pd.DataFrame]:
        if self._verl is not None:
            return self._verl.splits(sizes, seed)
        if self.source == "humaneval":
            rows = [{"prompt_id": r["task_id"].replace("/", "-"), "prompt": messages(humaneval.INSTRUCTION + r["prompt"]),
                     "ground_truth": humaneval.ground_truth(r), "data_source": "humaneval", "difficulty": 0,
                     "metadata": json.dumps({"reference": humaneval.reference(r)})} for r in humaneval.records()]
            return {split: pd.DataFrame(rows if split == "test" else [], columns=list(rows[0])).head(size)
                    .astype({"difficulty": "int64"}) for split, size in sizes.items()}
        out = {}
        for split, rows in procedural.make_splits(dict(sizes), seed, self.weights).items():
            out[split] = pd.DataFrame({
                "prompt_id": [r["prompt_id"] for r in rows],
                "prompt": [messages(r["prompt"]) for r in rows],
                "ground_truth": [r["ground_truth"] for r in rows],
                "data_source": procedural.DATA_SOURCE,
                "difficulty": pd.Series([r["level"] for r in rows], dtype="int64"),
                "metadata": [json.dumps({"level": r["level"], "visible": r["visible"], "solution": r["expression"]})
                             for r in rows],
            })
        return out

    def reference_response(self, row: dict) -> str | None:
        meta = metadata_of(row.get("metadata"))
        if "solution" in meta and self.source == "embedded":
            return procedural.response(meta["solution"])
        if "reference" in meta:
            return meta["reference"]
        for key in ("solution", "solutions"):  # verl code data sometimes carries reference programs
            value = meta.get(key)
            value = value[0] if isinstance(value, list) and value else value
            if isinstance(value, str) and value.strip():
                return "```python\n" + value.strip() + "\n```"
        return None

    def default_harness(self) -> Path:
        harness = complete(HARNESS)  # recipe, reward, diagnostics of its own; the generic curriculum
        if self.source == "embedded":
            return harness
        # real programs are longer than the embedded one-liners: the recipe's response length follows the source
        return with_recipe_values(harness, {"max_response_len": self.max_response_len})

    def interventions(self) -> tuple:
        from evotrainer.tasks.code_interventions import CODE_CATALOGUE

        return CODE_CATALOGUE

    def gates(self) -> list:
        from evotrainer.tasks.code_data.gates import reward_rose_hidden_fell

        return [reward_rose_hidden_fell]

    # ------------------------------------------------------------------ verification
    def verify(self, response: str, ground_truth: str, metadata: dict | None = None) -> Verification:
        meta = metadata_of(metadata)
        try:
            spec = parse_tests(ground_truth)
            visible = parse_tests(meta["visible"]) if meta.get("visible") else None
        except (ValueError, KeyError, TypeError) as err:
            raise TaskError(f"task=code: unreadable tests ({type(err).__name__}: {err}); the ground truth must be "
                            "verl's code JSON {inputs, outputs, fn_name?} or a HumanEval record") from err
        code = extract_code(response)
        if code is None:
            return Verification(False, False, None, "no_code", _details(spec, visible, None, 0.0))
        key = (code, str(ground_truth), json.dumps(meta.get("visible"), sort_keys=True))
        with self._cache_lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        result = self._run(code, spec, visible, ground_truth)
        with self._cache_lock:
            self._cache[key] = result
            if len(self._cache) > 50_000:
                self._cache.popitem(last=False)
        return result

    def verify_many(self, responses: list[str], ground_truths: list[str], metadatas: list | None = None) -> list[Verification]:
        """``verify`` over many responses, on up to ``workers`` servers in parallel."""
        metadatas = metadatas if metadatas is not None else [None] * len(responses)
        with ThreadPoolExecutor(self._pool_options["size"]) as pool:
            return list(pool.map(self.verify, responses, ground_truths, metadatas))

    def _run(self, code: str, spec: TestSpec, visible: TestSpec | None, ground_truth: Any) -> Verification:
        program = code
        if spec.style == "script":
            truth = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
            program = humaneval.with_prompt(code, truth) + spec.script
        together = visible is not None and visible.style == spec.style and visible.fn_name == spec.fn_name
        pool = runner_pool(**self._pool_options)
        with pool.runner() as runner:
            raw = runner.run(program, list((visible.inputs if together else ()) + spec.inputs), style=spec.style,
                             fn_name=spec.fn_name, prelude=self.prelude and spec.style != "script")
            seen = None
            if visible is not None and not together:
                seen = judge(runner.run(code, list(visible.inputs), style=visible.style, fn_name=visible.fn_name,
                                        prelude=self.prelude), visible)
        n_visible = len(visible) if together else 0
        both = judge(raw, TestSpec(spec.style, (visible.inputs if together else ()) + spec.inputs,
                                   (visible.outputs if together else ()) + spec.outputs, spec.fn_name))
        hidden = both.slice(n_visible)
        seen = both.slice(0, n_visible) if together else seen
        details = _details(spec, visible, hidden, both.time_s, seen)
        if raw.get("server_died"):
            details["server_died"] = True
        correct = all(hidden.passed)
        return Verification(correct, True, code, None if correct else hidden.category or "wrong_answer", details)


def reward_outcome(verification: Verification) -> dict:
    """``extra_info["verification"]`` for the code harness's reward (docs/code-domain.md)."""
    return {"correct": verification.correct, "format_ok": verification.format_ok,
            "failure_category": verification.failure_category, **verification.details}


def _details(spec: TestSpec, visible: TestSpec | None, hidden, exec_time_s: float, seen=None) -> dict:
    out = {"passed": int(sum(hidden.passed)) if hidden else 0, "total": len(spec), "exec_time_s": round(exec_time_s, 6),
           "error": hidden.error if hidden else None,
           # per hidden test, in order: "passed" or its failure category (empty when no program was found)
           "outcomes": ["passed" if c is None else c for c in hidden.categories] if hidden else []}
    if visible is not None:
        out |= {"visible_passed": int(sum(seen.passed)) if seen else 0, "visible_total": len(visible)}
    return out
