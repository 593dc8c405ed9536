"""Lazy readers for checkpoint weights: safetensors (single or sharded) and pytorch_model.bin.

Every reader implements :class:`TensorReader`: names in storage order, shapes from headers
only, and ``read(name)`` that loads one tensor. Nothing reads the whole model at once.
"""

from __future__ import annotations

import functools
import json
import math
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from ftx_triton.errors import CheckpointError
from ftx_triton.formats.reader import TensorReader as TensorReader  # its old home
from ftx_triton.io.cores import usable_cpus
from ftx_triton.io.jsonfile import json_kind, read_json_object
from ftx_triton.io.regular import open_regular
from ftx_triton.io.source_tree import SKIPPED_DIRS

if TYPE_CHECKING:
    import numpy as np

SAFETENSORS_ITEMSIZES: dict[str, int] = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}
"""The safetensors dtypes ftx reads, by their header names, and their bytes per element (a header is checked, and
the plan reads a source's dtype, without numpy: a cached convert imports none)."""
SAFETENSORS_WEIGHT_DTYPES = {"F32": "fp32", "F16": "fp16", "BF16": "bf16"}
"""The header names that are FasterTransformer weight dtypes, and those dtypes' names."""
FLOAT_NAMES = ("F16", "F32", "F64", "BF16")
"""The safetensors dtypes of floating point, the ones a weight may be stored as."""


@functools.cache
def safetensors_dtype(name: str) -> np.dtype:
    """The numpy dtype of a safetensors header dtype name (one of :data:`SAFETENSORS_ITEMSIZES`)."""
    import ml_dtypes
    import numpy as np

    types = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "I64": np.int64,
             "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}  # fmt: skip
    return np.dtype(types[name])


@functools.cache
def _float_dtypes() -> frozenset[np.dtype]:
    return frozenset(safetensors_dtype(name) for name in FLOAT_NAMES)


READ_CHUNK = 32 << 20
"""Tensors larger than this are read by several threads in chunks of this size."""


@functools.cache
def _read_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=min(8, usable_cpus()), thread_name_prefix="ftx-read")


def tensor_dtype(reader: TensorReader, name: str) -> np.dtype | None:
    """The stored dtype from the header when the reader tells it (``dtype(name)`` is optional), else None."""
    dtype = getattr(reader, "dtype", None)
    return dtype(name) if dtype is not None else None


def stored_weight_dtype(reader: TensorReader, name: str) -> str | None:
    """The weight dtype (``fp32``, ``fp16``, ``bf16``) a tensor is stored as; None when it is none of them or the
    reader cannot tell. From ``weight_dtype_name(name)`` where the reader has it (a safetensors header: no numpy),
    else from its ``dtype(name)`` (both optional)."""
    by_name = getattr(reader, "weight_dtype_name", None)
    if by_name is not None:
        return by_name(name)
    dtype = tensor_dtype(reader, name)
    if dtype is None:
        return None
    return next(
        (weight for header, weight in SAFETENSORS_WEIGHT_DTYPES.items() if safetensors_dtype(header) == dtype), None
    )


def read_into(reader: TensorReader, name: str, buffer: np.ndarray) -> np.ndarray:
    """``reader.read_into(name, buffer)`` when the reader can read into a given buffer (``read_into`` is
    optional), else ``reader.read(name)``; the caller may reuse ``buffer`` only once it holds no view of it."""
    method = getattr(reader, "read_into", None)
    return method(name, buffer) if method is not None else reader.read(name)


def check_weight_dtype(name: str, dtype: np.dtype | None) -> None:
    """A weight must be floating point: an integer or bool dtype means a corrupt or relabelled header."""
    import numpy as np

    if dtype is not None and np.dtype(dtype) not in _float_dtypes():
        raise CheckpointError(
            f"tensor {name} is stored as {np.dtype(dtype).name}, not floating point",
            hint="a weight is F16, BF16, F32 or F64; this checkpoint's header says otherwise, so the file is "
            "corrupt or not the model's weights; fetch it again",
        )


_CORRUPT_HINT = "the file is corrupt or was not written by a safetensors library; delete it and fetch it again"


