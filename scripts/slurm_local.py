#!/usr/bin/env python3
"""A private single-node SLURM cluster on this machine, for tests and trying the SLURM profile.

    python3 scripts/slurm_local.py start    # install (Debian packages) if missing, configure, start, wait idle
    python3 scripts/slurm_local.py status   # daemons, node state; exit 1 when not running
    python3 scripts/slurm_local.py stop     # cancel its jobs, stop exactly the daemons it started, restore

Needs root and Debian's `slurmctld slurmd slurm-client munge` (installed with apt-get when missing).
No systemd: munged, slurmctld and slurmd are started directly with absolute config paths and pidfiles
under the state directory ($EVOTRAINER_SLURM_DIR, default /tmp/evotrainer-slurm). The only file it
touches outside that directory is /etc/slurm/slurm.conf, which must exist because the Snakemake SLURM
plugin's in-job step removes every SLURM_* variable (SLURM_CONF too): it becomes a symlink to the
private config, and `stop` puts back whatever was there before. Installed packages stay installed.
Standard library only, so it runs with any python3.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
BINARIES = {"slurmctld": "slurmctld", "slurmd": "slurmd", "sbatch": "slurm-client", "munged": "munge"}
SYSTEM_CONF = Path("/etc/slurm/slurm.conf")
PARTITION = "evotrainer"
DAEMONS = ["munged", "slurmctld", "slurmd"]  # start order; stop goes in reverse


class ClusterError(RuntimeError):
    pass


def state_dir() -> Path:
    return Path(os.environ.get("EVOTRAINER_SLURM_DIR", "/tmp/evotrainer-slurm")).resolve()


def log(message: str) -> None:
    print(f"[slurm_local] {message}", flush=True)


# ---------------------------------------------------------------- packages


def missing_binaries() -> list[str]:
    return [name for name in BINARIES if not _which(name)]


def _which(name: str) -> str | None:
    return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")


def ensure_packages() -> None:
    missing = missing_binaries()
    if not missing:
        return
    packages = sorted({BINARIES[name] for name in missing})
    if not shutil.which("apt-get"):
        raise ClusterError(f"{', '.join(missing)} not found and there is no apt-get to install "
                           f"{' '.join(packages)}: install SLURM and munge with your package manager.")
    if os.geteuid() != 0:
        raise ClusterError(f"{', '.join(missing)} not found; installing {' '.join(PACKAGES)} needs root "
                           f"(sudo apt-get install -y {' '.join(PACKAGES)}).")
    log(f"installing {' '.join(PACKAGES)} with apt-get")
    # Keep the packages' maintainer scripts from starting system daemons (no systemd here, and we start
    # our own): policy-rc.d exit code 101 = "action forbidden". Only if the machine has none already.
    policy = Path("/usr/sbin/policy-rc.d")
    made_policy = not policy.exists()
    if made_policy:
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    env = os.environ | {"DEBIAN_FRONTEND": "noninteractive"}
    try:
        result = _run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES], env=env,
                      check=False, timeout=900)
        if result.returncode != 0:
            log("apt-get install failed; running apt-get update and retrying once")
            _run(["apt-get", "update", "-q"], env=env, check=False, timeout=600)
            result = _run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES], env=env,
                          check=False, timeout=900)
        if result.returncode != 0:
            raise ClusterError(f"apt-get install {' '.join(PACKAGES)} failed:\n{result.stdout[-2000:]}")
    finally:
        if made_policy:
            policy.unlink(missing_ok=True)
    still = missing_binaries()
    if still:
        raise ClusterError(f"installed {' '.join(PACKAGES)} but {', '.join(still)} still not found on PATH")


# ---------------------------------------------------------------- configuration


def machine() -> dict:
    """This host as one SLURM node: its name, CPUs and (a little less than) its memory."""
    mem_kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                  if line.startswith("MemTotal:"))
    cpus = os.cpu_count() or 1
    real_mb = int(mem_kb / 1024 * 0.9)  # headroom: a node reporting less than RealMemory is drained
    return {"host": socket.gethostname().split(".")[0], "cpus": cpus, "real_mb": real_mb,
            "def_mem_per_cpu": max(256, min(2048, real_mb // (2 * cpus)))}


def slurm_conf(root: Path, node: dict) -> str:
    ports = os.environ.get("EVOTRAINER_SLURM_PORTS", "6817,6818").split(",")
    return "\n".join([
        "# Written by scripts/slurm_local.py: a private single-node cluster. Do not edit while it runs.",
        "ClusterName=evotrainer",
        f"SlurmctldHost={node['host']}(127.0.0.1)",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"SlurmctldPort={ports[0]}",
        f"SlurmdPort={ports[1]}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={root}/munge/run/munge.socket.2",
        f"StateSaveLocation={root}/ctld",
        f"SlurmdSpoolDir={root}/spool",
        f"SlurmctldPidFile={root}/pids/slurmctld.pid",
        f"SlurmdPidFile={root}/pids/slurmd.pid",
        f"SlurmctldLogFile={root}/log/slurmctld.log",
        f"SlurmdLogFile={root}/log/slurmd.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        # no cgroups in containers: track processes through /proc, no task confinement
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        # no slurmdbd: Snakemake must poll with squeue, and squeue must still see finished jobs
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "MinJobAge=600",
        "MpiDefault=none",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU_Memory",
        # without a default a job that asks for no memory is given the whole node
        f"DefMemPerCPU={node['def_mem_per_cpu']}",
        "ReturnToService=2",
        "SlurmdTimeout=60",
        "InactiveLimit=0",
        "KillWait=5",
        # no GRES: jobs asking for --gpus/--gres are rejected (the local test profile asks for none)
        f"NodeName={node['host']} NodeAddr=127.0.0.1 CPUs={node['cpus']} RealMemory={node['real_mb']} State=UNKNOWN",
        f"PartitionName={PARTITION} Nodes={node['host']} Default=YES MaxTime=INFINITE State=UP",
        "",
    ])


# ---------------------------------------------------------------- processes


def _run(cmd: list[str], check: bool = True, timeout: float = 60, env: dict | None = None):
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if result.stdout is not None and result.stderr:
        result.stdout += result.stderr
    if check and result.returncode != 0:
        raise ClusterError(f"{' '.join(cmd)} failed ({result.returncode}): {result.stdout.strip()[-1500:]}")
    return result


def _pid(root: Path, daemon: str) -> int | None:
    """The daemon's pid from our pidfile, if that process is alive and is that daemon."""
    path = root / "pids" / f"{daemon}.pid"
    try:
        pid = int(path.read_text().split()[0])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError, IndexError):
        return None
    return pid if cmdline and Path(cmdline[0].decode()).name == daemon else None


