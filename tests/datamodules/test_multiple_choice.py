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


TINY_LLAMA = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
              "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 258}


def _options_dm(**kwargs):
    dm = MultipleChoiceDataModule(source="embedded", tokenizer="byte", scoring="options", max_length=80,
                                  batch_size=4, **kwargs)
    dm.setup("fit")
    return dm


def test_options_scoring_batches_hold_each_option_as_the_answer_text():
    from lit_lowrank.datamodules.multiple_choice import format_cloze

    dm = _options_dm()
    item = dm.val_set[0]
    x = item["x"]
    assert x.shape == (4, 81) and x.dtype == torch.long
    source = EMBEDDED_ITEMS[dm.val_indices[0]]
    assert item["y"] == source["label"]
    context, answers = format_cloze(source)
    for c in range(4):
        k, ids = int(x[c, 0]), x[c, 1:][x[c, 1:] >= 0].tolist()
        assert bytes(ids[-k:]).decode() == answers[c] == f" {source['choices'][c]}"  # the byte tokenizer: ids = bytes
        assert bytes(ids[:-k]).decode() == context
    with pytest.raises(ValueError, match="scoring"):
        MultipleChoiceDataModule(scoring="cloze")
    with pytest.raises(ValueError, match="max_length"):  # an answer alone longer than the window
        MultipleChoiceDataModule(source="embedded", tokenizer="byte", scoring="options", max_length=8).setup("fit")


def test_encode_cloze_cuts_the_context_off_the_whole_encoding():
    from lit_lowrank.datamodules.multiple_choice import encode_cloze
    from lit_lowrank.datamodules.tokenizers import get_tokenizer

    tok = get_tokenizer("byte")
    [(ids, k)] = encode_cloze(tok, "Answer:", [" red"])
    assert k == 4 and bytes(ids).decode() == "Answer: red"
    with pytest.raises(ValueError, match="adds no token"):
        encode_cloze(tok, "Answer:", [""])


def test_folds_hold_out_every_item_exactly_once():
    held = []
    for fold in range(4):
        dm = _options_dm(num_folds=4, fold=fold, seed=3)
        assert len(dm.train_set) + len(dm.val_set) == len(EMBEDDED_ITEMS)
        held += dm.val_indices
    assert sorted(held) == list(range(len(EMBEDDED_ITEMS)))
    for bad in ({"num_folds": 1}, {"num_folds": 4, "fold": 4}):
        with pytest.raises(ValueError, match="num_folds"):
            MultipleChoiceDataModule(**bad)
    with pytest.raises(ValueError, match="val_source"):
        MultipleChoiceDataModule(num_folds=4, val_source="x.jsonl")
    # the val_fraction split is unchanged by the fold option (earlier runs' splits stay reproducible)
    dm = MultipleChoiceDataModule(source="embedded", tokenizer="byte", seed=1)
    dm.setup("fit")
    assert len(dm.val_indices) == round(len(EMBEDDED_ITEMS) * 0.25)


def test_option_scores_are_the_mean_answer_log_probabilities_and_the_head_starts_at_identity():
    from lit_lowrank.models.mc_lm import MultipleChoiceLM

    dm = _options_dm()
    batch = next(iter(dm.val_dataloader()))
    torch.manual_seed(0)
    net = MultipleChoiceLM(None, tokenizer="byte", model_config=TINY_LLAMA, scoring="options").eval()
    assert net.num_features == 4
    head = net.make_head(4)
    with torch.no_grad():
        scores = net.option_scores(batch["x"])
        features = net(batch["x"])  # centred over the options: the same softmax, no item-wide offset
        torch.testing.assert_close(features, scores - scores.mean(-1, keepdim=True))
        torch.testing.assert_close(features.sum(-1), torch.zeros(len(features)), atol=1e-5, rtol=0)
        torch.testing.assert_close(head(features).softmax(-1), scores.softmax(-1))
        for b in range(batch["x"].shape[0]):
            for c in range(4):  # reference: the full LM on the unpadded sequence, log-softmax, last k tokens
                k = int(batch["x"][b, c, 0])
                ids = batch["x"][b, c, 1:][batch["x"][b, c, 1:] >= 0]
                logp = net.lm(input_ids=ids[None]).logits[0].log_softmax(-1)
                ref = logp[:-1].gather(1, ids[1:, None])[-k:].mean()
                torch.testing.assert_close(scores[b, c], ref, rtol=1e-4, atol=1e-4)
    net.train()
    net(batch["x"])[:, 0].sum().backward()  # differentiable in the LM's weights (adapters train through it)
    assert net.lm.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="num_classes"):
        net.make_head(3)
    with pytest.raises(ValueError, match="cloze items"):
        net(batch["x"][:, 0, 1:])
    with pytest.raises(ValueError, match="scoring"):
        MultipleChoiceLM(None, model_config=TINY_LLAMA, scoring="cloze")


def test_polar_vbll_fits_on_option_scores_end_to_end():
    import lightning.pytorch as pl

    from lit_lowrank.adapters.polar_vbll import PoLARVBLL, find_vbll_head
    from lit_lowrank.models.mc_lm import MultipleChoiceLM
    from lit_lowrank.tasks import ClassificationModule

    pl.seed_everything(0, verbose=False)
    dm = _options_dm(num_folds=4)
    model = ClassificationModule(MultipleChoiceLM(None, tokenizer="byte", model_config=TINY_LLAMA,
                                                  scoring="options"), num_classes=4)
    method = PoLARVBLL(target_modules=r"(q_proj|v_proj)$", rank=2, alpha=2, phases=[], warmup_steps=1,
                       head_kwargs={"predictive": "probit"})
    pl.Trainer(max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False, limit_val_batches=1, num_sanity_val_steps=0,
               callbacks=[method]).fit(model, datamodule=dm)
    head = find_vbll_head(model)
    assert head is not None and head.layer.W_mean.shape[-1] == 5  # 4 option scores + the bias feature
    with torch.no_grad():
        probs = model.eval()(next(iter(dm.val_dataloader()))["x"]).softmax(-1)
    torch.testing.assert_close(probs.sum(-1), torch.ones(len(probs)))
