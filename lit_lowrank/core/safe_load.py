"""Load a weights file a user was given without running code from it (issue #29).

``torch.load(weights_only=False)`` unpickles arbitrary objects, so a shared checkpoint or drafter file could
execute code on load. :func:`load_weights_file` reads ``.safetensors`` with safetensors and everything else with
``torch.load(weights_only=True)`` (a Lightning checkpoint is plain data: tensors, dicts, lists, numbers and
strings, so it needs no extra safe globals), and turns PyTorch's refusal into a clear error naming the parameter
and the fix.

.. code-block:: python

    state = load_weights_file(weights_path, param="weights_path")
    state = state.get("state_dict", state)
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch


class UnsafeFileError(ValueError):
    """A weights file holds objects that loading would have to execute (refused)."""


class CorruptFileError(ValueError):
    """A checkpoint or weights file is not readable as one (truncated, empty, or another format)."""


#: What a ``torch.save`` file starts with: a zip archive (PyTorch >= 1.6) or a legacy pickle.
_ZIP_MAGIC, _PICKLE_MAGIC = b"PK\x03\x04", b"\x80"


def check_checkpoint_file(path: str | Path, *, param: str) -> Path:
    """Raise a clear error naming ``param`` and ``path`` unless ``path`` is a complete ``torch.save`` file.

    A missing path, a folder, an empty or truncated file (a copy cut short: its zip directory is missing) and a
    file of another format each get their own message, instead of ``OSError: [Errno 22] Invalid argument`` or
    ``PytorchStreamReader failed reading zip archive`` from deep inside ``torch.load``. Reads the zip directory
    only, not the tensors.

    .. code-block:: python

        check_checkpoint_file(ckpt_path, param="ckpt_path")
    """
    import zipfile

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"`{param}`={str(path)!r} does not exist; expected a checkpoint file.")
    if not path.is_file():
        raise CorruptFileError(f"`{param}`={str(path)!r} is a folder; expected a checkpoint file.")
    size = path.stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(4)
    if head.startswith(_PICKLE_MAGIC):
        return path  # a legacy (pre-zip) torch.save file: torch.load reports its own errors
    if head != _ZIP_MAGIC:
        what = "is empty" if size == 0 else "is not a PyTorch checkpoint (no torch.save zip archive)"
        raise CorruptFileError(f"`{param}`={str(path)!r} {what}; expected a file written by torch.save / "
                               "Trainer.save_checkpoint.")
    try:
        with zipfile.ZipFile(path) as archive:
            archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError) as err:
        raise CorruptFileError(
            f"`{param}`={str(path)!r} is truncated or damaged ({size} bytes; its zip directory cannot be read: "
            f"{err}); copy it again or use another checkpoint."
        ) from err
    return path


def load_weights_file(path: str | Path, *, param: str, map_location: Any = "cpu", mmap: bool = False) -> Any:
    """The tensors (and plain containers) stored in ``path``, never executing code from it.

    Args:
        path: a ``.safetensors`` file, or a ``torch.save`` / Lightning checkpoint of tensors and plain data.
        param: the user-facing parameter name, for the error messages.
        map_location: as in ``torch.load``.
        mmap: map the file instead of reading it (``torch.load(mmap=True)``): a cheap check of a large checkpoint.

    Raises:
        FileNotFoundError: ``path`` is not a file.
        CorruptFileError: ``path`` is empty, truncated or of another format (:func:`check_checkpoint_file`).
        UnsafeFileError: the file holds other objects (pickled classes or functions): it is not unpickled.
    """
    path = Path(path)
    if path.is_dir():
        raise CorruptFileError(f"`{param}`={str(path)!r} is a folder; expected a weights or checkpoint file.")
    if not path.is_file():
        raise FileNotFoundError(f"`{param}`={str(path)!r} does not exist; expected a weights or checkpoint file.")
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(path), device=map_location if isinstance(map_location, str) else "cpu")
        except SafetensorError as err:
            raise CorruptFileError(f"`{param}`={str(path)!r} is not a readable safetensors file ({err}).") from err
    check_checkpoint_file(path, param=param)
    try:
        import zipfile

        # mmap needs the zip format; a legacy torch.save file is read whole
        return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap and zipfile.is_zipfile(path))
    except pickle.UnpicklingError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UnsafeFileError(
            f"`{param}`={str(path)!r} holds objects other than tensors and plain containers, so it is not unpickled "
            f"(that could run code from the file; PyTorch: {first}). Save the weights as a state_dict "
            "(`torch.save(model.state_dict(), path)`) or as safetensors, or, if you trust the file, load it "
            "yourself and save its state_dict."
        ) from err


#: Globals a pickle of numpy arrays and plain containers needs (CIFAR's python-format batches); nothing callable
#: beyond array reconstruction.
NUMPY_PICKLE_GLOBALS: frozenset[tuple[str, str]] = frozenset({
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
})


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, handle: Any, allowed: frozenset[tuple[str, str]], where: str, **kwargs: Any) -> None:
        super().__init__(handle, **kwargs)
        self.allowed, self.where = allowed, where

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self.allowed:
            raise UnsafeFileError(
                f"{self.where} asks to load {module}.{name}, which is not plain data (numpy arrays, lists, dicts): "
                "refused, since unpickling it could run code from the file."
            )
        return super().find_class(module, name)


def load_data_pickle(handle: Any, *, where: str, allowed: frozenset[tuple[str, str]] = NUMPY_PICKLE_GLOBALS,
                     **kwargs: Any) -> Any:
    """``pickle.load`` that only builds numpy arrays and plain containers (``allowed`` globals); raises
    :class:`UnsafeFileError` naming ``where`` for anything else.

    .. code-block:: python

        with open(path, "rb") as handle:
            entry = load_data_pickle(handle, where=f"CIFAR batch {path}", encoding="latin1")
    """
    return _RestrictedUnpickler(handle, allowed, where, **kwargs).load()
