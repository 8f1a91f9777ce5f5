"""Tokenizers for the text datamodules: a dependency-free byte tokenizer, SmolLM2's, or a local one."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any, Sequence

from lit_lowrank.datamodules._paths import require_path


class ByteTokenizer:
    """UTF-8 bytes as tokens: ids 0-255 are bytes, 256 is padding, 257 is end-of-sequence.

    Needs no files, so it is the offline default. ``vocab_size == len(tok) == 258``.

    Example:
        .. code-block:: python

            tok = ByteTokenizer()
            ids = tok.encode("héllo") + [tok.eos_token_id]
            tok.decode(ids)  # "héllo" (special ids are dropped)
    """

    pad_token_id = 256
    eos_token_id = 257
    vocab_size = 258

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added)."""
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``; special ids are skipped, invalid UTF-8 is replaced."""
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")

    def __call__(self, texts: Sequence[str], add_special_tokens: bool = False) -> dict[str, list[list[int]]]:
        """Batch encoding with the same call shape as a Hugging Face tokenizer."""
        return {"input_ids": [self.encode(text) for text in texts]}

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return "ByteTokenizer(vocab_size=258, pad_token_id=256, eos_token_id=257)"


def get_tokenizer(name: str) -> Any:
    """Build a tokenizer from a config string.

    Args:
        name: ``"byte"`` -> :class:`ByteTokenizer`; ``"smollm2"`` -> the SmolLM2-135M
            tokenizer shipped offline (``lit_lowrank.models.pretrained``); anything
            else is a local folder for ``transformers.AutoTokenizer.from_pretrained``.

    Raises:
        FileNotFoundError: ``name`` is neither a known name nor an existing path.

    Example:
        .. code-block:: python

            tok = get_tokenizer("byte")
            tok = get_tokenizer("/models/my-tokenizer")  # a Hugging Face tokenizer folder
    """
    if name == "byte":
        return ByteTokenizer()
    if name == "smollm2":
        from lit_lowrank.models.pretrained import load_smollm2_tokenizer

        return load_smollm2_tokenizer()
    if name == "minilm":  # the offline all-MiniLM-L6-v2 tokenizer (WordPiece, [PAD] = 0)
        from transformers import AutoTokenizer

        from lit_lowrank.models.pretrained import minilm_path

        return AutoTokenizer.from_pretrained(minilm_path(), local_files_only=True)
    path = require_path(
        name, "tokenizer", "a local Hugging Face tokenizer folder",
        "use 'byte', 'smollm2' or the path of a folder saved with save_pretrained",
    )
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(Path(path)))


def encode_batch(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text without special tokens (ByteTokenizer or Hugging Face)."""
    return list(tokenizer(list(texts), add_special_tokens=False)["input_ids"])


def eos_id(tokenizer: Any) -> int:
    """The end-of-sequence id; raises if the tokenizer has none."""
    if tokenizer.eos_token_id is None:
        raise ValueError(f"tokenizer: {tokenizer!r} has no eos_token_id, needed to separate documents")
    return int(tokenizer.eos_token_id)


def pad_id(tokenizer: Any) -> int:
    """The padding id; tokenizers without one (many causal LMs) pad with EOS.

    Padding positions are always marked by an attention mask or ``-100`` labels, so
    the id only has to be a valid embedding row.
    """
    return int(tokenizer.pad_token_id) if tokenizer.pad_token_id is not None else eos_id(tokenizer)


class TokenizedData:
    """Tokenizer attributes of a text datamodule (set ``tokenizer_name`` in ``__init__``)."""

    tokenizer_name: str

    @cached_property
    def tokenizer(self) -> Any:
        """The tokenizer object, loaded on first use."""
        return get_tokenizer(self.tokenizer_name)

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    @property
    def pad_token_id(self) -> int:
        return pad_id(self.tokenizer)

    @property
    def eos_token_id(self) -> int:
        return eos_id(self.tokenizer)
