"""Reward for task=math, in verl's custom-reward signature: ``compute_score(data_source, solution_str,
ground_truth, extra_info=None)`` returns score, correct and format_ok.

The learning signal only: the task's trusted verify (math-verify, ``evotrainer.tasks.math.verify_math``)
decides correctness. This mirrors math-verify (0.9) with the standard library for numeric answers
(integers, decimals, a/b, \\frac{a}{b}: what the task's ground truths hold) and agrees with it there
(tests/tasks/test_math_reward_agrees_with_verifier.py says which forms that covers):

- the answer is the last \\boxed{...}; boxes just before it (fewer than 10 characters apart, or fewer than
  70 with "and", "or", a comma or a semicolon between, and another content) join it as a list, so hedging
  (\\boxed{3} or \\boxed{4}) matches no single number. An empty box, or one ending in a period
  (\\boxed{42.}; \\boxed{\\frac{1}{2}.} is read), holds no answer; then, as without a box, math-verify's
  fallback counts: the number after "answer:", else after "answer", else the number, a/b, \\frac{a}{b}
  or $...$ that ends last in the text;
- numbers compare as math-verify compares them: equal values are equal (0.5 = \\frac{1}{2} = 1/2,
  2 = 2.0 = \\frac{4}{2}, 1,000 = 1000, {3} = (3) = x = 3); a decimal also matches a non-integer value
  that rounds to the same 6 decimal places (0.3333333 = \\frac{1}{3}), never an integer (2.0000001 != 2);
- anything else (expressions, radicals, sets, intervals) is compared as normalised text of the box, which
  misses the equivalent forms math-verify's symbolic comparison accepts: there the two can disagree.

``format_ok``: the response has a \\boxed{} answer that holds an answer (the format the task's prompts
ask for).

Self-contained on purpose (standard library only; no evotrainer, no math_verify): it runs in the sandboxed
reward worker (evotrainer.sandbox.reward_worker), which loads the harness's staged, read-only copy of this
file. Under trainer=verl, verl loads the trusted adapter evotrainer/backends/verl/reward_adapter.py by path
(``reward.custom_reward_function.path``), and that adapter calls this ``compute_score`` through the same
sandboxed worker; this file is never imported into verl's process.
"""

import re
from fractions import Fraction

_DECIMAL = re.compile(r"\d+(?:\.\d+)?|\.\d+")
_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_SLASH = re.compile(r"([+-]?\s*\d+)\s*/\s*([+-]?\s*\d+)")
_EQUATION = re.compile(r"(?:[a-zA-Z0-9\s+\-*/^()]|\\times|\\cdot)+=(?P<rhs>[^=]*)")
_TEXT = re.compile(r"\\(?:text|textbf|mathbf|mathrm)\s*\{\s*(?P<inner>-?(?:[1-9]\d*|0))\s*\}")
_SPACES = re.compile(r"\\[,;:> ]|\\q?quad")
_SEPARATOR = re.compile(r"\b(?:and|or)\b|,|;")
# Without a readable box, math-verify's fallbacks, in its order: after the word "answer:", after "answer",
# then anywhere; each a $...$ or a bare \frac{a}{b} (its LaTeX), or a plain number or expression such as 3/4.
_OPS = r"+\-*×/^()÷"
_INLINE = r"(?<![\\\d])\$(?P<inline>(?:\\\$|[^\n$])+?)(?<!\\)\$"
_BARE_FRAC = r"(?P<frac>-?\\frac\{-?\d+(?:[.,]\d+)?\}\{-?\d+(?:[.,]\d+)?\})"
_EXPR = (rf"(?:^|\s|=)(?:\*\*)?(?P<expr>-?\(?-?\d[\d.\s{_OPS}]*[{_OPS}][\d.\s{_OPS}]+\)?)"
         r"(?:\*\*)?(?:[.,:\s)$]|$)")
_NUMBER = (r"(?:^|\s|=)(?:\*\*)?\$?(?:(?P<thousands>-?[1-9]\d{0,2}(?:[ ,]\d{3})+(?:\.\d+)?)|"
           r"(?P<number>-?\d+(?:[.,]\d+)?|\.\d+))")
# math-verify's expression pattern backtracks quadratically over a long run of digits, spaces and operators
# (1+1+1+...): a text holding such a run (longer than this, with several digits) reads no unboxed answer
MAX_RUN = 256
_RUN = re.compile(rf"[\d.\s{_OPS}]{{{MAX_RUN + 1},}}")
_FALLBACKS = [
    [re.compile(rf"(?i:answer):.{{0,50}}?(?:{_INLINE}|{_BARE_FRAC})", re.DOTALL),
     re.compile(rf"(?i:answer):(?:.{{0,100}}=\s*|.{{0,50}}?)(?:{_EXPR}|{_NUMBER})(?!\s*=)")],
    [re.compile(rf"(?i:answer).{{0,50}}?(?:{_INLINE}|{_BARE_FRAC})", re.DOTALL),
     re.compile(rf"(?i:answer)(?:.{{0,100}}=\s*|.{{0,50}}?)(?:{_EXPR}|{_NUMBER})(?!\s*=)")],
    [re.compile(_INLINE), re.compile(_BARE_FRAC), re.compile(_EXPR), re.compile(_NUMBER)],
]