def _wait(condition, timeout: float, what: str, root: Path | None = None, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    hint = f" (logs: {root / 'log'})" if root else ""
    raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}{hint}")


def node_state() -> str | None:
    try:
        result = _run(["sinfo", "-h", "-N", "-p", PARTITION, "-o", "%T"], check=False, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    states = result.stdout.split() if result.returncode == 0 else []
    return states[0] if states else None


def running(root: Path) -> bool:
    return all(_pid(root, d) for d in DAEMONS) and _conf_is_ours(root)


def _conf_is_ours(root: Path) -> bool:
    return SYSTEM_CONF.is_symlink() and Path(os.readlink(SYSTEM_CONF)) == root / "slurm.conf"


# ---------------------------------------------------------------- start / stop


def start() -> float:
    began = time.monotonic()
    root = state_dir()
    if running(root):
        log(f"already running (state in {root}); node is {node_state()}")
        return 0.0
    if os.geteuid() != 0:
        raise ClusterError("starting the local cluster needs root (it starts munged, slurmctld, slurmd).")
    ensure_packages()
    if any(_pid(root, d) for d in DAEMONS):
        log("found a partly running cluster from an earlier start; stopping it first")
        stop()
    foreign = [d for d in ("slurmctld", "slurmd") if _run(["pgrep", "-x", d], check=False).returncode == 0]
    if foreign:
        raise ClusterError(f"{', '.join(foreign)} already running on this machine and not started by this "
                           "script: stop it first (this script only manages its own daemons).")

    node = machine()
    for sub in ("ctld", "spool", "pids", "log", "munge/run", "munge/lib", "munge/log"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    (root / "slurm.conf").write_text(slurm_conf(root, node))  # daemons are down: safe to (re)write
    for old_log in (root / "log").glob("*.log"):  # each start's logs describe that cluster only
        old_log.replace(old_log.with_suffix(".log.prev"))

    _start_munge(root)
    _link_system_conf(root)
    _run(["slurmctld", "-f", str(root / "slurm.conf"), "-c"])  # -c: fresh state, no jobs from a past run
    _wait(lambda: _pid(root, "slurmctld"), 20, "slurmctld's pidfile", root)
    _run(["slurmd", "-f", str(root / "slurm.conf"), "-N", node["host"]])
    _wait(lambda: _pid(root, "slurmd"), 20, "slurmd's pidfile", root)
    _wait(lambda: (node_state() or "").startswith("idle"), 60, f"node {node['host']} to be idle in sinfo", root)
    seconds = time.monotonic() - began
    log(f"up in {seconds:.1f} s: node {node['host']} ({node['cpus']} CPUs, {node['real_mb']} MB), "
        f"partition {PARTITION}, state in {root}")
    return seconds


def _start_munge(root: Path) -> None:
    munge = root / "munge"
    (munge / "run").chmod(0o755)  # clients must reach the socket
    (munge / "lib").chmod(0o700)  # munged refuses a key directory others can read
    key = munge / "lib" / "munge.key"
    if not key.exists():
        key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    socket_path = munge / "run" / "munge.socket.2"
    _run(["munged", "--force", f"--key-file={key}", f"--socket={socket_path}",
          f"--pid-file={root / 'pids' / 'munged.pid'}", f"--log-file={munge / 'log' / 'munged.log'}",
          f"--seed-file={munge / 'lib' / 'munged.seed'}"])
    _wait(lambda: _pid(root, "munged"), 10, "munged's pidfile", root)
    check = subprocess.run(f"munge -n -S {socket_path} | unmunge -S {socket_path}", shell=True,
                           capture_output=True, text=True, timeout=10)
    if check.returncode != 0:
        raise ClusterError(f"munge round trip failed: {check.stderr.strip()} (log: {munge / 'log'})")


def _changes(root: Path) -> dict:
    path = root / "changes.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _link_system_conf(root: Path) -> None:
    """Point /etc/slurm/slurm.conf at the private config, remembering what was there."""
    if _conf_is_ours(root):
        return
    changes = _changes(root)
    if not SYSTEM_CONF.parent.exists():
        SYSTEM_CONF.parent.mkdir(parents=True)
        changes["created_dir"] = str(SYSTEM_CONF.parent)
    if SYSTEM_CONF.exists() or SYSTEM_CONF.is_symlink():
        backup = root / "slurm.conf.system-backup"
        shutil.move(SYSTEM_CONF, backup)
        changes["backup"] = str(backup)
    SYSTEM_CONF.symlink_to(root / "slurm.conf")
    changes["linked"] = str(SYSTEM_CONF)
    (root / "changes.json").write_text(json.dumps(changes))


def stop() -> None:
    root = state_dir()
    if _pid(root, "slurmctld"):
        _run(["scancel", "-p", PARTITION], check=False, timeout=20)  # our partition: only our jobs
        time.sleep(1)
    for daemon in reversed(DAEMONS):
        pid = _pid(root, daemon)
        if not pid:
            continue
        os.kill(pid, signal.SIGTERM)
        try:
            _wait(lambda p=pid: not Path(f"/proc/{p}").exists(), 15, f"{daemon} ({pid}) to exit")
        except ClusterError:
            os.kill(pid, signal.SIGKILL)
        log(f"stopped {daemon} (pid {pid})")
    changes = _changes(root)
    if changes.get("linked") and _conf_is_ours(root):
        SYSTEM_CONF.unlink()
    if changes.get("backup") and Path(changes["backup"]).exists():
        shutil.move(changes["backup"], SYSTEM_CONF)
        log(f"restored the previous {SYSTEM_CONF}")
    if changes.get("created_dir"):
        with contextlib.suppress(OSError):  # something else was put there meanwhile: leave it
            Path(changes["created_dir"]).rmdir()
    (root / "changes.json").unlink(missing_ok=True)


def status() -> bool:
    root = state_dir()
    for daemon in DAEMONS:
        pid = _pid(root, daemon)
        print(f"{daemon:10s} {'pid ' + str(pid) if pid else 'not running'}")
    print(f"{str(SYSTEM_CONF):10s} {'-> ' + os.readlink(SYSTEM_CONF) if SYSTEM_CONF.is_symlink() else 'not ours'}")
    up = running(root)
    if up:
        print(_run(["sinfo", "-N", "-p", PARTITION], check=False).stdout.rstrip())
    return up


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["start", "stop", "status"])
    args = parser.parse_args(argv)
    try:
        if args.action == "start":
            start()
        elif args.action == "stop":
            stop()
        else:
            return 0 if status() else 1
    except (ClusterError, subprocess.TimeoutExpired, OSError) as err:
        print(f"slurm_local {args.action}: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
