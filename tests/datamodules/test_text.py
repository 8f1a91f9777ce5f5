"""Text datamodules: byte tokenizer, packing ops, packed LM windows, tweet classification."""

from __future__ import annotations

import pytest
import torch

from lit_lowrank.datamodules.text import (
    IGNORE_INDEX,
    PackedTextDataModule,
    TextClassificationDataModule,
    _read_source,
)
from lit_lowrank.datamodules.tokenizers import ByteTokenizer, get_tokenizer
from lit_lowrank.ops import block_causal_mask, cu_seqlens_from_doc_ids, position_ids_from_doc_ids

DOCS = [
    "The first document.",
    "Second one, a bit longer: héllo wörld!",
    "third",
    "Fourth document here\nwith two lines.",
    "fifth and last document of this tiny corpus",
    "sixth",
]


# ---------------------------------------------------------------- tokenizer

def test_byte_tokenizer_roundtrip_and_specials():
    tok = ByteTokenizer()
    ids = tok.encode("héllo")
    assert ids == list("héllo".encode("utf-8")) and max(ids) < 256
    assert (tok.pad_token_id, tok.eos_token_id, tok.vocab_size, len(tok)) == (256, 257, 258, 258)
    assert tok.decode(ids + [tok.eos_token_id, tok.pad_token_id]) == "héllo"
    assert tok(["ab", "c"])["input_ids"] == [[97, 98], [99]]


def test_get_tokenizer_names_and_missing_path(tmp_path):
    assert isinstance(get_tokenizer("byte"), ByteTokenizer)
    with pytest.raises(FileNotFoundError, match=r"tokenizer.*does-not-exist"):
        get_tokenizer(str(tmp_path / "does-not-exist"))


# ---------------------------------------------------------------- packing ops

def test_cu_seqlens_and_positions():
    doc_ids = torch.tensor([3, 3, 3, 7, 9, 9, -1, -1])
    assert cu_seqlens_from_doc_ids(doc_ids).tolist() == [0, 3, 4, 6, 8]
    assert cu_seqlens_from_doc_ids(doc_ids).dtype == torch.int32
    assert position_ids_from_doc_ids(doc_ids).tolist() == [0, 1, 2, 0, 0, 1, 0, 1]
    batch = torch.stack([doc_ids, torch.zeros(8, dtype=torch.long)])
    assert position_ids_from_doc_ids(batch)[1].tolist() == list(range(8))


def test_block_causal_mask_matches_loop_reference():
    doc_ids = torch.tensor([[0, 0, 1, 1, 1, 2], [5, 5, 5, 5, 6, 6]])
    mask = block_causal_mask(doc_ids)
    assert mask.shape == (2, 1, 6, 6) and mask.dtype == torch.bool
    reference = torch.zeros(2, 1, 6, 6, dtype=torch.bool)
    for b in range(2):
        for q in range(6):
            for k in range(6):
                reference[b, 0, q, k] = bool(doc_ids[b, q] == doc_ids[b, k] and k <= q)
    assert torch.equal(mask, reference)
    with pytest.raises(ValueError, match="doc_ids"):
        block_causal_mask(doc_ids[0])


# ---------------------------------------------------------------- packed LM

