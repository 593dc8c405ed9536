"""Lazy readers for checkpoint weights: safetensors (single or sharded) and pytorch_model.bin.

Every reader implements :class:`TensorReader`: names in storage order, shapes from headers
only, and ``read(name)`` that loads one tensor. Nothing reads the whole model at once.
"""

from __future__ import annotations

import functools
import json
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import ml_dtypes
import numpy as np

from ftx.errors import CheckpointError

SAFETENSORS_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}


READ_CHUNK = 32 << 20
"""Tensors larger than this are read by several threads in chunks of this size."""


@functools.cache
def _read_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1), thread_name_prefix="ftx-read")


class TensorReader(Protocol):
    """What the converter needs from a checkpoint."""

    def names(self) -> list[str]:
        """Tensor names in storage order (reading in this order is sequential I/O)."""

    def shape(self, name: str) -> tuple[int, ...]:
        """Shape without reading data."""

    def nbytes(self, name: str) -> int:
        """Stored size in bytes."""

    def read(self, name: str) -> np.ndarray:
        """Load one tensor (may be a read-only view of a memory map)."""

    def close(self) -> None:
        """Release files."""


class SafetensorsFile:
    """One .safetensors file, parsed from its header and memory-mapped."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._file = path.open("rb")
            size = path.stat().st_size
            (header_len,) = struct.unpack("<Q", self._file.read(8))
            if header_len > size - 8:
                raise ValueError("header length beyond end of file")
            header = json.loads(self._file.read(header_len))
        except (OSError, ValueError, struct.error) as exc:
            raise CheckpointError(
                f"{path} is not a readable safetensors file ({exc})",
                hint="the download is probably truncated or corrupt; delete it and fetch again",
            ) from exc
        header.pop("__metadata__", None)
        self._base = 8 + header_len
        self._entries: dict[str, dict[str, Any]] = header
        data_len = size - self._base
        for name, entry in header.items():
            begin, end = entry["data_offsets"]
            if end > data_len:
                raise CheckpointError(
                    f"{path} is truncated: tensor {name} needs bytes {begin}..{end} of data but the file holds {data_len}",
                    hint="the download is incomplete; delete the file and fetch again",
                )
            if entry["dtype"] not in SAFETENSORS_DTYPES:
                raise CheckpointError(f"{path}: tensor {name} has unsupported dtype {entry['dtype']}")

    def names(self) -> list[str]:
        return sorted(self._entries, key=lambda n: self._entries[n]["data_offsets"][0])

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._entries[name]["shape"])

    def nbytes(self, name: str) -> int:
        begin, end = self._entries[name]["data_offsets"]
        return int(end - begin)

    def dtype(self, name: str) -> np.dtype:
        """The stored element type (from the header: no data read)."""
        return SAFETENSORS_DTYPES[self._entries[name]["dtype"]]

    def read(self, name: str) -> np.ndarray:
        """Read one tensor into its own buffer (pread: no memory map whose pages would pile up in RSS)."""
        entry = self._entries[name]
        begin, end = entry["data_offsets"]
        dtype = SAFETENSORS_DTYPES[entry["dtype"]]
        array = np.empty((end - begin) // dtype.itemsize, dtype=dtype)
        view = memoryview(array).cast("B")
        spans = [(o, min(o + READ_CHUNK, len(view))) for o in range(0, len(view), READ_CHUNK)]
        if len(spans) > 1:  # big tensors: several preads at once (they release the GIL)
            list(_read_pool().map(lambda span: self._pread(view, *span, begin, name), spans))
        elif spans:
            self._pread(view, *spans[0], begin, name)
        return array.reshape(entry["shape"])

    def _pread(self, view: memoryview, start: int, stop: int, begin: int, name: str) -> None:
        done, fd = start, self._file.fileno()
        while done < stop:
            n = os.preadv(fd, [view[done:stop]], self._base + begin + done)
            if n == 0:
                raise CheckpointError(f"{self.path} ended while reading tensor {name}",
                                      hint="the file is truncated; fetch it again")
            done += n

    def close(self) -> None:
        self._file.close()


class ShardedReader:
    """Several files behind one name space (safetensors or .bin shards)."""

    def __init__(self, parts: list[TensorReader]) -> None:
        self._parts = parts
        self._owner: dict[str, TensorReader] = {}
        for part in parts:
            for name in part.names():
                self._owner[name] = part

    def names(self) -> list[str]:
        return [n for part in self._parts for n in part.names()]

    def shape(self, name: str) -> tuple[int, ...]:
        return self._owner[name].shape(name)

    def nbytes(self, name: str) -> int:
        return self._owner[name].nbytes(name)

    def dtype(self, name: str) -> np.dtype:
        return self._owner[name].dtype(name)

    def read(self, name: str) -> np.ndarray:
        return self._owner[name].read(name)

    def close(self) -> None:
        for part in self._parts:
            part.close()


class TorchBinFile:
    """A pytorch_model.bin loaded with ``torch.load(mmap=True, weights_only=True)`` — never plain pickle."""

    def __init__(self, path: Path) -> None:
        try:
            import torch
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise CheckpointError(
                f"{path} is a PyTorch checkpoint and torch is not installed",
                hint="pip install 'ftx[torch]', or convert from safetensors",
            ) from exc
        self.path = path
        try:
            state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        except Exception as exc:  # torch raises many types for corrupt archives
            raise CheckpointError(
                f"{path} cannot be read as a PyTorch checkpoint: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                hint="the file is truncated, corrupt, or not a weights-only state dict; fetch it again",
            ) from exc
        if not isinstance(state, dict):
            raise CheckpointError(f"{path} does not hold a state dict (found {type(state).__name__})")
        self._state = {k: v for k, v in state.items() if hasattr(v, "shape")}

    def names(self) -> list[str]:
        return list(self._state)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._state[name].shape)

    def nbytes(self, name: str) -> int:
        t = self._state[name]
        return int(t.numel() * t.element_size())

    def dtype(self, name: str) -> np.dtype:
        """The stored element type (no data read: the tensors are memory-mapped)."""
        import torch

        torch_dtype = self._state[name].dtype
        if torch_dtype == torch.bfloat16:
            return np.dtype(ml_dtypes.bfloat16)
        return torch.empty(0, dtype=torch_dtype).numpy().dtype

    def read(self, name: str) -> np.ndarray:
        import torch

        tensor = self._state[name]
        try:
            if tensor.dtype == torch.bfloat16:
                return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
            return tensor.numpy()
        except RuntimeError as exc:
            raise CheckpointError(f"{self.path}: tensor {name} cannot be read ({exc})") from exc

    def close(self) -> None:
        self._state = {}


def _index_files(path: Path, index_name: str) -> list[Path]:
    index = json.loads((path / index_name).read_text())
    files = list(dict.fromkeys(index["weight_map"].values()))
    missing = [f for f in files if not (path / f).is_file()]
    if missing:
        raise CheckpointError(
            f"{path / index_name} lists shard(s) that are missing: {', '.join(missing[:5])}",
            hint="fetch the complete checkpoint",
        )
    return [path / f for f in files]


def open_checkpoint(path: Path) -> TensorReader:
    """Open the weights in a Hugging Face checkpoint directory (safetensors preferred)."""
    if path.is_file():
        return _open_file(path)
    if (path / "model.safetensors.index.json").is_file():
        return ShardedReader([SafetensorsFile(p) for p in _index_files(path, "model.safetensors.index.json")])
    if (path / "model.safetensors").is_file():
        return SafetensorsFile(path / "model.safetensors")
    if (path / "pytorch_model.bin.index.json").is_file():
        return ShardedReader([TorchBinFile(p) for p in _index_files(path, "pytorch_model.bin.index.json")])
    if (path / "pytorch_model.bin").is_file():
        return TorchBinFile(path / "pytorch_model.bin")
    singles = sorted(path.glob("*.safetensors"))
    if singles:
        return ShardedReader([SafetensorsFile(p) for p in singles])
    raise CheckpointError(
        f"no weights found in {path}",
        hint="expected model.safetensors, model.safetensors.index.json + shards, or pytorch_model.bin",
    )


def _open_file(path: Path) -> TensorReader:
    if path.suffix == ".safetensors":
        return SafetensorsFile(path)
    if path.suffix in {".bin", ".pt", ".pth"}:
        return TorchBinFile(path)
    raise CheckpointError(f"{path}: unknown weight file type", hint="use a .safetensors or pytorch .bin file")
