import pandas as pd
import torch

from evotrainer.policy.tiny import build_model, build_tokenizer, load_policy, param_count, save_policy
from evotrainer.tasks.arithmetic import Level, is_correct, make_splits, parse_answer


def test_splits_are_disjoint_and_reproducible(splits):
    train, val, test = (set(splits[s]["prompt"]) for s in ("train", "val", "test"))
    assert not train & test and not train & val and not val & test
    again = make_splits([Level(2, 19, 0.2), Level(2, 99, 0.5), Level(3, 99, 0.3)],
                        {"train": 3000, "val": 200, "test": 200, "probe": 32}, "+-", seed=7)
    pd.testing.assert_frame_equal(again["test"], splits["test"])


def test_ground_truth_is_the_value_of_the_expression(splits):
    for row in splits["val"].itertuples():
        assert int(row.ground_truth) == eval(row.prompt.rstrip("="))


def test_probe_prompts_come_from_the_training_partition(splits):
    held_out = set(splits["val"]["prompt"]) | set(splits["test"]["prompt"])
    assert not set(splits["probe"]["prompt"]) & held_out


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


def test_the_test_split_can_be_made_alone_and_equal(splits):
    levels = [Level(2, 19, 0.2), Level(2, 99, 0.5), Level(3, 99, 0.3)]
    alone = make_splits(levels, {"test": 200}, "+-", seed=7)["test"]
    pd.testing.assert_frame_equal(alone, splits["test"])
