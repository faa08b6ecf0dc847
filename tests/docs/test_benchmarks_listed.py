"""docs/benchmarks.md says every script under benchmarks/ is listed: each is, by its path."""

from __future__ import annotations

import pytest

from tests.docs.docs_extract import REPO

pytestmark = pytest.mark.fast


def test_every_benchmark_script_is_listed_in_the_benchmarks_page():
    page = (REPO / "docs" / "benchmarks.md").read_text()
    scripts = sorted(p for pattern in ("*.py", "*.sh") for p in (REPO / "benchmarks").glob(pattern))
    missing = [p.name for p in scripts if f"`benchmarks/{p.name}`" not in page]
    assert scripts and not missing, f"scripts docs/benchmarks.md does not list: {missing}"