@pytest.fixture
def corpus_file(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("\n\n".join(DOCS) + "\n")
    return path


def _windows(dataset):
    return [dataset[i] for i in range(len(dataset))]


def test_packed_windows_respect_document_boundaries(corpus_file):
    dm = PackedTextDataModule(corpus=str(corpus_file), seq_len=16, batch_size=4, val_fraction=0.34)
    dm.setup()
    tok = ByteTokenizer()
    for dataset in (dm.train_set, dm.val_set):
        for w in _windows(dataset):
            ids, labels, pos, doc = w["input_ids"], w["labels"], w["position_ids"], w["doc_ids"]
            assert ids.shape == labels.shape == pos.shape == doc.shape == (16,)
            for t in range(16):
                # Labels: the next token inside the same document, else -100 (boundary/padding).
                same_next = t + 1 < 16 and doc[t] >= 0 and doc[t + 1] == doc[t]
                if same_next:
                    assert labels[t] == ids[t + 1]
                elif t < 15:
                    assert labels[t] == IGNORE_INDEX
                # Positions restart at the window start and wherever the document changes.
                expected = 0 if t == 0 or doc[t] != doc[t - 1] else pos[t - 1] + 1
                assert pos[t] == expected
            assert torch.all(ids[doc < 0] == tok.pad_token_id)
    # Windows tile the stream: their real input tokens are the stream minus at most its last token.
    doc_sets = []
    for dataset in (dm.train_set, dm.val_set):
        windows = _windows(dataset)
        inputs = torch.cat([w["input_ids"][w["doc_ids"] >= 0] for w in windows])
        docs = torch.cat([w["doc_ids"][w["doc_ids"] >= 0] for w in windows])
        assert len(inputs) >= len(dataset.tokens) - 1
        assert torch.equal(inputs, dataset.tokens[: len(inputs)]) and torch.equal(docs, dataset.doc_ids[: len(docs)])
        # Each document id holds exactly that document followed by EOS.
        for d in dataset.doc_ids.unique().tolist():
            tokens = dataset.tokens[dataset.doc_ids == d].tolist()
            assert tokens[-1] == tok.eos_token_id and tok.decode(tokens) == DOCS[d]
        doc_sets.append(set(dataset.doc_ids.unique().tolist()))
    assert doc_sets[0].isdisjoint(doc_sets[1])
    assert doc_sets[0] | doc_sets[1] == set(range(len(DOCS)))
    assert len(doc_sets[1]) == 2


def test_packed_batch_keys_dtypes_and_eos_label(corpus_file):
    dm = PackedTextDataModule(corpus=str(corpus_file), seq_len=32, batch_size=2, val_fraction=0.2)
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    assert set(batch) == {"input_ids", "labels", "position_ids", "doc_ids", "category"}
    assert all(v.dtype == torch.long for v in batch.values())
    assert batch["input_ids"].shape == (2, 32) and batch["category"].shape == (2,)
    # The last real token of a document predicts EOS (EOS belongs to its document).
    labels, doc = batch["labels"], batch["doc_ids"]
    eos_targets = labels == ByteTokenizer.eos_token_id
    assert eos_targets.any()
    assert torch.all(doc[eos_targets] >= 0)
    assert (dm.vocab_size, dm.num_categories, dm.category_names) == (258, 1, [str(corpus_file)])


def test_packed_without_validation_documents(corpus_file):
    dm = PackedTextDataModule(corpus=str(corpus_file), seq_len=8, val_fraction=0.0)
    dm.setup()
    assert len(dm.val_set) == 0 and len(dm.val_dataloader()) == 0
    assert dm.train_set.doc_ids.unique().tolist() == list(range(len(DOCS)))


def test_packed_directory_corpus_one_document_per_file(tmp_path):
    for i, text in enumerate(DOCS[:3]):
        (tmp_path / f"{i}.txt").write_text(text + "\n\nsame document")
    dm = PackedTextDataModule(corpus=str(tmp_path), seq_len=8, val_fraction=0.3)
    dm.setup()
    ids = torch.cat([dm.train_set.doc_ids, dm.val_set.doc_ids]).unique()
    assert ids.tolist() == [0, 1, 2]


def test_packed_embedded_two_sources_tag_category():
    dm = PackedTextDataModule(corpus="lee+text8", seq_len=64, max_documents=40, seed=1)
    assert dm.category_names == ["lee", "text8"] and dm.num_categories == 2
    dm.setup()
    cats = torch.stack([w["category"] for w in _windows(dm.train_set)])
    assert set(cats.tolist()) == {0, 1}
    # The category of a window is the source of its first token.
    for k in (0, len(dm.train_set) // 2, len(dm.train_set) - 1):
        assert dm.train_set[k]["category"] == dm.train_set.sources[k * 64]
    # Document ids are corpus indices: Lee's documents come first, then text8's.
    num_lee = len(_read_source("lee"))
    for window in _windows(dm.train_set):
        assert window["category"] == int(window["doc_ids"][0] >= num_lee)


def test_packed_embedded_lee_default_is_seeded():
    batches = []
    for _ in range(2):
        dm = PackedTextDataModule(seed=5)
        dm.setup()
        batches.append(next(iter(dm.train_dataloader())))
    assert all(torch.equal(batches[0][k], batches[1][k]) for k in batches[0])
    assert len(dm.train_set) > 2000  # 300 documents, ~330k bytes


def test_packed_missing_corpus_names_parameter(tmp_path):
    dm = PackedTextDataModule(corpus=str(tmp_path / "missing.txt"))
    with pytest.raises(FileNotFoundError, match=r"corpus.*missing\.txt"):
        dm.setup()


# ---------------------------------------------------------------- classification

def test_tweets_batches_masks_and_labels():
    dm = TextClassificationDataModule(max_samples=3000, max_length=48, batch_size=32)
    assert dm.class_names == ["negative", "neutral", "positive"] and dm.num_classes == 3
    assert (dm.vocab_size, dm.pad_token_id) == (258, 256)
    dm.setup()
    assert len(dm.train_set) + len(dm.val_set) + len(dm.test_set) == 3000
    batch = next(iter(dm.train_dataloader()))
    assert set(batch) == {"x", "attention_mask", "y"}
    assert batch["x"].shape == (32, 48) and batch["x"].dtype == torch.long
    assert batch["attention_mask"].dtype == torch.bool and batch["y"].dtype == torch.long
    assert torch.equal(batch["x"] == dm.pad_token_id, ~batch["attention_mask"])
    # Every class appears in every split (stratified).
    for part in (dm.train_set, dm.val_set, dm.test_set):
        assert torch.bincount(part.tensors["y"], minlength=3).min() > 0


def test_local_csv_roundtrip_and_errors(tmp_path):
    rows = [("good movie", "1"), ("bad movie", "0"), ("fine", "1"), ("awful", "0"),
            ("great", "1"), ("terrible", "0"), ("nice", "1"), ("poor", "0")] * 3
    path = tmp_path / "data.csv"
    path.write_text("text,label\n" + "\n".join(f"{t},{y}" for t, y in rows) + "\n")
    dm = TextClassificationDataModule(source=str(path), max_length=6, val_fraction=0.25, test_fraction=0.25)
    assert dm.class_names == ["0", "1"]
    dm.setup()
    tok = ByteTokenizer()
    x, mask, y = (dm.train_set.tensors[k] for k in ("x", "attention_mask", "y"))
    texts = {tok.decode(row[m].tolist()) for row, m in zip(x, mask)}
    expected = {t[:6]: int(label) for t, label in rows}
    assert texts <= set(expected)
    for row, m, label in zip(x, mask, y):
        assert expected[tok.decode(row[m].tolist())] == label
    bad = tmp_path / "bad.csv"
    bad.write_text("sentence,label\nhi,1\n")
    with pytest.raises(ValueError, match="text"):
        TextClassificationDataModule(source=str(bad)).setup()
    with pytest.raises(FileNotFoundError, match="source"):
        TextClassificationDataModule(source=str(tmp_path / "none.csv")).setup()


@pytest.mark.parametrize("cls", [PackedTextDataModule, TextClassificationDataModule])
def test_signature_parses_with_jsonargparse(cls):
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_class_arguments(cls, "data")
    assert parser.parse_args([]).data.tokenizer == "byte"
