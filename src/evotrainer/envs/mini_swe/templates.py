"""The function templates mini_swe builds repositories from, and the bugs it can inject into them.

A template is a small, correct Python function (sometimes with a helper it calls), an argument
generator and a list of mutations. A mutation replaces a substring on one line: ``(kind, old, new)``.
Bug kinds: ``off_by_one``, ``wrong_operator``, ``wrong_constant``, ``swapped_args``, ``wrong_variable``.
No template has a ``while`` loop, so no mutation can make a test run forever.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

BUG_KINDS = ("off_by_one", "wrong_operator", "wrong_constant", "swapped_args", "wrong_variable")


@dataclass(frozen=True)
class Template:
    entry: str  # the function the tests call
    code: str
    args: Callable[[random.Random], tuple]
    mutations: tuple[tuple[str, str, str], ...]


def _ints(rng: random.Random, low: int, high: int, size: tuple[int, int]) -> list[int]:
    return [rng.randint(low, high) for _ in range(rng.randint(*size))]


TEMPLATES: tuple[Template, ...] = (
    Template("sum_to", """\
def sum_to(n):
    total = 0
    for i in range(n + 1):
        total = total + i
    return total
""", lambda r: (r.randint(1, 20),), (
        ("off_by_one", "range(n + 1)", "range(n)"),
        ("wrong_operator", "total + i", "total - i"),
        ("wrong_constant", "total = 0", "total = 1"),
    )),
    Template("count_above", """\
def count_above(items, limit):
    count = 0
    for item in items:
        if item > limit:
            count += 1
    return count
""", lambda r: (_ints(r, 0, 9, (3, 7)), r.randint(1, 8)), (
        ("wrong_operator", "item > limit", "item < limit"),
        ("off_by_one", "item > limit", "item >= limit"),
        ("wrong_constant", "count += 1", "count += 2"),
    )),
    Template("clamp", """\
def clamp(value, low, high):
    if value < low:
        return low
    if value > high:
        return high
    return value
""", lambda r: (r.randint(-10, 30), r.randint(0, 5), r.randint(10, 20)), (
        ("wrong_operator", "value < low", "value > low"),
        ("wrong_variable", "return high", "return low"),
        ("wrong_variable", "return value", "return high"),
    )),
    Template("distance", """\
def subtract(a, b):
    return a - b


def distance(start, end):
    return subtract(end, start)
""", lambda r: (r.randint(0, 20), r.randint(21, 60)), (
        ("swapped_args", "subtract(end, start)", "subtract(start, end)"),
        ("wrong_operator", "a - b", "a + b"),
    )),
    Template("find_index", """\
def find_index(items, target):
    for i in range(len(items)):
        if items[i] == target:
            return i
    return -1
""", lambda r: (_ints(r, 0, 6, (3, 6)), r.randint(0, 8)), (
        ("wrong_constant", "return -1", "return 0"),
        ("off_by_one", "range(len(items))", "range(1, len(items))"),
        ("wrong_operator", "items[i] == target", "items[i] != target"),
    )),
    Template("count_even", """\
def count_even(numbers):
    result = 0
    for number in numbers:
        if number % 2 == 0:
            result += 1
    return result
""", lambda r: (_ints(r, 0, 30, (3, 7)),), (
        ("wrong_constant", "number % 2", "number % 3"),
        ("wrong_constant", "== 0", "== 1"),
    )),
    Template("max_of", """\
def max_of(numbers):
    best = numbers[0]
    for number in numbers[1:]:
        if number > best:
            best = number
    return best
""", lambda r: (_ints(r, -20, 20, (3, 7)),), (
        ("wrong_operator", "number > best", "number < best"),
        ("wrong_constant", "best = numbers[0]", "best = 0"),
    )),
    Template("factorial", """\
def factorial(n):
    result = 1
    for k in range(2, n + 1):
        result = result * k
    return result
""", lambda r: (r.randint(3, 9),), (
        ("off_by_one", "range(2, n + 1)", "range(2, n)"),
        ("wrong_constant", "result = 1", "result = 0"),
        ("wrong_operator", "result * k", "result + k"),
    )),
    Template("to_fahrenheit", """\
def to_fahrenheit(celsius):
    return celsius * 9 / 5 + 32
""", lambda r: (5 * r.randint(-8, 20),), (
        ("wrong_constant", "+ 32", "+ 23"),
        ("swapped_args", "9 / 5", "5 / 9"),
    )),
    Template("percent", """\
def ratio(part, whole):
    if whole == 0:
        return 0.0
    return part / whole


def percent(part, whole):
    return 100 * ratio(part, whole)
""", lambda r: (r.randint(1, 9), r.choice([10, 20, 25, 50])), (
        ("swapped_args", "ratio(part, whole)", "ratio(whole, part)"),
        ("wrong_constant", "100 * ratio", "10 * ratio"),
    )),
    Template("repeat_word", """\
def repeat_word(word, times):
    return " ".join([word] * times)
""", lambda r: (r.choice(["ab", "go", "hi", "ok", "yes"]), r.randint(2, 5)), (
        ("off_by_one", "* times", "* (times - 1)"),
        ("wrong_constant", '" ".join', '"-".join'),
    )),
    Template("last_item", """\
def last_item(items, default):
    if len(items) == 0:
        return default
    return items[len(items) - 1]
""", lambda r: (_ints(r, 0, 50, (0, 5)), r.randint(-5, -1)), (
        ("off_by_one", "len(items) - 1", "len(items) - 2"),
        ("wrong_variable", "return default", "return items"),
    )),
    Template("power", """\
def power(base, exponent):
    result = 1
    for _ in range(exponent):
        result = result * base
    return result
""", lambda r: (r.randint(2, 5), r.randint(2, 5)), (
        ("swapped_args", "result * base", "result * exponent"),
        ("off_by_one", "range(exponent)", "range(exponent - 1)"),
    )),
    Template("min_index", """\
def min_index(values):
    best = 0
    for i in range(1, len(values)):
        if values[i] < values[best]:
            best = i
    return best
""", lambda r: (_ints(r, 0, 40, (3, 7)),), (
        ("wrong_operator", "values[i] < values[best]", "values[i] > values[best]"),
        ("wrong_variable", "best = i", "best = values[i]"),
    )),
)
