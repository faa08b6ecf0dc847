"""`evotrainer run` and `evotrainer workflow` (cli/run.py) and the workflow bundled into the package
(src/evotrainer/bundled/, docs/installing-as-a-wheel.md): overrides with dots reach the workflow through
Snakemake's --config parser intact, the Snakefile is the one here or the bundled one, a copy is real files,
and a wheel (not the editable install) holds the workflow and dry-runs it from an empty directory."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from evotrainer.cli import run as run_cli
from evotrainer.cli.main import main
from tests.conftest import REPO

TRICKY = [
    "search.generations=5",
    "experiment=quick",
    "+x=y",
    "~k",
    "++a.b=c",
    "list=[1,2, 3]",
    "dict={a: 1, b: [x, y]}",
    "spaces=a b  c ",
    "eq=a=b=c",
    "colon=a: b",
    "hash=a # not a comment",
    "quotes='single' and \"double\"",
    "back=C:\\dir\\ and \\n literally",
    "newline=one\ntwo\tthree\r",
    "yaml=yes no null ~ 1e3 0x1F true",
    "anchor=&a *a !tag %x @y `z` |>",
    "unicode=ünïcødé ✓ 😀",
    "control=\x00\x07\x1b\x7f\x85\x9f\ufeff",
    "breaks=a\u2028b\u2029c\x0bd\x0ce",
    "empty=",
    "",
    "-leading-dash",
]


def _bundled_files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for part in run_cli.PARTS for p in
            ([root / part] if (root / part).is_file() else (root / part).rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


@pytest.mark.fast
@pytest.mark.parametrize("overrides", [TRICKY, ["search.generations=5"], ["a=[x, y]", "b={c: d}"]])
def test_overrides_survive_snakemakes_config_parser(overrides):
    from snakemake.cli import parse_config

    entry = run_cli.config_entry(overrides)
    assert parse_config([entry]) == {"overrides": overrides}
    # the whole argument list through snakemake's own parser: the entry is one --config value, targets stay
    from snakemake.cli import get_argument_parser

    args = get_argument_parser().parse_args(run_cli.snakemake_argv(Path("S"), overrides, ["all", "-n", "--cores", "1"]))
    assert (args.snakefile, args.targets, args.dryrun, args.config) == ("S", ["all"], True, [entry])


@pytest.mark.fast
def test_snakemakes_own_config_refuses_dotted_keys():
    """Why the overrides travel as one entry: snakemake's --config takes no dots in a key."""
    from snakemake.cli import parse_config

    with pytest.raises(ValueError, match="valid identifier"):
        parse_config(["search.generations=5"])


@pytest.mark.fast
def test_the_entry_is_plain_for_cluster_executors():
    """A cluster executor passes --config on in a shell command quoted with repr: ordinary overrides give an
    entry without ' or \\, which such quoting keeps intact."""
    entry = run_cli.config_entry(["search.generations=5", "run=my run", "a=[x, y]", "b={c: d}"])
    assert "'" not in entry and "\\" not in entry
    assert entry == 'overrides=["search.generations=5", "run=my run", "a=[x, y]", "b={c: d}"]'


@pytest.mark.fast
def test_a_config_of_the_users_own_is_joined_not_replaced():
    from snakemake.cli import get_argument_parser

    for given in (["--config", "run=a"], ["-C", "run=a"], ["--config=run=a"]):
        argv = run_cli.snakemake_argv(Path("S"), ["x.y=1"], [*given, "-n"])
        args = get_argument_parser().parse_args(argv)
        assert sorted(args.config) == ['overrides=["x.y=1"]', "run=a"] and args.dryrun, argv
    assert run_cli.snakemake_argv(Path("S"), [], ["-n"]) == ["--snakefile", "S", "-n"]  # no overrides: no --config
    assert run_cli.snakemake_argv(None, [], ["-s", "T"]) == ["-s", "T"]  # the user's own --snakefile


@pytest.mark.fast
def test_the_snakefile_here_wins_else_the_bundled_one(tmp_path):
    assert run_cli.choose_snakefile(tmp_path)[0] == run_cli.BUNDLED / "Snakefile"
    assert (run_cli.BUNDLED / "Snakefile").is_file() and (run_cli.BUNDLED / "conf" / "config.yaml").is_file()
    (tmp_path / "Snakefile").write_text("rule all:\n")
    assert run_cli.choose_snakefile(tmp_path)[0] == Path("Snakefile")


