"""docs/measured/record.md shows each finished flaw's table exactly as `record_bank.py markdown` prints it from
record-flaws.json: no number in those tables is copied by hand."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from tests.docs.docs_extract import REPO

pytestmark = pytest.mark.fast

SPEC = importlib.util.spec_from_file_location("record_bank", REPO / "benchmarks" / "record_bank.py")


def test_every_finished_flaws_table_in_record_md_is_the_one_printed_from_the_json():
    record_bank = sys.modules.setdefault("record_bank", importlib.util.module_from_spec(SPEC))
    SPEC.loader.exec_module(record_bank)
    rows = json.loads((REPO / "docs" / "measured" / "record-flaws.json").read_text()).get("rows_so_far", {})
    page = (REPO / "docs" / "measured" / "record.md").read_text()
    assert rows, "record-flaws.json has no finished flaw"
    for flaw, row in rows.items():
        table = "\n".join(line for line in record_bank.markdown(row).splitlines() if line.startswith("|"))
        assert table in page, f"record.md lacks {flaw}'s table as printed (benchmarks/record_bank.py markdown)"


def test_the_readmes_flaws_table_is_the_one_printed_from_the_json():
    printed = subprocess.run([sys.executable, str(REPO / "benchmarks" / "record_bank.py"), "readme", "--record",
                              str(REPO / "docs" / "measured" / "record-flaws.json")], capture_output=True, text=True,
                             check=True).stdout.strip()
    assert printed in (REPO / "README.md").read_text(), (
        "README.md's flaws table differs from `benchmarks/record_bank.py readme --record docs/measured/record-flaws.json`")
