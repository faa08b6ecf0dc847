"""The test tiers stay honest (tests/README.md): every package folder under src/evotrainer/ has a test folder of
the same name with at least one fast test (the top-level modules: tests/core/), and no fast test runs
snakemake or needs a trained fixture. The fast tests are found by pytest's own collection (`-m fast`), run in
this process: the test modules are imported already when the fast tier runs, so it costs a few seconds."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "evotrainer"
# Session fixtures that train a policy, backtest candidates or run the workflow (tests/conftest.py): minutes
# on 2 cores, so a test that needs one belongs to tier 2 or 3.
SLOW_FIXTURES = {"tiny_policy", "backtests", "finished_run"}


def package_folders(package: Path) -> dict[str, Path]:
    """Each package folder right under `package` (one with an `__init__.py`) by its name; the top-level
    modules as `core`."""
    folders = {p.name: p for p in sorted(package.iterdir()) if (p / "__init__.py").is_file()}
    if any(p.suffix == ".py" and p.name != "__init__.py" for p in package.iterdir()):
        folders["core"] = package
    return folders


def missing_fast_tests(folders: list[str], fast_nodeids: list[str], tests: Path) -> list[str]:
    """A line per package folder without a test folder of its name, or without a fast test in it."""
    missing = []
    for name in folders:
        if not (tests / name / "__init__.py").is_file():
            missing.append(f"{name}: no test folder tests/{name}/ (with an __init__.py)")
        elif not any(nodeid.startswith(f"tests/{name}/") for nodeid in fast_nodeids):
            missing.append(f"{name}: no fast test in tests/{name}/ (mark a test of a few seconds `fast`)")
    return missing


class _FastTests:
    """A plugin that keeps what the fast tests are: node id, marker names and the fixtures each requests."""

    def __init__(self):
        self.tests: dict[str, tuple[set[str], set[str]]] = {}

    def pytest_collection_finish(self, session):
        for item in session.items:
            self.tests[item.nodeid] = ({m.name for m in item.iter_markers()}, set(getattr(item, "fixturenames", ())))


@pytest.fixture(scope="module")
def fast_tests() -> dict[str, tuple[set[str], set[str]]]:
    found = _FastTests()
    code = pytest.main(["--collect-only", "-qq", "-m", "fast", "-p", "no:cacheprovider", "--rootdir", str(REPO),
                        "-c", str(REPO / "pyproject.toml"), str(REPO / "tests")], plugins=[found])
    assert code == pytest.ExitCode.OK, f"collecting the fast tier (pytest --collect-only -m fast) exited {code}"
    return found.tests


def test_every_package_folder_has_a_fast_test_in_its_test_folder(fast_tests):
    folders = package_folders(PACKAGE)
    assert {"agents", "backends", "cli", "contracts", "core", "tasks"} <= set(folders)  # the scan finds them
    missing = missing_fast_tests(list(folders), list(fast_tests), REPO / "tests")
    assert not missing, "package folders without a fast test (tests/README.md, 'Adding a test'):\n" + "\n".join(missing)


def test_no_fast_test_runs_snakemake_or_needs_a_trained_fixture(fast_tests):
    wrong = [f"{nodeid}: marked {sorted(markers & {'e2e', 'slurm'})}" for nodeid, (markers, _) in fast_tests.items()
             if markers & {"e2e", "slurm"}]
    wrong += [f"{nodeid}: uses {sorted(fixtures & SLOW_FIXTURES)}" for nodeid, (_, fixtures) in fast_tests.items()
              if fixtures & SLOW_FIXTURES]
    assert not wrong, "fast tests that belong to a slower tier (tests/README.md):\n" + "\n".join(wrong)


def test_the_check_names_a_folder_without_tests_and_one_without_a_fast_test(tmp_path):
    package = tmp_path / "pkg"
    for name in ("alpha", "beta", "gamma"):
        (package / name).mkdir(parents=True)
        (package / name / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "config.py").write_text("")
    (package / "data").mkdir()  # no __init__.py: not a package folder
    for name in ("alpha", "beta", "core"):
        (tmp_path / "tests" / name).mkdir(parents=True)
        (tmp_path / "tests" / name / "__init__.py").write_text("")
    folders = package_folders(package)
    assert list(folders) == ["alpha", "beta", "gamma", "core"]
    fast = ["tests/alpha/test_a.py::test_one", "tests/core/test_config.py::test_two"]
    assert missing_fast_tests(list(folders), fast, tmp_path / "tests") == [
        "beta: no fast test in tests/beta/ (mark a test of a few seconds `fast`)",
        "gamma: no test folder tests/gamma/ (with an __init__.py)",
    ]