def _box_contents(text):
    """math-verify's ``extract_boxed_content(mode="last")``: (start, content) of the last box and of the
    boxes joined to it, right to left, or [] if no box closes."""
    found, end = [], len(text)
    while True:
        start = text.rfind("\\boxed", 0, end)
        if start < 0:
            return found
        brace = start + len("\\boxed")
        while brace < end and text[brace].isspace():
            brace += 1
        if brace >= end or text[brace] != "{":
            return found
        depth, close = 1, None
        for i in range(brace + 1, end):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                close = i
                break
        if close is None:
            return found
        content = text[brace + 1:close].strip()
        if found:
            between = text[close + 1:found[-1][0]]
            joined = len(between) < 10 or (content != found[-1][1] and len(between) < 70
                                            and _SEPARATOR.search(between))
            if not joined:
                return found
        if not found or found[-1][1] != content:
            found.append((start, content))
        else:
            found[-1] = (start, content)
        end = start


def boxed_answer(text):
    """The boxed answer as math-verify extracts it (several joined boxes as one comma list), or None: no
    \\boxed{...} with content up to the text's last closing brace."""
    start, end = text.find("\\boxed{"), text.rfind("}")
    if start < 0 or end < start + len("\\boxed{") + 1:
        return None
    found = _box_contents(text[start:end + 1])
    return ",".join(content for _, content in reversed(found)) if found else None


def _strip(answer):
    """math-verify's removals: \\! (and the spaces after it), $, \\$, \\displaystyle, \\left, \\right."""
    answer = re.sub(r"\\!\s*|\\\$|\$|\\displaystyle|\\left|\\right", "", answer)
    return re.sub(r"\\[dtc]frac", r"\\frac", answer).strip()


def normalise(answer):
    """math-verify's LaTeX clean-up, for what numeric answers hold (LaTeX spaces read as spaces)."""
    return _SPACES.sub(" ", _strip(answer)).strip()


def _number(text):
    """Fraction(text), or None where Python refuses the digits (more than sys.int_info's 4300 by default)."""
    try:
        return Fraction(text)
    except ValueError:
        return None


def _group(text):
    """(content, rest) of a leading {...} group or single character (a \\frac argument), or None."""
    text = text.lstrip()
    if text[:1] != "{":
        return (text[0], text[1:]) if text[:1].isdigit() else None
    depth = 0
    for i, char in enumerate(text):
        depth += {"{": 1, "}": -1}.get(char, 0)
        if depth == 0:
            return text[1:i], text[i + 1:]
    return None


def _integer(text):
    value = read_number(text)
    return value[0] if value is not None and value[1] == "exact" and value[0].denominator == 1 else None


def _fraction(item):
    """\\frac{a}{b} (also \\frac12, \\frac{{a}}{{b}}, \\frac {a} {b}) or a/b with integer a and b."""
    if item.startswith("\\frac"):
        arguments = item[len("\\frac"):].lstrip()
        numerator = _group(arguments)
        if numerator is None:
            return None
        rest = numerator[1].lstrip()
        bare = arguments[:1] != "{" and rest[:1] != "{"  # \frac123 is \frac{1}{23}
        denominator = (rest, "") if bare else _group(rest)
        if denominator is None or denominator[1].strip() not in ("", "."):  # \frac{1}{2}. is read as 1/2
            return None
        parts = numerator[0], denominator[0]
    elif match := _SLASH.fullmatch(item):
        parts = match.groups()
    else:
        return None
    numerator, denominator = _integer(parts[0]), _integer(parts[1])
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def read_number(item, in_list=False):
    """(value, kind) for one numeric item, or None. kind: "exact" (integers, fractions), "decimal" (a sympy
    Float), or "text" (\\text{3}: a symbol that math-verify compares by its name). In a list, items in
    braces, \\text or equations are not read (math-verify nests or mis-reads them)."""
    item = item.strip()
    if (match := _EQUATION.fullmatch(item)) and not in_list:
        item = match.group("rhs").strip()
    if match := _TEXT.fullmatch(item):
        value = None if in_list else _number(match.group("inner"))
        return None if value is None else (value, "text")
    sign = 1
    while True:  # signs, parentheses and braces, outside in (a loop: no recursion on hostile nesting)
        if item[:1] in ("-", "+"):
            sign, item = (-sign if item[0] == "-" else sign), item[1:].strip()
        elif item[:1] + item[-1:] == "()":
            item = item[1:-1].strip()
        elif item[:1] + item[-1:] == "{}" or item[:2] + item[-2:] == "\\{\\}":
            if in_list:
                return None  # {3} is the set {3}: alone it matches 3, in a list it is a set inside the set
            width = 2 if item[:1] == "\\" else 1
            item = item[width:-width].strip()
        else:
            break
    if _DECIMAL.fullmatch(item) or _THOUSANDS.fullmatch(item) and not in_list:
        value = _number(item.replace(",", ""))
        return None if value is None else (sign * value, "decimal" if "." in item else "exact")
    value = _fraction(item)
    return None if value is None else (sign * value, "exact")


