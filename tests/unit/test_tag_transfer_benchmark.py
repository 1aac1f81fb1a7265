"""benchmarks/tag_transfer.py's pieces (#52 item 1): which members lose their tags in each arm, the tag rates it
reports, and which token counts as the tag's opening in a completion."""

from __future__ import annotations

import pytest
import torch

from pubswap_flwr.policy.model import load_tokenizer, resolve_model
from tests.scripts import load_script

TEXTS = ("9\n<answer>9</answer>", "The answer is 0\n<answer>0</answer>", "8", "<answer>9</answer>")
REWARDS = (1.0, 0.0, 0.0, 1.0)


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/tag_transfer.py")


def test_tags_are_stripped_with_their_inner_text_kept(bench):
    assert bench.strip_tags("So <answer>7</answer>.") == "So 7."
    assert bench.strip_tags("<answer>1</answer> and <answer>2</answer>") == "1 and 2"
    assert bench.strip_tags("no tag here") == "no tag here"


def test_each_arm_strips_the_tags_of_the_members_it_names(bench):
    assert bench.arm_texts(TEXTS, REWARDS, "as sent") == list(TEXTS)
    assert bench.arm_texts(TEXTS, REWARDS, "wrong stripped") == [TEXTS[0], "The answer is 0\n0", "8", TEXTS[3]]
    assert bench.arm_texts(TEXTS, REWARDS, "all stripped") == ["9\n9", "The answer is 0\n0", "8", "9"]
    with pytest.raises(ValueError, match="unknown arm 'right stripped'"):
        bench.arm_texts(TEXTS, REWARDS, "right stripped")


def test_tag_rates_count_right_and_wrong_members_apart(bench):
    group = bench.DonorGroup(None, TEXTS, ((),) * 4, ((),) * 4, REWARDS)
    assert group.mixed
    assert bench.tag_rate([group, group], right=True) == (4, 4)
    assert bench.tag_rate([group, group], right=False) == (2, 4)  # "8" never opened the tag
    assert not bench.DonorGroup(None, TEXTS[:1], ((),), ((),), (1.0,)).mixed


def test_the_opening_token_is_the_one_where_each_answer_tag_begins(bench):
    """The embedded tokenizer spells "9\\n<answer>" as '9', '\\n', '<answer', '>' and " <answer>" as ' <', 'answer',
    '>': the opening is '<answer' in one and the space-led ' <' in the other, one per tag, never the closing tag."""
    tokenizer = load_tokenizer(resolve_model("embedded:tiny"))
    rows = [tokenizer(text, add_special_tokens=False)["input_ids"]
            for text in ("9\n<answer>9</answer>", "x <answer>5</answer> <answer>6</answer>", "no tag")]
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    opening = bench.opening_token_mask(tokenizer, ids, mask)
    found = [[tokenizer.decode([rows[row][i]]) for i in opening[row].nonzero().flatten().tolist()]
             for row in range(len(rows))]
    assert found == [["<answer"], [" <", " <"], []]
    assert opening[1].nonzero().flatten().tolist() == [1, 8]