def _check_entry(path: Path, name: str, entry: object, data_len: int) -> None:
    """Refuse a header entry that is not ``{dtype, shape, data_offsets}`` describing bytes inside the file."""

    def bad(problem: str, hint: str = _CORRUPT_HINT) -> CheckpointError:
        return CheckpointError(f"{path}: tensor {name} {problem}", hint=hint)

    if not isinstance(entry, dict):
        raise bad(f"is described by {json_kind(entry)}, not an object with dtype, shape and data_offsets")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in SAFETENSORS_ITEMSIZES:
        raise bad(
            f"has unsupported dtype {dtype!r}",
            hint=f"ftx reads {', '.join(SAFETENSORS_ITEMSIZES)}; save the checkpoint in one of them",
        )
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise bad(f"has shape {shape!r}, not a list of sizes >= 0")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(o) for o in offsets):
        raise bad(f"has data_offsets {offsets!r}, not [begin, end] with 0 <= begin")
    begin, end = offsets
    if begin > end:
        raise bad(f"has data_offsets {offsets!r} that end before they begin")
    if end > data_len:
        raise CheckpointError(
            f"{path} is truncated: tensor {name} needs bytes {begin}..{end} of data but the file holds {data_len}",
            hint="the download is incomplete; delete the file and fetch it again",
        )
    expected = math.prod(shape) * SAFETENSORS_ITEMSIZES[dtype]
    if end - begin != expected:
        raise bad(f"spans {end - begin} bytes but its shape {shape} of {dtype} needs {expected}")


class _DuplicateKey(ValueError):
    """A JSON object names one key twice (the safetensors format forbids it)."""


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _DuplicateKey(f"its header names {key!r} twice")
        seen[key] = value
    return seen


