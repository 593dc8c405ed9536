"""FasterTransformer checkpoint files: raw ``.bin`` tensors and ``config.ini``.

``config.ini`` is written by one function from a family's sections and parsed back with the
same rules FasterTransformer's INI reader applies (case-insensitive keys, ``;`` comments only
after whitespace).
"""

from __future__ import annotations

import configparser
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ftx_triton.errors import CheckpointError
from ftx_triton.io.fastcopy import contiguous

IniSections = Mapping[str, Mapping[str, object]]


def format_ini_value(value: object) -> str:
    """Render a value the way FT's reader expects (bools as ``true``/``false``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        raise ValueError("config.ini values must not be None")
    return str(value)


def write_ini(path: Path, sections: IniSections) -> None:
    """Write ``config.ini`` from ``{section: {key: value}}`` in the given order."""
    lines: list[str] = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        for key, value in values.items():
            text = format_ini_value(value)
            if "\n" in text:
                raise ValueError(f"config.ini value for {section}.{key} contains a newline")
            lines.append(f"{key} = {text}")
        lines.append("")
    path.write_text("\n".join(lines) + "\n")


def read_ini(path: Path) -> dict[str, dict[str, str]]:
    """Parse ``config.ini`` into ``{section: {key: value}}`` (sections and keys lower-cased)."""
    parser = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=(" ;", "\t;"), strict=False)
    try:
        with path.open() as fh:
            parser.read_file(fh)
    except (OSError, configparser.Error) as exc:
        raise CheckpointError(f"cannot read {path}: {exc}", hint="re-run the conversion") from exc
    return {s.lower(): {k.lower(): v for k, v in parser[s].items()} for s in parser.sections()}


def write_tensor(path: Path, array: np.ndarray) -> int:
    """Write raw little-endian C-order bytes; returns the byte count."""
    data = contiguous(array)
    if data.dtype.byteorder == ">":
        data = data.astype(data.dtype.newbyteorder("<"))
    with path.open("wb") as fh:
        # As bytes: ml_dtypes' bfloat16 does not export the buffer protocol.
        fh.write(data.reshape(-1).view(np.uint8).data)
    return data.nbytes


def read_tensor(path: Path, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """Read a raw FT tensor, checking its size against ``shape``."""
    expected = int(np.prod(shape)) * dtype.itemsize
    try:
        actual = path.stat().st_size
    except OSError as exc:
        raise CheckpointError(f"{path} cannot be opened", hint="re-run the conversion for this tp") from exc
    if actual != expected:
        raise CheckpointError(
            f"{path} holds {actual} bytes but shape {list(shape)} in {dtype} needs {expected}",
            hint="weight_data_type or the <tp>-gpu directory does not match these files; re-convert",
        )
    return np.fromfile(path, dtype=dtype).reshape(shape)


def gpu_dir_name(tp: int | str) -> str:
    """The directory FasterTransformer reads a checkpoint split for ``tp`` GPUs from: ``<tp>-gpu``."""
    return f"{tp}-gpu"
