"""A persistent sandboxed reward worker: training calls the candidate's ``compute_score`` only through it.

``RewardWorker(harness_dir)`` starts one worker per backtest (``python -I -m
evotrainer.sandbox.reward_worker``) under the sandbox of ``evotrainer.sandbox.runner``: only a staged,
read-only copy of the harness and a private scratch are visible, no network, no credentials, rlimits,
the audit hook. ``score(rows)`` sends a batch and returns ``(scores, components)``.

Protocol: length-prefixed JSON (4-byte big-endian length, UTF-8 JSON; never pickle) over two pipes
on dedicated file descriptors, so a reward that prints to stdout cannot corrupt it (stdout and
stderr go to a log file outside the sandbox's view; its tail is in error messages). Every failure is
terminal for the worker and raises ``SandboxError(message, label)``:

- ``reward_error``: an exception in ``compute_score`` (message ends with its traceback), a score that
  is NaN, infinite, non-numeric or missing, or a reward module that does not import;
- ``sandbox_timeout``: a batch (or the start-up) past its deadline, e.g. a reward that sleeps forever;
- ``sandbox_memory``: MemoryError under the address-space limit;
- ``sandbox_violation``: an operation the sandbox refuses (fork, write outside, socket...);
- ``sandbox_bad_output``: a malformed or oversized reply (replies are parsed by
  ``evotrainer.sandbox.outputs.loads_json``: depth bounded, numbers finite and within 64 bits);
- ``sandbox_crash``: the worker died (segfault, abort, ``os._exit``, closed its protocol descriptors).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

_HEADER = struct.Struct(">I")
MAX_MESSAGE = 256 << 20
_WORKER_LABELS = ("reward_error", "sandbox_memory", "sandbox_violation")


def _send(fd: int, message: dict, deadline: float | None = None) -> None:
    data = json.dumps(message, allow_nan=False, default=_plain).encode()
    data = _HEADER.pack(len(data)) + data
    while data:
        if deadline is not None:
            _wait(fd, deadline, write=True)
        try:
            data = data[os.write(fd, data):]
        except BlockingIOError:  # the parent's end is non-blocking: select said some room, not how much
            continue


def _plain(value):
    """numpy scalars and arrays in rows (extra_info) as JSON values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _wait(fd: int, deadline: float, write: bool = False) -> None:
    left = deadline - time.monotonic()
    ready = select.select([], [fd], [], max(left, 0))[1] if write else select.select([fd], [], [], max(left, 0))[0]
    if not ready:
        raise TimeoutError


def _read_exact(fd: int, size: int, deadline: float | None) -> bytes | None:
    chunks, left = [], size
    while left:
        if deadline is not None:
            _wait(fd, deadline)
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _receive(fd: int, deadline: float | None = None, bounded: bool = True) -> dict | None:
    """The next message, or None at end of file; ValueError for a malformed one (``bounded``: parsed by the
    sandbox-output parser, SandboxError("...", "sandbox_bad_output") for one it refuses)."""
    header = _read_exact(fd, _HEADER.size, deadline)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > MAX_MESSAGE:
        raise ValueError(f"message of {size} bytes is larger than {MAX_MESSAGE}")
    body = _read_exact(fd, size, deadline)
    if body is None:
        return None
    if bounded:
        from evotrainer.sandbox.outputs import loads_json

        message = loads_json(body, "the reward worker's reply", max_depth=32)
    else:
        message = json.loads(body)
    if not isinstance(message, dict):
        raise ValueError("message is not a JSON object")
    return message


