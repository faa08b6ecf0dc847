"""Every measured number README.md states is in a file: some JSON under docs/measured/ holds it.

A measured-looking number in the README's prose and tables is a decimal (``0.5535``), a signed number
(``+0.017``, ``−0.042``, ``+9``), a percentage or a count of points (``81%``, ``2 points``), a count with
thousands separators (``614,400``), a duration (``12 min 9 s``, ``13.5 minutes``, ``709 s``, ``7,938 job-s``)
or a size (``187 MB``). Ranges (``75–81%``, ``1–2 minutes``) give each end the unit. Not read: fenced blocks,
inline code, link targets (their ``#anchors`` too), version pins (``torch==2.13.0``, ``Python ≥ 3.11``,
``verl 0.9.1``) and the numbers of ``ALLOWED``.

A number matches a value of the JSON files' text at the digits it shows: ``0.536`` matches 0.5355 and 0.536,
``+0.017`` matches 0.01733 (the sign must agree), ``81%`` and ``81 points`` match 0.8125 or 81, ``614,400``
matches 614400, a duration matches its seconds (``12 min 9 s``: 729) or the number as written. A failure names
each number no file holds, with its line: measure it into docs/measured/, or move the sentence to
docs/history.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from functools import cache
from pathlib import Path

import pytest

from tests.docs.docs_extract import INLINE, LINK, REPO, split_fences

pytestmark = pytest.mark.fast

README = REPO / "README.md"
MEASURED = REPO / "docs" / "measured"

# Numbers in the README that are no measurement, each with why (the text as the README writes it).
ALLOWED = {
    "0.13M": "architecture",  # the default policy's size, fixed in code (conf/policy/tiny.yaml)
    "30%": "config",  # policy.sft.target_val_accuracy, where the warm start stops
    "70%": "goal",  # the recovery the flaws suite asks of an arm (docs/flaws.md)
}

MINUS = "−"  # U+2212, as the tables write a negative number
NUMBER = r"\d{1,3}(?:,\d{3})+(?![\d,])|\d+(?:\.\d+)?"
SECONDS = {"s": 1, "sec": 1, "seconds": 1, "second": 1, "job-s": 1, "job-seconds": 1, "min": 60,
           "minutes": 60, "minute": 60, "h": 3600, "hours": 3600, "hour": 3600}
SIZES = ("MB", "GB", "MiB", "GiB", "kB", "KB")
UNIT = r"%|points?\b|" + "|".join(sorted((re.escape(u) + r"(?![\w-])" for u in (*SECONDS, *SIZES)),
                                         key=len, reverse=True))
TOKEN = re.compile(
    rf"(?<![\w.,/-])(?P<sign>[+{MINUS}±-]?)(?P<first>{NUMBER})(?P<suffix>[kMB]\b)?"
    rf"(?:(?:\s?[–-]\s?|\sto\s(?=[+{MINUS}]))(?P<sign2>[+{MINUS}]?)(?P<second>{NUMBER}))?"  # 75–81%, +9 to +16
    rf"(?:\s?(?P<unit>{UNIT})(?:\s(?P<more>\d+)\s?(?P<unit2>s|sec|seconds)(?![\w-]))?)?")
# version pins and versions of named software: not measurements
VERSION = re.compile(r"(?:==|>=|<=|≥|≤|~=)\s?\d[\w.]*|\b\d+\.\d+\.\d+\b|"
                     r"\b(?:Python|torch|verl|SLURM|CUDA|vLLM|Snakemake|Hydra|Ubuntu)\s\d+(?:\.\d+)*\b")


@dataclass(frozen=True)
class Number:
    """One number as the README writes it, and the closed intervals a file's value may fall in."""

    text: str
    line: int
    kind: str
    intervals: tuple[tuple[float, float], ...]

    def found_in(self, values: list[float]) -> bool:
        return any(low - 1e-9 <= value <= high + 1e-9 for value in values for low, high in self.intervals)


def _half(digits: str) -> float:
    """Half a unit of the last digit shown."""
    places = len(digits.partition(".")[2])
    return 0.5 * 10.0 ** -places


def _value(sign: str, digits: str) -> float:
    value = float(Decimal(digits.replace(",", "")))
    return -value if sign in (MINUS, "-") else value


def _around(value: float, half: float, scale: float = 1.0) -> tuple[float, float]:
    return ((value - half) * scale, (value + half) * scale)


def _numbers_of(match: re.Match, line: int) -> list[Number]:
    """The numbers one match writes: one, or each end of a range (``75–81%``: 75% and 81%)."""
    unit = match["unit"] or ""
    ends = [(match["sign"], match["first"])] + ([(match["sign2"], match["second"])] if match["second"] else [])
    found = []
    for sign, digits in ends:
        text = (" ".join(match[0].split()) if len(ends) == 1
                else f"{sign}{digits}{'' if unit in ('', '%') else ' '}{unit}")
        value, half = _value(sign, digits), _half(digits)
        if unit == "%" or unit.startswith("point"):
            kind, intervals = "percentage", (_around(value, half, 0.01), _around(value, half))
        elif unit in SECONDS:
            kind = "duration"
            seconds, precision = value * SECONDS[unit], half * SECONDS[unit]
            if match["more"]:  # 12 min 9 s
                seconds, precision = seconds + int(match["more"]), 0.5 * SECONDS[match["unit2"]]
            intervals = ((seconds - precision, seconds + precision), _around(value, half))
        elif unit in SIZES:
            kind, intervals = "size", (_around(value, half),)
        elif "," in digits:
            kind, intervals = "count", ((value, value),)
        elif "." in digits:
            kind, intervals = "decimal", (_around(value, half),)
        elif sign:
            kind, intervals = "signed", (_around(value, half),)
        else:
            continue  # a plain integer (3 generations, 200 steps): not read
        found.append(Number(text, line, kind, intervals))
    return found


