import pandas as pd
import pytest
import torch

from evotrainer.policy.tiny import build_model, build_tokenizer, load_policy, param_count, save_policy
from evotrainer.tasks.arithmetic import is_correct, parse_answer

pytestmark = pytest.mark.fast


def _text(frame: pd.DataFrame) -> list[str]:
    """The prompt text of each row (one user message)."""
    return [messages[-1]["content"] for messages in frame["prompt"]]


def test_splits_are_disjoint_and_reproducible(splits, task):
    train, val, test = (set(_text(splits[s])) for s in ("train", "val", "test"))
    assert not train & test and not train & val and not val & test
    again = task.splits({"train": 3000, "val": 200, "test": 200, "probe": 32}, seed=7)
    pd.testing.assert_frame_equal(again["test"], splits["test"])


def test_ground_truth_is_the_value_of_the_expression(splits):
    for text, truth in zip(_text(splits["val"]), splits["val"]["ground_truth"], strict=True):
        assert int(truth) == eval(text.rstrip("="))


def test_probe_prompts_come_from_the_training_partition(splits):
    held_out = set(_text(splits["val"])) | set(_text(splits["test"]))
    assert not set(_text(splits["probe"])) & held_out


def test_answer_parsing():
    assert parse_answer("-28") == -28 and parse_answer(" 7 ") == 7
    assert parse_answer("7+") is None and parse_answer("") is None
    assert is_correct("-28", "-28") and not is_correct("28", "-28")


def test_char_tokenizer_round_trips_without_spaces():
    tok = build_tokenizer()
    ids = tok.encode("23-58+7=", add_special_tokens=False)
    assert len(ids) == 8 and tok.unk_token_id not in ids
    assert tok.decode(ids) == "23-58+7="


def test_tiny_policy_is_a_normal_hf_directory(tmp_path):
    tok = build_tokenizer()
    model = build_model(tok)
    assert 100_000 <= param_count(model) <= 1_000_000
    save_policy(model, tok, tmp_path / "p")
    loaded, loaded_tok = load_policy(tmp_path / "p")
    ids = torch.tensor([[tok.bos_token_id] + tok.encode("1+2=", add_special_tokens=False)])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, loaded(ids).logits)
    assert loaded_tok.padding_side == "left" and loaded_tok.decode(ids[0, 1:]) == "1+2="


def test_the_test_split_can_be_made_alone_and_equal(splits, task):
    alone = task.splits({"test": 200}, seed=7)["test"]
    pd.testing.assert_frame_equal(alone, splits["test"])


def test_tiny_tokenizer_chat_template_renders_the_prompt_verbatim_after_bos(tmp_path):
    from evotrainer.contracts.task import messages
    from evotrainer.policy.chat import eos_token_ids, render_prompts

    tok = build_tokenizer()
    assert render_prompts(tok, [messages("23-58+7=")]) == ["<bos>23-58+7="]
    model = build_model(tok)
    save_policy(model, tok, tmp_path / "p")
    loaded_model, loaded = load_policy(tmp_path / "p")
    assert render_prompts(loaded, [messages("1+2=", system="ignored")]) == ["<bos>1+2="]
    assert eos_token_ids(loaded_model, loaded) == [tok.eos_token_id]