class RewardWorker:
    """``with RewardWorker(harness) as worker: scores, components = worker.score(rows)``.

    rows: dicts with data_source, solution_str, ground_truth, extra_info (a JSON-able dict).
    timeout_s: deadline per batch; limits: address space / file size / processes of the worker;
    cpu_s: CPU seconds over the worker's whole life; isolation: auto | os | process (None: the default).
    """

    def __init__(self, harness_dir: str | Path, *, timeout_s: float = 60.0, memory_mb: int = 4096,
                 cpu_s: float = 6 * 3600, isolation: str | None = None, startup_timeout_s: float = 60.0):
        from evotrainer.sandbox.runner import Limits

        self.harness_dir = Path(harness_dir)
        self.timeout_s, self.cpu_s, self.isolation = timeout_s, cpu_s, isolation
        self.startup_timeout_s = startup_timeout_s
        self.limits = Limits(timeout_s=timeout_s, memory_mb=memory_mb)
        self.proc = self._dirs = self._log = self._failure = None
        self.scratch: Path | None = None  # the worker's private writable directory (its disk use is measured from outside)
        self._request = self._reply = None
        self.startup_s = float("nan")

    def __enter__(self) -> RewardWorker:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        began = time.perf_counter()
        try:
            self._launch()
            self._call({"hello": True}, self.startup_timeout_s, "start-up")
        except BaseException:
            self.close()
            raise
        self.startup_s = time.perf_counter() - began

    def _launch(self) -> None:
        from evotrainer.sandbox.interpreter import python_module
        from evotrainer.sandbox.runner import sandbox_dirs, sandbox_popen

        self._dirs = sandbox_dirs(self.harness_dir)
        work, staged = self._dirs.__enter__()
        self.scratch = work
        self._log = open(work.parent / "worker.log", "w+b")  # noqa: SIM115 - lives as long as the worker
        request_r, self._request = os.pipe()
        self._reply, reply_w = os.pipe()
        try:
            self.proc = sandbox_popen(  # a supervisor.Child: Popen-like, killed with its whole tree
                [*python_module("evotrainer.sandbox.reward_worker"), str(staged), str(work),
                 str(request_r), str(reply_w)],
                workdir=work, readable=[staged], limits=self.limits, isolation=self.isolation, cpu_s=self.cpu_s,
                stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log, pass_fds=(request_r, reply_w))
        finally:
            os.close(request_r)
            os.close(reply_w)
        os.set_blocking(self._request, False)

    def score(self, rows: list[dict]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        scores, components, _ = self._score(rows, turns=False)
        return scores, components

    def score_turns(self, rows: list[dict]) -> tuple[np.ndarray, dict[str, np.ndarray], list[list[float] | None]]:
        """``score`` plus each row's turn-level credit (``turn_rewards``: None or a list of floats), re-checked
        here in the trusted process."""
        return self._score(rows, turns=True)

    def _score(self, rows: list[dict], turns: bool):
        batch = self.score_batch(rows, turns)
        return batch.scores, dict(batch.components), batch.turn_lists()

    def score_batch(self, rows: list[dict], turns: bool = False):
        """The reply to a batch as the door types it (``door.reward_reply``: a ``RewardBatch``); a reply of any
        other shape fails the worker with ``reward_error``."""
        from evotrainer.sandbox import door
        from evotrainer.sandbox.runner import SandboxError

        reply = self._call({"rows": rows, "turns": turns}, self.timeout_s, f"a batch of {len(rows)} rows")
        try:
            return door.reward_reply(reply, len(rows), turns)
        except SandboxError as err:
            self._fail(str(err), err.label)

    def _call(self, message: dict, timeout_s: float, what: str) -> dict:
        from evotrainer.contracts.text import bounded_text
        from evotrainer.sandbox.runner import SandboxError

        if self._failure is not None:
            raise self._failure
        if self.proc is None:
            raise RuntimeError("RewardWorker is not started (use it as a context manager)")
        deadline = self.proc.set_deadline(timeout_s)  # this call's; the worker has none between calls
        try:
            _send(self._request, message, deadline)
            reply = _receive(self._reply, deadline)
        except TimeoutError:
            self.proc.kill("deadline")
            self._fail(f"the reward worker did not answer {what} within {timeout_s:g} s", "sandbox_timeout")
        except SandboxError as err:  # refused by the bounded parser
            self._fail(f"the reward worker sent a malformed reply: {err}", err.label)
        except (ValueError, RecursionError, OverflowError, MemoryError) as err:  # e.g. an oversized header
            self._fail(bounded_text(f"the reward worker sent a malformed reply: {type(err).__name__}: {err}", 2000),
                       "sandbox_bad_output")
        except (BrokenPipeError, OSError):
            reply = None
        finally:
            self.proc.set_deadline(None)
        if reply is None:
            self._died()
        if not reply.get("ok"):
            label = reply.get("label") if reply.get("label") in _WORKER_LABELS else "sandbox_violation"
            self._fail(bounded_text(reply.get("message", "the reward failed"), 8000), label)
        return reply

    def _died(self) -> None:
        from evotrainer.sandbox.runner import exit_error

        # still running with its descriptors closed after 5 s: killed
        code = (self.proc.wait_outcome(timeout=5) or self.proc.kill()).returncode
        error = exit_error(code, self._tail(), self.limits) if code else None
        if error is not None and error.label == "sandbox_timeout":
            error.args = (f"the reward worker ran out of its {self.cpu_s:g} CPU seconds",)
        self._fail(str(error) if error else f"the reward worker exited (status {code}): {self._tail()}",
                   error.label if error else "sandbox_crash")

    def _fail(self, message: str, label: str):
        from evotrainer.sandbox.runner import SandboxError

        self._failure = SandboxError(message, label)
        self._stop()
        raise self._failure

    def _tail(self) -> str:
        self._log.flush()
        self._log.seek(max(0, os.fstat(self._log.fileno()).st_size - 2000))
        lines = self._log.read().decode(errors="replace").strip().splitlines()
        return lines[-1][:500] if lines else "(no output)"

    def _stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        for fd in (self._request, self._reply):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._request = self._reply = None

    def close(self) -> None:
        """Stop the worker (end of file on its request pipe, then a kill) and remove its scratch."""
        if self.proc is not None and self._request is not None and self.proc.poll() is None:
            os.close(self._request)
            self._request = None
            self.proc.wait_outcome(timeout=2)
        self._stop()
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._dirs is not None:
            self._dirs.__exit__(None, None, None)
            self._dirs = None


# ---------------------------------------------------------------- the sandboxed side


def _failure(label: str) -> dict:
    import traceback

    return {"ok": False, "label": label, "message": traceback.format_exc()[-6000:]}


def main() -> int:
    harness, workdir, request, reply = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    import traceback  # noqa: F401 - loaded before the guard, for _failure

    from evotrainer.contracts.harness import load_module, score_rows
    from evotrainer.sandbox.worker import SandboxViolation, install_guard

    install_guard(workdir)
    try:
        reward = load_module(harness, "reward").compute_score
        answer = {"ok": True}
    except SandboxViolation:
        answer, reward = _failure("sandbox_violation"), None
    except BaseException:  # noqa: BLE001 - any failure to import is the candidate's
        answer, reward = _failure("reward_error"), None
    while True:
        message = _receive(request, bounded=False)  # the trusted side's requests
        if message is None:
            return 0
        if reward is not None and "rows" in message:
            try:
                turn_rewards = [] if message.get("turns") else None
                scores, components = score_rows(reward, message["rows"], turn_rewards)  # the contract's own loop
                answer = {"ok": True, "scores": scores, "components": components, "turn_rewards": turn_rewards}
            except SandboxViolation:
                answer = _failure("sandbox_violation")
            except OSError as err:  # RLIMIT_FSIZE shows as EFBIG (Python ignores SIGXFSZ)
                answer = _failure("sandbox_violation" if err.errno == errno.EFBIG else "reward_error")
            except MemoryError:
                answer = {"ok": False, "label": "sandbox_memory", "message": "MemoryError in compute_score"}
            except BaseException:  # noqa: BLE001 - SystemExit too: the candidate's failure
                answer = _failure("reward_error")
        _send(reply, answer)


if __name__ == "__main__":
    sys.exit(main())