def _split(answer):
    """Top-level comma-separated items (commas inside braces stay)."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(answer):
        depth += {"{": 1, "}": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(answer[start:i])
            start = i + 1
    return [*items, answer[start:]]


def read_answer(answer):
    """An answer as a list of numbers (one, or several for a list), or None when it is not numeric. A list
    opening with an equation (x = 1, 2) is the list of its right-hand side and the rest."""
    if _THOUSANDS.fullmatch(_strip(answer)):  # 1,000 (not 1,000\, nor +1,000: those are lists)
        return [read_number(_strip(answer))]
    items = _split(normalise(answer))
    if len(items) > 1 and (match := _EQUATION.fullmatch(items[0].strip())):
        items[0] = match.group("rhs")
    values = [read_number(item, in_list=len(items) > 1) for item in items]
    return None if any(value is None for value in values) else values


def numbers_match(truth, answer):
    """math-verify's numeric comparison: equal values; or, if either is a decimal, the same value rounded
    to 6 decimal places where neither is an exact integer (a sympy Integer never equals a Float); \\text{n}
    matches an exact integer n only."""
    if "text" in (truth[1], answer[1]):
        return truth[0] == answer[0] and {truth[1], answer[1]} <= {"text", "exact"}
    if truth[0] == answer[0]:
        return True
    if "decimal" not in (truth[1], answer[1]):
        return False
    if any(kind == "exact" and value.denominator == 1 for value, kind in (truth, answer)):
        return False
    return round(truth[0], 6) == round(answer[0], 6)


def answers_match(truth, answer):
    """A single truth matches a list only if every item equals it; lists match item by item."""
    if len(truth) == len(answer) == 1:
        return numbers_match(truth[0], answer[0])
    if len(truth) == 1:
        return all(item[0] == truth[0][0] for item in answer)
    return len(truth) == len(answer) and all(
        numbers_match(t, a) for t, a in zip(sorted(truth), sorted(answer), strict=True))


def _fallback_item(match):
    groups = match.groupdict()
    if groups.get("thousands") is not None:  # 1,234 and 1 234
        return re.sub(r"[ ,]", "", groups["thousands"])
    if groups.get("number") is not None:  # 12,5 is 12.5
        return groups["number"].replace(",", ".")
    item = next(groups[name] for name in ("expr", "inline", "frac") if groups.get(name) is not None).strip()
    return item[:-1] if item[-2:-1].isdigit() and item[-1:] == "." else item  # 3/5. is 3/5.0 there


def fallback_answer(text):
    """math-verify's answer for a text without a readable box: in the first of its fallbacks that finds
    one, the candidate ending last (then starting first) that reads as a number."""
    if any(sum(char.isdigit() for char in run.group()) > 1 for run in _RUN.finditer(text)):
        return None
    for patterns in _FALLBACKS:
        found = sorted(((match.end(), -match.start(), _fallback_item(match))
                        for pattern in patterns for match in pattern.finditer(text)), reverse=True)
        for _, _, item in found:
            values = read_answer(item)
            if values is not None:
                return values
    return None


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    text = str(solution_str)
    truth_text = str(ground_truth).strip()
    boxed = boxed_answer(text)
    answer = read_answer(boxed) if boxed is not None else None
    # math-verify's parser reads no answer from an empty box or one ending in a period (\boxed{42.}, but
    # \boxed{\frac{1}{2}.} is 1/2): it goes on to the rest of the text
    readable = boxed is not None and boxed.strip() != "" and (answer is not None or not normalise(boxed).endswith("."))
    if not readable:
        answer = fallback_answer(text)
    truth = read_answer(truth_text)
    if truth is not None and answer is not None:
        correct = answers_match(truth, answer)
    elif readable:
        correct = re.sub(r"\s+", "", normalise(boxed)) == re.sub(r"\s+", "", normalise(truth_text))
    else:
        correct = False
    return {"score": 1.0 if correct else 0.0, "correct": float(correct), "format_ok": float(readable)}
