"""The shipped math reward (tasks/harnesses/math/reward.py) agrees with task=math's verify (math-verify) on
generated answers: a seeded property test (hypothesis is not installed in the venv) over (response, ground
truth) pairs, asserting ``reward["correct"] == task.verify(...).correct`` for every one. math-verify costs
~20 ms a case on 2 cores, so the fast tier checks FAST_CASES pairs and tier 2 (not fast) MANY_CASES more.

The domain is numeric: the answers task=math's data holds (math_synthetic writes integers and \\frac{a}{b};
users' verl parquet is mostly numbers). Covered:

- ground truths: integers (negative, up to 6 digits), \\frac{a}{b} and -\\frac{a}{b} as math_synthetic
  writes them, \\dfrac{a}{b}, a/b, terminating decimals (-2.75), an integer written 2.0;
- answers of the right or a wrong value (off by one, negated, reciprocal, a decimal rounded to 2-5 places),
  written as: integers (+3, - 3, 007, 1,000), decimals (2.0, .5, 0.50, and non-terminating fractions
  rounded to 7-9 places: 0.3333333), a/b (1/-2), \\frac, \\dfrac, \\tfrac, \\frac12, unreduced \\frac{4}{8},
  the sign inside or outside the fraction; LaTeX spacing (\\, \\! \\; \\quad, spaces, \\frac {1} {2}),
  $...$ inside and around the box, \\[...\\]; nested braces ({3}, {{3}}, \\frac{{1}}{{2}}), parentheses,
  \\left( \\right), \\text{3}, x = 3;
- responses: text before and after the box (sentences with numbers of their own), a period after the
  box, a period inside it (\\boxed{42.} reads no answer, then the text's fallback counts;
  \\boxed{\\frac{1}{2}.} is read), several boxes (a list when close or separated by and/or/a comma,
  else the last counts), junk or an empty box or none (then math-verify's fallback: the number after
  "answer", else the last number, a/b, \\frac{a}{b} or $...$ of the text), no number at all.

Not generated, because the reward would need math-verify's full parser and sympy to agree there (the
reward's docstring says what it does instead): expressions, radicals, sets, intervals, percentages and
units; digit groups split by spaces (math-verify reads "1\\,000" as the product 1*000); decimals whose
7th place is a rounding tie (sympy rounds the binary float); "final answer" phrases and arithmetic such as
3 - 1 = 2 in the text (math-verify ranks or evaluates them); $ or \\text{} in a list of boxes (math-verify
pairs $ across boxes, and drops a list's last \\text{} as a unit); an empty box next to a full one;
a/b followed by a period outside a box (math-verify divides in floating point); \\fbox; text with a run
of more than 256 digits, spaces and operators (the reward reads no unboxed answer there, see MAX_RUN).
"""

from __future__ import annotations

import importlib.util
import random
import time
from fractions import Fraction

import pytest

from evotrainer.tasks.math import HARNESS, MathTask

FAST_CASES, FAST_SEED = 250, 20240611
MANY_CASES, MANY_SEED = 2500, 7


def _reward():
    spec = importlib.util.spec_from_file_location("math_reward", HARNESS / "reward.py")  # the shipped file
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- values and their forms ---------------------------------------------------------------------------

def _truth(rng: random.Random) -> tuple[Fraction, str]:
    kind = rng.random()
    if kind < 0.35:
        n = rng.randint(-200, 200)
        return Fraction(n), str(n)
    if kind < 0.42:
        n = rng.choice([1, -1]) * rng.randint(1000, 999999)
        return Fraction(n), str(n)
    if kind < 0.80:
        q = rng.randint(2, 12)
        p = rng.choice([p for p in range(-60, 61) if p % q])
        value = Fraction(p, q)
        sign, a, b = ("-" if value < 0 else ""), abs(value.numerator), value.denominator
        form = rng.choice([f"{sign}\\frac{{{a}}}{{{b}}}"] * 4 + [f"{sign}\\dfrac{{{a}}}{{{b}}}", f"{value.numerator}/{b}"])
        return value, form
    if kind < 0.95:
        value = Fraction(rng.randint(-400, 400), rng.choice([2, 4, 5, 8, 10, 20, 25]))
        return value, _decimal(value, _places(value))
    n = rng.randint(-20, 20)
    return Fraction(n), f"{n}.0"


def _places(value: Fraction) -> int | None:
    """Decimal places that write value exactly (None: it does not terminate)."""
    for places in range(0, 12):
        if (value * 10 ** places).denominator == 1:
            return places
    return None


def _decimal(value: Fraction, places: int) -> str:
    scaled = round(abs(value) * 10 ** places)
    digits = str(scaled).rjust(places + 1, "0")
    text = digits if places == 0 else f"{digits[:-places]}.{digits[-places:]}"
    return ("-" if value < 0 and scaled else "") + text


def _wrong(rng: random.Random, value: Fraction) -> Fraction:
    options = [value + 1, value - 1, value + Fraction(1, value.denominator), 2 * value + 1, -value - 1]
    if value:
        options += [-value, 1 / value]
    return rng.choice([w for w in options if w != value] or [value + 1])


