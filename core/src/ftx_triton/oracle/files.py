"""A converted directory read the way FasterTransformer's C++ loaders read it.

The oracle must not share a plugin's tensor table, so nothing here knows a Hugging Face name: a
model type's module asks for FT file stems with the shapes FT's loaders allocate, and gets one
array per file (``<stem>.bin``) or one per tensor-parallel rank (``<stem>.<rank>.bin``), exactly
what rank ``r`` of a ``tp``-GPU deployment would load. The file dtype comes from
``weight_data_type`` of the model's config.ini section, matched by substring as FT's
``getModelFileType`` does (``fp32`` if absent or unknown). Values are widened to float32.

Unlike FasterTransformer, which logs a warning and runs on uninitialised memory when a file is
missing or of the wrong size, a missing or mis-sized file is an error here: the point is to
catch such a directory before a GPU does.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

from ftx_triton.errors import CheckpointError, ConfigError
from ftx_triton.formats.ftformat import read_ini
from ftx_triton.io.regular import open_regular

_FILE_DTYPES = (("fp32", np.dtype(np.float32)), ("fp16", np.dtype(np.float16)), ("bf16", np.dtype(ml_dtypes.bfloat16)))
_GPU_DIR = re.compile(r"(\d+)-gpu\Z")
_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


@dataclass(frozen=True)
class IniSection:
    """One config.ini section with FT's INIReader getters (a missing key without default is an error)."""

    path: Path
    name: str
    values: Mapping[str, str]

    def text(self, key: str, default: str | None = None) -> str:
        value = self.values.get(key.lower())
        if value is None:
            if default is None:
                raise ConfigError(
                    f"{self.path}: [{self.name}] has no {key!r}, which FasterTransformer reads",
                    hint="re-convert the checkpoint with ftx convert",
                )
            return default
        return value.strip()

    def integer(self, key: str, default: int | None = None) -> int:
        text = self.text(key, None if default is None else str(default))
        try:
            return int(text, 0)
        except ValueError:
            raise ConfigError(
                f"{self.path}: [{self.name}] {key} = {text!r} is not an integer",
                hint="re-convert the checkpoint with ftx convert",
            ) from None

    def size(self, key: str) -> int:
        """A size (heads, widths, layers, vocabulary): an integer of at least 1."""
        value = self.integer(key)
        if value < 1:
            raise ConfigError(
                f"{self.path}: [{self.name}] {key} = {value}; a size must be at least 1",
                hint="re-convert the checkpoint with ftx convert",
            )
        return value

    def number(self, key: str, default: float | None = None) -> float:
        text = self.text(key, None if default is None else repr(default))
        try:
            return float(text)
        except ValueError:
            raise ConfigError(
                f"{self.path}: [{self.name}] {key} = {text!r} is not a number",
                hint="re-convert the checkpoint with ftx convert",
            ) from None

    def flag(self, key: str, default: bool) -> bool:
        text = self.text(key, "").lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        return default  # INIReader.GetBoolean: anything else is the default

    def file_dtype(self) -> np.dtype:
        """``getModelFileType``: the first of fp32, fp16, bf16 found in ``weight_data_type``; fp32 otherwise."""
        text = self.text("weight_data_type", "")
        for needle, dtype in _FILE_DTYPES:
            if needle in text:
                return dtype
        return _FILE_DTYPES[0][1]


class FtFiles:
    """The ``.bin`` files and config.ini of one ``<tp>-gpu`` directory."""

    def __init__(self, path: Path, tp: int | None = None) -> None:
        self.path = Path(path)
        if not os.path.lexists(self.path / "config.ini"):  # a device or pipe there is refused by read_ini
            raise CheckpointError(
                f"{self.path} has no config.ini: it is not a converted FasterTransformer directory",
                hint="point at the <tp>-gpu directory ftx convert wrote",
            )
        self.ini = read_ini(self.path / "config.ini")
        self.tp = tp if tp is not None else tp_of(self.path)

    def section(self, name: str) -> IniSection:
        if name not in self.ini:
            raise ConfigError(
                f"{self.path / 'config.ini'} has no [{name}] section", hint="re-convert the checkpoint with ftx convert"
            )
        return IniSection(self.path / "config.ini", name, self.ini[name])

    def optional_section(self, name: str) -> IniSection:
        """A section FT reads with defaults for every key (empty when config.ini lacks it)."""
        return IniSection(self.path / "config.ini", name, self.ini.get(name, {}))

    def exists(self, stem: str) -> bool:
        return (self.path / f"{stem}.bin").is_file()

    def whole(self, stem: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """``<stem>.bin``, read by every rank."""
        return self._read(self.path / f"{stem}.bin", shape, dtype)

    def ranks(self, stem: str, shape: tuple[int, ...], dtype: np.dtype) -> list[np.ndarray]:
        """``<stem>.<r>.bin`` for each rank ``r``, each of the per-rank ``shape`` FT allocates."""
        return [self._read(self.path / f"{stem}.{rank}.bin", shape, dtype) for rank in range(self.tp)]

    def _read(self, file: Path, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        count = int(np.prod(shape, dtype=np.int64))
        want = count * dtype.itemsize
        try:
            handle = open_regular(file)
        except OSError:
            raise CheckpointError(
                f"{file} is missing; FasterTransformer would run on uninitialised memory there",
                hint="the conversion did not write a file FasterTransformer loads: fix the "
                "family's table, or re-convert",
            ) from None
        with handle:
            size = os.fstat(handle.fileno()).st_size
            if size != want:
                raise CheckpointError(
                    f"{file} holds {size} bytes; FasterTransformer loads {want} ({list(shape)} in {dtype})",
                    hint="the file's shape or dtype is not what FasterTransformer reads: fix the family's table, "
                    "or re-convert",
                )
            data = np.frombuffer(handle.read(want), dtype=dtype)
        if data.size != count:
            raise CheckpointError(f"{file} changed while it was read", hint="re-convert, and verify again")
        return data.reshape(shape).astype(np.float32)


def tp_of(path: Path) -> int:
    """The tensor-parallel size a ``<tp>-gpu`` directory is named for."""
    match = _GPU_DIR.match(Path(path).name)
    if not match or int(match.group(1)) < 1:
        raise ConfigError(
            f"{path} is not named <tp>-gpu, so its tensor-parallel size is unknown",
            hint="point at the <tp>-gpu directory ftx convert wrote",
        )
    return int(match.group(1))


def split(total: int, tp: int, what: str) -> int:
    """``total / tp``, refusing what FT would truncate."""
    if total % tp:
        raise ConfigError(
            f"{what} = {total} is not divisible by tensor_para_size {tp}",
            hint="FasterTransformer needs it divisible; choose another --tp",
        )
    return total // tp


def rotary_of(ini: IniSection, head_size: int) -> int:
    """``rotary_embedding``: an even number of dims within the head."""
    rotary = ini.integer("rotary_embedding")
    if not 0 <= rotary <= head_size or rotary % 2:
        raise ConfigError(
            f"{ini.path}: [{ini.name}] rotary_embedding = {rotary} is not an even number within the "
            f"head size {head_size}",
            hint="re-convert the checkpoint with ftx convert",
        )
    return rotary