@pytest.mark.fast
def test_run_splits_overrides_from_snakemake_args_and_returns_its_status(tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(run_cli, "call", lambda cmd: calls.append(cmd) or 3)
    monkeypatch.chdir(tmp_path)
    assert main(["run", "search.generations=5", "+x=a b", "--", "all", "-n", "--cores", "1", "--", "z"]) == 3
    assert calls == [[sys.executable, "-m", "snakemake", "--snakefile", str(run_cli.BUNDLED / "Snakefile"),
                      "all", "-n", "--cores", "1", "--config", 'overrides=["search.generations=5", "+x=a b"]', "--", "z"]]
    assert "bundled" in capsys.readouterr().err
    (tmp_path / "Snakefile").write_text("rule all:\n")
    assert main(["run"]) == 3 and calls[-1][3:] == ["--snakefile", "Snakefile"]
    assert "in this directory" in capsys.readouterr().err


# tier 2: two `evotrainer run` subprocesses (~10 s); the status passing through run_cli is fast above
def test_run_forwards_snakemakes_exit_status(tmp_path):
    """The real subprocess: `-- --version` exits 0 with snakemake's version, an unknown option with argparse's 2."""
    import snakemake

    ok = subprocess.run([sys.executable, "-m", "evotrainer.cli", "run", "--", "--version"], cwd=tmp_path,
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and ok.stdout.strip() == snakemake.__version__, ok.stderr
    assert "evotrainer run: workflow" in ok.stderr and "bundled" in ok.stderr  # the one line, on stderr
    bad = subprocess.run([sys.executable, "-m", "evotrainer.cli", "run", "--", "--no-such-option"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--no-such-option" in bad.stderr


@pytest.mark.fast
def test_workflow_copies_real_files_and_refuses_a_second_time(tmp_path, capsys):
    target = tmp_path / "mine"
    assert main(["workflow", str(target)]) == 0
    assert "evotrainer run" in capsys.readouterr().out  # what to run next
    copied = _bundled_files(target)
    assert copied == _bundled_files(run_cli.BUNDLED) and "conf/config.yaml" in copied and "Snakefile" in copied
    assert not [p for p in target.rglob("*") if p.is_symlink()]
    assert all((target / f).read_bytes() == (REPO / f).read_bytes() for f in copied)
    (target / "conf" / "config.yaml").write_text("# edited\n")
    assert main(["workflow", str(target)]) == 1
    err = capsys.readouterr().err.strip()
    assert "exists already" in err and len(err.splitlines()) == 1
    assert (target / "conf" / "config.yaml").read_text() == "# edited\n"  # the user's edit is kept


@pytest.mark.fast
def test_the_bundle_is_relative_links_into_the_repository():
    """One copy of each file: src/evotrainer/bundled/<part> links to <repo>/<part>; no __init__.py (not a
    package anyone imports)."""
    for part in run_cli.PARTS:
        link = REPO / "src" / "evotrainer" / "bundled" / part
        assert link.is_symlink() and not os.path.isabs(os.readlink(link)), part
        assert link.resolve() == (REPO / part).resolve()
    assert sorted(p.name for p in run_cli.BUNDLED.iterdir()) == sorted(run_cli.PARTS)


def _copy_source(dest: Path) -> None:
    """The repository as a build sees it, links kept (a build in the checkout would leave build/ there)."""
    top = {".git", ".venv", "results", ".snakemake", "build", "dist", ".pytest_cache", ".ruff_cache", "benchmarks"}

    def ignore(folder: str, names: list[str]) -> set[str]:
        skip = {n for n in names if n == "__pycache__" or n.endswith(".egg-info")}
        return skip | (top & set(names) if Path(folder) == REPO else set())

    shutil.copytree(REPO, dest, symlinks=True, ignore=ignore)


@pytest.mark.e2e  # a dry run through the snakemake CLI
def test_a_wheel_holds_the_workflow_and_dry_runs_it(tmp_path):
    """Build a wheel, unpack it over the editable install (PYTHONPATH), dry-run from an empty directory."""
    source, dist, site, work = (tmp_path / name for name in ("source", "dist", "site", "work"))
    _copy_source(source)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist),
                            "."], cwd=source, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    [wheel] = dist.glob("evotrainer-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        infos = [i for i in archive.infolist() if i.filename.startswith("evotrainer/bundled/")]
        assert not [i.filename for i in infos if stat.S_ISLNK(i.external_attr >> 16)]  # real files, no links
        archive.extractall(site)
    bundled = site / "evotrainer" / "bundled"
    assert _bundled_files(bundled) == _bundled_files(REPO) and len(infos) == len(_bundled_files(REPO))
    assert all((bundled / f).read_bytes() == (REPO / f).read_bytes() for f in _bundled_files(REPO))
    assert not (bundled / "__init__.py").exists()

    # the wheel's own conf/ is the one composed: its default run name, changed here, names the planned paths
    config = bundled / "conf" / "config.yaml"
    text = config.read_text()
    assert "\nrun: default " in text
    config.write_text(text.replace("\nrun: default ", "\nrun: from-the-wheel ", 1))

    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    where = subprocess.run([sys.executable, "-c", "import evotrainer; print(evotrainer.__file__)"], cwd=work, env=env,
                           capture_output=True, text=True, timeout=120)
    assert Path(where.stdout.strip()).is_relative_to(site), where.stdout + where.stderr  # the wheel, not src/
    dry = subprocess.run([sys.executable, "-m", "evotrainer.cli", "run", "--", "-n", "--cores", "1"], cwd=work,
                         env=env, capture_output=True, text=True, timeout=300)
    out = dry.stdout + dry.stderr
    assert dry.returncode == 0, out[-4000:]
    assert str(bundled / "Snakefile") in dry.stderr
    assert "rule data:" in out and "rule rollout:" in out and "This was a dry-run" in out
    assert "results/from-the-wheel/data/train.parquet" in out and "results/default/" not in out
    assert sorted(p.name for p in work.iterdir()) == [".snakemake"]  # nothing but snakemake's own folder
