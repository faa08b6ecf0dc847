"""The sandboxed side of evotrainer.sandbox: `python -I -m evotrainer.sandbox_worker HARNESS WORKDIR TASK...`.

Installs an audit hook first (it cannot be removed afterwards), then imports the harness modules.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

EXIT_VIOLATION, EXIT_MEMORY = 3, 4
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_FORBIDDEN_EVENTS = {"socket.connect", "socket.bind", "socket.getaddrinfo", "subprocess.Popen", "os.system",
                     "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "pty.spawn"}


class SandboxViolation(PermissionError):
    pass


def install_guard(workdir: Path) -> None:
    root = str(workdir.resolve())

    def writable(path) -> bool:
        try:
            real = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return False
        return real == root or real.startswith(root + os.sep)

    def hook(event: str, args: tuple) -> None:
        if event == "open" and len(args) >= 3:
            path, mode, flags = args[0], args[1], args[2]
            wants_write = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE_FLAGS)
            if wants_write and isinstance(path, str | bytes | os.PathLike) and not writable(path):
                raise SandboxViolation(f"write outside the sandbox directory: {path!r}")
        elif event in ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "shutil.rmtree") and args:
            if not writable(args[0]):
                raise SandboxViolation(f"{event} outside the sandbox directory: {args[0]!r}")
        elif event in _FORBIDDEN_EVENTS:
            raise SandboxViolation(f"{event} is not allowed in harness code")

    sys.addaudithook(hook)


def main() -> int:
    harness, workdir, tasks = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
    import json

    import numpy as np
    import pandas as pd  # imported before the guard: their import-time caches are not harness writes

    install_guard(workdir)
    try:
        from evotrainer.harness import load_module

        frames = {p.stem[3:]: pd.read_parquet(p) for p in workdir.glob("in_*.parquet")}
        blobs = {p.stem[3:]: json.loads(p.read_text()) for p in workdir.glob("in_*.json")}
        if "score" in tasks:
            reward = load_module(harness, "reward").compute_score
            rows = frames["rows"]
            scores, components = [], {}
            for i, (source, response, truth, pid, level) in enumerate(zip(
                    rows["data_source"], rows["response"], rows["ground_truth"], rows["prompt_id"], rows["level"],
                    strict=True)):
                value = reward(source, response, truth, {"prompt_id": pid, "level": int(level)})
                if isinstance(value, dict):
                    for key, comp in value.items():
                        if key != "score":
                            if key not in components:  # not setdefault: its default would be built every row
                                components[key] = [0.0] * len(rows)
                            components[key][i] = float(comp)
                    value = value["score"]
                scores.append(float(value))
            out = pd.DataFrame({"score": scores} | {f"rc_{k}": v for k, v in components.items()})
            out.to_parquet(workdir / "out_scores.parquet", index=False)
            if "evidence" in frames:
                frames["evidence"] = frames["evidence"].assign(reward=scores)
        if "weights" in tasks:
            curriculum = load_module(harness, "curriculum")
            weights = np.asarray(curriculum.prompt_weights(frames["pool"], frames.get("evidence")), dtype=float)
            np.save(workdir / "out_weights.npy", weights, allow_pickle=False)
        if "diagnose" in tasks:
            diagnostics = load_module(harness, "diagnostics")
            findings = diagnostics.diagnose(frames["evidence"], frames.get("train_log"), blobs.get("recipe", {}))
            (workdir / "out_findings.json").write_text(json.dumps(findings, default=float))
    except SandboxViolation as err:
        print(f"SandboxViolation: {err}", file=sys.stderr)
        return EXIT_VIOLATION
    except MemoryError:
        print("MemoryError", file=sys.stderr)
        return EXIT_MEMORY
    return 0


if __name__ == "__main__":
    sys.exit(main())
