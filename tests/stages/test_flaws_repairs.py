"""What counts as a repair (stages/flaws_repairs.py): a final harness that restores a flawed file to its shipped
text, up to formatting, or reaches for the package's harnesses, does not."""

from __future__ import annotations

import pytest

from evotrainer.contracts.flaw import Flaw
from evotrainer.stages.flaws_repairs import same_up_to_formatting, shipped_contact

pytestmark = pytest.mark.fast

SHIPPED = '"""Reward."""\nimport re\n\n_ANSWER = re.compile(r"^(-?\\d+)$")\n\n\ndef compute_score(d, s, g, e=None):\n    return 1.0\n'
DIFF = "--- a/reward.py\n+++ b/reward.py\n@@ -1 +1 @@\n-x\n+y\n"


def harness(folder, reward: str, recipe: str = "lr: 2.0e-4\n"):
    folder.mkdir(parents=True)
    (folder / "reward.py").write_text(reward)
    (folder / "recipe.yaml").write_text(recipe)
    return folder


def test_formatting_does_not_hide_a_restored_file(tmp_path):
    reformatted = "import re\n_ANSWER = re.compile( r'^(-?\\d+)$' )   # put back\ndef compute_score(d, s, g, e=None):\n    '''x'''\n    return 1.0\n"
    a, b = harness(tmp_path / "a", SHIPPED, "lr: 0.0002\n"), harness(tmp_path / "b", reformatted, "# c\nlr: 2.0e-4\n")
    assert same_up_to_formatting(a / "reward.py", b / "reward.py")
    assert same_up_to_formatting(a / "recipe.yaml", b / "recipe.yaml")
    changed = harness(tmp_path / "c", SHIPPED.replace("-?", ""))
    assert not same_up_to_formatting(a / "reward.py", changed / "reward.py")


def test_shipped_contact_names_restored_and_reaching_files(tmp_path):
    reference = harness(tmp_path / "reference", SHIPPED)
    flaw = Flaw(name="f", folder=tmp_path, diff=DIFF)
    restored = harness(tmp_path / "restored", SHIPPED)
    assert shipped_contact(restored, flaw, reference) == (["reward.py"], [])
    repaired = harness(tmp_path / "repaired", SHIPPED.replace("return 1.0", "return 0.5 + 0.5"))
    assert shipped_contact(repaired, flaw, reference) == ([], [])
    reaching = harness(tmp_path / "reaching", "from evotrainer.tasks.harnesses.default import reward\n"
                                              "compute_score = reward.compute_score\n")
    assert shipped_contact(reaching, flaw, reference) == ([], ["reward.py"])
    by_name = harness(tmp_path / "by_name", "import importlib\ncompute_score = importlib.import_module('x').f\n")
    assert shipped_contact(by_name, flaw, reference)[1] == ["reward.py"]
    docstring_only = harness(tmp_path / "doc", '"""Unlike evotrainer\'s shipped reward."""\ndef compute_score(*a):\n    return 0.0\n')
    assert shipped_contact(docstring_only, flaw, reference) == ([], [])