def _integer_forms(rng: random.Random, n: int) -> list[str]:
    k = rng.randint(2, 5)
    forms = [str(n), f"{n}.0", f"{n}.00", f"{{{n}}}", f"{{{{{n}}}}}", f"({n})", f"\\left({n}\\right)",
             f"\\text{{{n}}}", f"x = {n}", f"\\frac{{{k * n}}}{{{k}}}", f"{k * n}/{k}", f"\\!{n}", f"\\,{n}",
             f"{n}\\,", f" {n} ", f"${n}$", f"\\quad {n}", f"\\; {n}"]
    if n > 0:
        forms += [f"+{n}", f"00{n}"]
    if n < 0:
        forms += [f"- {-n}", f"-({-n})", f"-\\,{-n}"]
    if abs(n) >= 1000:
        forms += [("-" if n < 0 else "") + f"{abs(n):,}"] * 3
    return forms


def _fraction_forms(rng: random.Random, value: Fraction) -> list[str]:
    p, q = value.numerator, value.denominator
    a, sign, k = abs(p), ("-" if p < 0 else ""), rng.randint(2, 4)
    forms = [f"{sign}\\frac{{{a}}}{{{q}}}", f"{sign}\\dfrac{{{a}}}{{{q}}}", f"{sign}\\tfrac{{{a}}}{{{q}}}",
             f"\\frac{{{p}}}{{{q}}}", f"\\frac{{{a}}}{{{-q}}}" if p < 0 else f"\\frac{{{-a}}}{{{-q}}}",
             f"{p}/{q}", f"{a}/{-q}" if p < 0 else f"{p} / {q}", f"{sign}\\frac{{{k * a}}}{{{k * q}}}",
             f"{sign}\\frac {{ {a} }} {{ {q} }}", f"{{{sign}\\frac{{{a}}}{{{q}}}}}", f"\\frac{{{{{p}}}}}{{{{{q}}}}}",
             f"x = {sign}\\frac{{{a}}}{{{q}}}", f"\\left({sign}\\frac{{{a}}}{{{q}}}\\right)", f"${sign}\\frac{{{a}}}{{{q}}}$",
             f"{sign}\\frac{{{a}}}{{{q}}}\\,", f"\\!{sign}\\frac{{{a}}}{{{q}}}"]
    if a < 10 and q < 10:
        forms += [f"{sign}\\frac{a}{q}", f"{sign}\\dfrac{a}{q}"]
    places = _places(value)
    if places is not None:
        forms += [_decimal(value, places)] * 3 + [_decimal(value, places) + "0"]
        if abs(value) < 1:
            forms.append(_decimal(value, places).replace("0.", ".", 1))
    else:  # approximations: 7-9 places are read as the fraction, 2-5 are not (never a tie at the 7th place)
        for places in (rng.randint(7, 9), rng.randint(2, 5)):
            text = _decimal(value, places)
            if places < 7 or abs(Fraction(text) * 10 ** 6 - round(Fraction(text) * 10 ** 6)) != Fraction(1, 2):
                forms.append(text)
    return forms


def _forms(rng: random.Random, value: Fraction, in_list: bool = False) -> str:
    forms = _integer_forms(rng, value.numerator) if value.denominator == 1 else _fraction_forms(rng, value)
    if in_list:  # math-verify pairs $ across boxes and drops a last \text{} item of a list as a unit
        forms = [form for form in forms if "$" not in form and "\\text" not in form]
    return rng.choice(forms)


# --- responses ----------------------------------------------------------------------------------------

BEFORE = ["", "", "Let me think step by step. ", "We have $6 \\times 7 = 42$ apples and 5 pears.\n",
          "First, 12 cookies are baked in 3 trays.\n\n", "Solving for $x$ gives the value. ",
          "Half of 18 is 9, and 4 more makes it work. ", "**Solution.** We simplify 10 items first.\n",
          "To find the answer, take 7 steps. "]
AFTER = ["", "", ".", ". Done.", " is the result.", "\n\nI checked it twice.", " cookies."]
JOINED = [" or ", ", ", " and ", ";", "  ", " hmm, or maybe ", "\n"]
APART = [". Wait, let me recheck this carefully. Actually it is ",
         "\n\nHmm. That does not look right; recomputing the whole thing from the start, we get instead ",
         " is my first guess. Checking again gives "]
BOXES = ["\\boxed{{{}}}", "\\boxed{{{}}}", "$\\boxed{{{}}}$", "\\[\\boxed{{{}}}\\]"]
UNBOXED = ["The answer is {}.", "The answer is {}", "Answer: {}", "The answer is {}, not 2 or 3.", "So we get {}.",
           "so the value is ${}$.", "Thus x = {}", "which leaves {}", "\\boxed {}"]
JUNK = ["", " ", "no idea", "\\text{none}", "\\frac{{1}}{{0}}"]


def _answer_text(rng: random.Random, truth: Fraction, in_list: bool = False) -> str:
    value = truth if rng.random() < 0.55 else _wrong(rng, truth)
    return _forms(rng, value, in_list)