def _blank(text: str, pattern: re.Pattern) -> str:
    """The text with each match replaced by spaces (newlines kept, so lines and offsets stay)."""
    return pattern.sub(lambda m: re.sub(r"[^\n]", " ", m[0]), text)


def measured_numbers(text: str) -> list[Number]:
    """The measured-looking numbers of a README's prose and tables, in order, less ``ALLOWED``."""
    prose, _ = split_fences(text)
    for pattern in (INLINE, LINK, VERSION, re.compile(r"<!--.*?-->", re.S)):
        prose = _blank(prose, pattern)
    found = []
    for match in TOKEN.finditer(prose):
        if match[0].strip() in ALLOWED:
            continue
        found.extend(_numbers_of(match, prose.count("\n", 0, match.start()) + 1))
    return found


@cache
def json_values(folder: Path = MEASURED) -> tuple[float, ...]:
    """Every number in the text of the JSON files under ``folder`` (keys, values and numbers in strings)."""
    numbers = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")
    return tuple(float(m[0]) for path in sorted(folder.rglob("*.json"))
                 for m in numbers.finditer(path.read_text()))


def unmatched(text: str, values: tuple[float, ...] | list[float]) -> list[str]:
    """Each number of ``text`` that no value matches, as ``README.md:LINE: NUMBER (kind)``."""
    values = list(values)
    return [f"README.md:{n.line}: {n.text} ({n.kind}) is in no JSON under docs/measured/"
            for n in measured_numbers(text) if not n.found_in(values)]


def test_every_number_in_the_readme_is_in_a_measured_json():
    missing = unmatched(README.read_text(), json_values())
    assert not missing, ("numbers the README states that no docs/measured/ JSON holds (measure them into a "
                         "JSON there, or move the sentence to docs/history.md):\n" + "\n".join(missing))


def test_the_check_fails_on_a_number_edited_by_hand():
    text, values = README.read_text(), json_values()
    numbers = [n for n in measured_numbers(text) if n.kind == "decimal" and n.found_in(list(values))]
    assert numbers, "the README states no decimal that a JSON holds: nothing to edit"
    target = numbers[0]
    forged = next(f"0.{k:04d}" for k in range(9999, 0, -1)
                  if not Number("", 0, "decimal", (_around(k / 10000, 0.00005),)).found_in(list(values)))
    lines = text.split("\n")
    lines[target.line - 1] = lines[target.line - 1].replace(target.text, forged, 1)
    assert unmatched("\n".join(lines), values) == [
        f"README.md:{target.line}: {forged} (decimal) is in no JSON under docs/measured/"]


def test_the_checker_reads_each_kind_and_skips_code_links_and_versions():
    text = "\n".join([
        "# Title",
        "loop 0.5535, +0.017 [−0.042, +0.077]; 81% of 614,400; 75–81% here; it took 12 min 9 s and 709 s;",
        "+9 to +16 points; 13.5 minutes; 7,938 job-s; 187 MB; 3 generations of 200 steps; 2 cores.",
        "`search.min_gain=0.01` [a page](docs/measurements.md#intervals-at-0.95) torch==2.13.0, Python ≥ 3.11,"
        " verl 0.9.1, 0.13M parameters, the goal of 70%.",
        "```bash",
        "run 0.999 # ~37 min",
        "```",
    ])
    assert [(n.text, n.kind) for n in measured_numbers(text)] == [
        ("0.5535", "decimal"), ("+0.017", "decimal"), ("−0.042", "decimal"), ("+0.077", "decimal"),
        ("81%", "percentage"), ("614,400", "count"), ("75%", "percentage"), ("81%", "percentage"),
        ("12 min 9 s", "duration"), ("709 s", "duration"), ("+9 points", "percentage"),
        ("+16 points", "percentage"), ("13.5 minutes", "duration"), ("7,938 job-s", "duration"),
        ("187 MB", "size")]
    values = [0.5535, 0.01733, -0.04198, 0.0766, 0.8125, 614400, 0.75, 729.0, 709.2, 0.09, 0.16, 810.4, 7938, 187]
    assert unmatched(text, values) == []
    assert unmatched(text.replace("+0.017", "−0.017"), values) == [
        "README.md:2: −0.017 (decimal) is in no JSON under docs/measured/"]


def test_every_allowed_number_is_in_the_readme():
    """The allow-list stays short: an entry the README no longer writes is dropped."""
    prose = _blank(split_fences(README.read_text())[0], INLINE)
    stale = [number for number in ALLOWED if number not in prose]
    assert not stale, f"ALLOWED names numbers the README no longer writes: {stale}"