def _check_no_overlap(path: Path, header: dict[str, Any]) -> None:
    """Refuse tensors whose data ranges overlap (the format forbids it: one byte would belong to two tensors)."""
    spans = sorted(
        (entry["data_offsets"][0], entry["data_offsets"][1], name)
        for name, entry in header.items()
        if entry["data_offsets"][1] > entry["data_offsets"][0]
    )
    for (_, end, first), (begin, _, second) in zip(spans, spans[1:], strict=False):
        if begin < end:
            raise CheckpointError(
                f"{path}: tensors {first} and {second} share bytes of data "
                f"({first} ends at {end}, {second} begins at {begin})",
                hint=_CORRUPT_HINT,
            )


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class SafetensorsFile:
    """One .safetensors file, parsed from its header (every entry checked) and read with pread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._file = open_regular(path)  # a named pipe would block here forever
            size = os.fstat(self._file.fileno()).st_size
            (header_len,) = struct.unpack("<Q", self._file.read(8))
            if header_len > size - 8:
                raise ValueError("header length beyond end of file")
            header = json.loads(self._file.read(header_len), object_pairs_hook=_no_duplicate_keys)
        except (OSError, ValueError, RecursionError, struct.error) as exc:
            raise CheckpointError(
                f"{path} is not a readable safetensors file ({exc})",
                hint="the download is probably truncated or corrupt; delete it and fetch it again",
            ) from exc
        self._base = 8 + header_len
        try:
            if not isinstance(header, dict):
                raise CheckpointError(
                    f"{path} is not a readable safetensors file: its header is not a JSON object", hint=_CORRUPT_HINT
                )
            header.pop("__metadata__", None)
            for name, entry in header.items():
                _check_entry(path, name, entry, size - self._base)
            _check_no_overlap(path, header)
        except CheckpointError:
            self._file.close()
            raise
        self._entries: dict[str, dict[str, Any]] = header

    def dtype(self, name: str) -> np.dtype:
        return safetensors_dtype(self._entries[name]["dtype"])

    def weight_dtype_name(self, name: str) -> str | None:
        """The weight dtype (``fp16``, ...) the header names, without numpy; None for a non-float type."""
        return SAFETENSORS_WEIGHT_DTYPES.get(self._entries[name]["dtype"])

    def names(self) -> list[str]:
        return sorted(self._entries, key=lambda n: self._entries[n]["data_offsets"][0])

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._entries[name]["shape"])

    def nbytes(self, name: str) -> int:
        begin, end = self._entries[name]["data_offsets"]
        return int(end - begin)

    def read(self, name: str) -> np.ndarray:
        """Read one tensor into its own buffer (pread: no memory map whose pages would pile up in RSS)."""
        import numpy as np

        return self.read_into(name, np.empty(self.nbytes(name), np.uint8))

    def read_into(self, name: str, buffer: np.ndarray) -> np.ndarray:
        """Read one tensor into the first bytes of the uint8 ``buffer`` (at least :meth:`nbytes` long); the
        tensor is a view of it."""
        entry = self._entries[name]
        begin, end = entry["data_offsets"]
        dtype = safetensors_dtype(entry["dtype"])
        array = buffer[: end - begin].view(dtype)
        view = buffer[: end - begin].data
        spans = [(o, min(o + READ_CHUNK, len(view))) for o in range(0, len(view), READ_CHUNK)]
        if len(spans) > 1:  # big tensors: several preads at once (they release the GIL)
            list(_read_pool().map(lambda span: self._pread(view, span[0], span[1], begin, name), spans))
        elif spans:
            start, stop = spans[0]
            self._pread(view, start, stop, begin, name)
        return array.reshape(entry["shape"])

    def _pread(self, view: memoryview, start: int, stop: int, begin: int, name: str) -> None:
        done, fd = start, self._file.fileno()
        while done < stop:
            n = os.preadv(fd, [view[done:stop]], self._base + begin + done)
            if n == 0:
                raise CheckpointError(
                    f"{self.path} ended while reading tensor {name}", hint="the file is truncated; fetch it again"
                )
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

    def dtype(self, name: str) -> np.dtype | None:
        return tensor_dtype(self._owner[name], name)

    def weight_dtype_name(self, name: str) -> str | None:
        return stored_weight_dtype(self._owner[name], name)

    def read(self, name: str) -> np.ndarray:
        return self._owner[name].read(name)

    def read_into(self, name: str, buffer: np.ndarray) -> np.ndarray:
        """:meth:`SafetensorsFile.read_into` where the shard can read into a buffer, else its own read."""
        return read_into(self._owner[name], name, buffer)

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
                hint="pip install 'ftx-triton[torch]', or convert from safetensors",
            ) from exc
        self.path = path
        try:
            open_regular(path).close()  # torch.load would block on a named pipe
        except OSError as exc:
            raise CheckpointError(f"{path} cannot be read: {exc}", hint="check the file and its permissions") from exc
        try:
            state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        except Exception as exc:  # torch raises many types for corrupt archives
            first_line = str(exc).splitlines()[0] if str(exc) else ""
            raise CheckpointError(
                f"{path} cannot be read as a PyTorch checkpoint: {type(exc).__name__}: {first_line}",
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

    def dtype(self, name: str) -> np.dtype | None:
        import ml_dtypes
        import numpy as np
        import torch

        tensor = self._state[name]
        if tensor.dtype == torch.bfloat16:
            return np.dtype(ml_dtypes.bfloat16)
        try:
            return np.dtype(str(tensor.dtype).removeprefix("torch."))
        except TypeError:
            return None

    def read(self, name: str) -> np.ndarray:
        import ml_dtypes
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
    """The shard files an index names: plain file names inside ``path``, each present."""
    index_path = path / index_name
    hint = "the index is corrupt; fetch the checkpoint again"
    index = read_json_object(index_path, hint=hint)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
        raise CheckpointError(
            f"{index_path}: 'weight_map' is not an object of tensor name -> shard file name", hint=hint
        )
    files = list(dict.fromkeys(weight_map.values()))
    for name in files:
        parts = PurePosixPath(name.replace("\\", "/")).parts
        if not parts or parts[0] == "/" or ":" in parts[0] or ".." in parts:
            where = "an absolute path" if parts and (parts[0] == "/" or ":" in parts[0]) else "outside the checkpoint"
            raise CheckpointError(
                f"{index_path} names shard {name!r}, {where}",
                hint="a shard must be a file inside the checkpoint directory; " + hint,
            )
        if skipped := SKIPPED_DIRS.intersection(parts):
            raise CheckpointError(
                f"{index_path} names shard {name!r}, inside a {min(skipped)} folder "
                "(version-control and cache folders are no part of a checkpoint)",
                hint="keep the shards in the checkpoint's own folders; " + hint,
            )
    missing = [f for f in files if not (path / f).is_file()]
    if missing:
        raise CheckpointError(
            f"{index_path} lists shard(s) that are missing: {', '.join(missing[:5])}",
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
