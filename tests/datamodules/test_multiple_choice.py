"""Multiple-choice setup for the LM (datamodules/multiple_choice.py, models/mc_lm.py)."""

from __future__ import annotations

import json

import pytest
import torch

from lit_lowrank.datamodules.multiple_choice import (
    EMBEDDED_ITEMS,
    MultipleChoiceDataModule,
    detect_format,
    format_prompt,
    load_mc_jsonl,
)

RECORDS = {
    "boolq": {"passage": "Water boils at 100 C at sea level.", "question": "does water boil at 100 c", "answer": True},
    "piqa": {"goal": "Open a jar.", "sol1": "Twist the lid.", "sol2": "Paint the lid.", "label": 0},
    "winogrande": {"sentence": "The cup fell off the table because _ was round.", "option1": "the cup",
                   "option2": "the table", "answer": "1"},
    "hellaswag": {"ctx": "He picks up the ball and", "endings": ["eats it.", "throws it.", "sings.", "melts."],
                  "label": "1"},
    "obqa": {"question_stem": "Plants need", "choices": {"label": ["A", "B", "C", "D"],
                                                         "text": ["sunlight", "rocks", "plastic", "noise"]},
             "answerKey": "A"},
    "arc": {"question": "Which is a mammal?", "choices": {"label": ["A", "B", "C", "D"],
                                                          "text": ["shark", "whale", "trout", "frog"]},
            "answerKey": "B"},
}
ANSWERS = {"boolq": "yes", "piqa": "Twist the lid.", "winogrande": "the cup", "hellaswag": "throws it.",
           "obqa": "sunlight", "arc": "whale"}


def test_embedded_items_are_well_formed():
    assert 50 <= len(EMBEDDED_ITEMS) <= 100
    for item in EMBEDDED_ITEMS:
        assert len(item["choices"]) == 4 == len(set(item["choices"]))
        assert 0 <= item["label"] < 4
    labels = torch.tensor([it["label"] for it in EMBEDDED_ITEMS])
    assert torch.bincount(labels, minlength=4).min() >= 10  # the answer position is not a giveaway
    assert format_prompt(EMBEDDED_ITEMS[0]).endswith("\nD. " + EMBEDDED_ITEMS[0]["choices"][3] + "\nAnswer:")


@pytest.mark.parametrize("fmt", sorted(RECORDS))
def test_jsonl_loaders_parse_every_format(fmt, tmp_path):
    path = tmp_path / f"{fmt}.jsonl"
    arc3 = {**RECORDS["arc"], "choices": {"label": ["A", "B", "C"], "text": ["x", "y", "z"]}, "answerKey": "A"}
    lines = [RECORDS[fmt]] + ([arc3] if fmt == "arc" else [])
    path.write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    assert detect_format(RECORDS[fmt]) == fmt
    items, skipped = load_mc_jsonl(path)
    assert len(items) == 1 and skipped == (1 if fmt == "arc" else 0)  # a 3-option ARC item is skipped
    assert items[0]["choices"][items[0]["label"]] == ANSWERS[fmt]


def test_missing_file_names_the_parameter(tmp_path):
    with pytest.raises(FileNotFoundError, match="source"):
        load_mc_jsonl(tmp_path / "none.jsonl")
    with pytest.raises(ValueError, match="format"):
        MultipleChoiceDataModule(format="squad")


def test_datamodule_batches_and_option_head_scores_the_letters():
    from lit_lowrank.models.mc_lm import MultipleChoiceLM

    dm = MultipleChoiceDataModule(source="embedded", tokenizer="byte", max_length=160, batch_size=4)
    dm.setup("fit")
    batch = next(iter(dm.val_dataloader()))
    assert batch["x"].shape == (4, 160) and batch["x"].dtype == torch.long and batch["y"].shape == (4,)
    assert len(dm.train_set) + len(dm.val_set) == len(EMBEDDED_ITEMS)
    torch.manual_seed(0)
    net = MultipleChoiceLM(None, tokenizer="byte", model_config={
        "model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 258}).eval()
    head = net.make_head(4)
    with torch.no_grad():
        scores = head(net(batch["x"]))
        # the same as the LM's next-token logits of " A".." D" after "Answer:" (right padding is invisible)
        lengths = (batch["x"] >= 0).sum(1)
        for i in range(4):
            ids = batch["x"][i, : lengths[i]][None]
            logits = net.lm(input_ids=ids).logits[0, -1]
            torch.testing.assert_close(scores[i], logits[net.letter_ids(4)], rtol=1e-4, atol=1e-4)