def _response(rng: random.Random, truth: Fraction) -> str:
    kind = rng.random()
    before, after = rng.choice(BEFORE), rng.choice(AFTER)
    if kind < 0.5:  # one box
        return before + rng.choice(BOXES).format(_answer_text(rng, truth)) + after
    if kind < 0.65:  # several boxes: a list when close or separated by and/or/comma, else the last counts
        first, last = _answer_text(rng, truth, in_list=True), _answer_text(rng, truth, in_list=True)
        gap = rng.choice(JOINED + APART)
        middle = f" \\boxed{{{_answer_text(rng, truth, in_list=True)}}}{rng.choice(APART)}" if rng.random() < 0.2 else ""
        return f"{before}\\boxed{{{first}}}{middle}{gap}\\boxed{{{last}}}{after}"
    if kind < 0.72:  # a period inside the box: \frac{1}{2}. is read, 42. is not (the text's last number counts)
        value = truth if rng.random() < 0.5 else _wrong(rng, truth)
        if value.denominator == 1:
            text = rng.choice([str(value.numerator), f"{{{value.numerator}}}", f"x = {value.numerator}"])
        else:
            sign, a, b = ("-" if value < 0 else ""), abs(value.numerator), value.denominator
            text = rng.choice([f"{sign}\\frac{{{a}}}{{{b}}}", _decimal(value, _places(value) or 3)])
        return f"{before}\\boxed{{{text}.}}{after}"
    if kind < 0.78:  # junk or an empty box
        return before + f"\\boxed{{{rng.choice(JUNK)}}}" + after
    if kind < 0.95:  # no box: the last number of the text counts
        answer = _answer_text(rng, truth).strip().strip("$")
        template = rng.choice([t for t in UNBOXED if "/" not in answer or not t.endswith(".")])
        return before + template.format(answer)
    return rng.choice(["I do not know.", "Let me think. It is hard.", "", "The answer is unclear."])


def cases(n: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        value, truth = _truth(rng)
        out.append((_response(rng, value), truth))
    return out


def _check_agreement(n: int, seed: int, data_dir) -> None:
    task, reward = MathTask(data_dir=data_dir), _reward()
    generated = cases(n, seed)
    assert len(set(generated)) > n * 0.9
    start = time.perf_counter()
    disagree, correct = [], 0
    for response, truth in generated:
        verdict = task.verify(response, truth)
        scored = reward.compute_score("evotrainer/math_synthetic", response, truth)
        correct += verdict.correct
        if bool(scored["correct"]) != verdict.correct:
            disagree.append(f"truth={truth!r} response={response!r}: verify={verdict.correct} "
                            f"(parsed {verdict.parsed!r}), reward correct={scored['correct']}")
    elapsed = time.perf_counter() - start
    assert not disagree, f"{len(disagree)} of {n} generated answers disagree:\n" + "\n".join(disagree[:40])
    assert n * 0.25 < correct < n * 0.75, correct  # both verdicts well represented
    print(f"{n} cases (seed {seed}): {correct} correct by both, {elapsed:.1f} s")


@pytest.mark.fast
def test_math_reward_agrees_with_the_verifier_on_generated_answers(tmp_path):
    _check_agreement(FAST_CASES, FAST_SEED, tmp_path)


def test_math_reward_agrees_with_the_verifier_on_many_more_generated_answers(tmp_path):
    _check_agreement(MANY_CASES, MANY_SEED, tmp_path)


HOSTILE = {
    "1+1+...": "1+" * 8000 + "x", "1 1 1 ...": "1 " * 8000 + "x", "answer 1+1+...": "answer " + "1+" * 8000,
    "nested braces": "\\boxed{" + "{" * 8000 + "1" + "}" * 8000 + "}", "signs": "\\boxed{" + "-" * 16000 + "1}",
    "parentheses": "\\boxed{" + "(" * 8000 + "1" + ")" * 8000 + "}", "many boxes": "\\boxed{1} or " * 1200,
    "unclosed boxes": "\\boxed{" * 2000 + "}", "dollars": "$1$ " * 4000, "list": "\\boxed{" + "1," * 8000 + "1}",
    "10,000 digits": "\\boxed{" + "7" * 10000 + "}", "10,000 digits unboxed": "so " + "7" * 10000,
    "10,000 digit fraction": "\\boxed{\\frac{" + "7" * 10000 + "}{3}}", "answer words": "answer " * 2000,
}


@pytest.mark.fast
@pytest.mark.parametrize("name", list(HOSTILE))
def test_math_reward_is_quick_and_never_raises_on_hostile_responses(name):
    """A reward that raises or runs past its sandbox timeout fails the training job: 16,000-character
    responses that would make its regexes backtrack, its loops nest or Python refuse a long int."""
    reward = _reward()
    for truth in ("3", "7" * 5000):
        start = time.perf_counter()
        scored = reward.compute_score("evotrainer/math_synthetic", HOSTILE[name], truth)
        assert time.perf_counter() - start < 2.0, name
        assert set(scored) == {"score", "correct", "format_ok"} and scored["correct"] in (0.0, 1.0)
