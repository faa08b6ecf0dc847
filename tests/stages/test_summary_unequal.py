"""summary.md's lead comparison (the fixed recipe at the whole search's charge) claims equal compute: where the
loop's search was charged more (a steps budget, a promoted change that samples more per step; measured in the
default run at ca9f8b8: 934,576 against 614,400, docs/measured/default-run-ledger-ca9f8b8.json), the comparison
says so instead of reading as equal."""

import pytest

from evotrainer.stages.summary import comparisons, unequal_note

pytestmark = pytest.mark.fast


def _summary(search: int) -> dict:
    fixed = {"label": "fixed recipe, the whole search's budget", "test_accuracy": 0.4935, "charged": 614400}
    return {"evolved_test_accuracy": 0.504,
            "ledger": {"search": {"charged": search}, "promoted_path": {"charged": 715520},
                       "fixed": {"baseline_search": fixed,
                                 "baseline": {"label": "equal steps", "test_accuracy": 0.434, "charged": 153600}}}}


def test_an_unequal_whole_charge_comparison_says_so():
    lead, steps = comparisons(_summary(934576))
    assert lead["arm"] == "baseline_search" and lead["equal_charge"] is False
    assert "not at equal compute: the loop was charged 52% more" in unequal_note(lead)
    assert "equal_charge" not in steps and unequal_note(steps) == ""  # labelled by its own budget


def test_an_equal_one_says_nothing():
    lead = comparisons(_summary(614400))[0]
    assert lead["equal_charge"] is True and unequal_note(lead) == ""
    assert comparisons(_summary(614400 + 6000))[0]["equal_charge"] is True  # within 1%
