"""A lenient, domain-free reading of a response's final answer: one rule, used by the trusted findings
(``scoring.trusted_findings``: label_disagreement) and appended VERBATIM to harness files by the offline
agent's repairs (``agents.repairs``), so the rule the diagnosis measures is the rule a repair applies.

Standard library only, every name prefixed ``lenient_`` / ``_LENIENT`` / ``_lenient``: the source below this
docstring is appended to a harness's reward.py or curriculum.py beside that file's own names (a
reward.py runs in the sandboxed reward worker, standard library only: it must stay self-contained).

The rule:

- the candidates of a response (its last ``LENIENT_TAIL_CHARS`` characters): its explicit answer, the content
  of the last ``\\boxed{...}`` (balanced braces), else of the last ``<answer>...</answer>``, when there is one
  (it is then the only candidate: a marked answer is the answer), else the last number (integer, decimal or
  a/b, with an optional sign and thousands commas) and the last non-empty line;
- an answer is canonicalised: ``\\dfrac``/``\\tfrac`` read as ``\\frac``; ``\\left``, ``\\right``, ``$``,
  ``\\!``, ``\\,`` and all whitespace dropped; trailing ``.,;:!`` stripped; lower case; a leading one-letter
  assignment dropped (``x=5`` reads ``5``); a number (an integer, decimal, a/b or ``\\frac{a}{b}``, thousands
  commas allowed) becomes its exact value as a reduced fraction (``0.5``, ``1/2`` and ``\\frac{1}{2}`` all
  read ``1/2``; ``42.0`` reads ``42``);
- ``lenient_answer``: the canonical form of the first candidate found (marked, else number, else line), or
  ``""`` when the response has none;
- ``lenient_label_ok(truth)``: the label is an answer to compare: non-empty and at most
  ``LENIENT_MAX_ANSWER_CHARS`` characters once canonical, and not structured data (a JSON object or list: a
  code task's tests, an environment's instance);
- ``lenient_match(response, truth)``: the label is an answer to compare and its canonical form equals that of
  ANY of the response's candidates.
"""

import json as _lenient_json
import re as _lenient_re
from fractions import Fraction as _LenientFraction

LENIENT_TAIL_CHARS = 2000  # only the end of a response is read for its final answer
LENIENT_MAX_ANSWER_CHARS = 100
_LENIENT_NUMBER = _lenient_re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")
_LENIENT_EXACT = _lenient_re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?")
_LENIENT_FRAC = _lenient_re.compile(r"(-?)\\frac\{(-?\d+)\}\{(-?\d+)\}")
_LENIENT_DROP = _lenient_re.compile(r"\s+|\$|\\!|\\,|\\left|\\right")
_LENIENT_ASSIGNMENT = _lenient_re.compile(r"[a-z]=(?=.)")


def lenient_last_boxed(text):
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 1, start + len("\\boxed{")
    for i in range(begin, len(text)):
        char = text[i]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[begin:i]
    return None


def lenient_last_tagged(text):
    end = text.rfind("</answer>")
    start = text.rfind("<answer>", 0, end) if end >= 0 else -1
    return text[start + len("<answer>"):end] if start >= 0 else None


def lenient_candidates(text):
    """The response's candidate answers, raw: its marked answer alone (last boxed, else last <answer> tag), else
    its last number and its last non-empty line (those found)."""
    text = str(text)[-LENIENT_TAIL_CHARS:]
    marked = lenient_last_boxed(text)
    if marked is None or not marked.strip():
        marked = lenient_last_tagged(text)
    if marked is not None and marked.strip():
        return [marked]
    found = []
    numbers = _LENIENT_NUMBER.findall(text)
    if numbers:
        found.append(numbers[-1].rstrip(","))
    lines = [line for line in text.splitlines() if line.strip()]
    if lines:
        found.append(lines[-1])
    return found


def lenient_number(text):
    """The exact value of a canonical-looking number (int, decimal, a/b, \\frac{a}{b}), else None."""
    match = _LENIENT_FRAC.fullmatch(text)
    try:
        if match:
            value = _LenientFraction(int(match.group(2)), int(match.group(3)))
            return -value if match.group(1) else value
        if _LENIENT_EXACT.fullmatch(text):
            return _LenientFraction(text.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None
    return None


def lenient_canonical(answer):
    """The canonical form of one answer (see the module's rule); "" for none."""
    if answer is None:
        return ""
    text = str(answer).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = _LENIENT_DROP.sub("", text).rstrip(".,;:!").lower()
    assignment = _LENIENT_ASSIGNMENT.match(text)
    text = text[assignment.end():] if assignment else text
    value = lenient_number(text)
    return text if value is None else str(value)


def lenient_answer(text):
    """The canonical final answer of a response: its first candidate (marked, else number, else line), or ""."""
    found = lenient_candidates(text)
    return lenient_canonical(found[0]) if found else ""


def lenient_label_ok(truth):
    """True when ``truth`` is a short answer to compare (not empty, not long, not a JSON object or list)."""
    target = lenient_canonical(truth)
    if not target or len(target) > LENIENT_MAX_ANSWER_CHARS:
        return False
    text = str(truth).strip()
    if text[:1] in ("{", "["):
        try:
            return not isinstance(_lenient_json.loads(text), dict | list)
        except ValueError:
            return True
    return True


def lenient_match(text, truth):
    """True when ``truth`` is a short answer and any candidate answer of ``text`` equals it, both canonical."""
    if not lenient_label_ok(truth):
        return False
    target = lenient_canonical(truth)
    return any(lenient_canonical(c) == target for c in lenient_candidates(text))
