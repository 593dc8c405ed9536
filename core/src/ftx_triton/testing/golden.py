"""Compare a conversion with the manifest of FasterTransformer's own converter (golden files).

A manifest lists, per run, the upstream arguments, the output dtype, and the sha256 and size of
every file upstream wrote. Parity (golden README): every ``.bin`` the FT loader reads is
byte-identical; ``config.ini`` keys FT reads are equal; files the loader never reads may be absent.
"""

from __future__ import annotations

import configparser
import hashlib
import json
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftx_triton.formats.ftformat import read_ini

TP_FLAGS = ("--n-inference-gpus", "-i_g", "-infer_gpu_num", "-inference_tensor_para_size")


@dataclass(frozen=True)
class GoldenRun:
    """One upstream run: tp, output dtype, expected files."""

    case: str
    tp: int
    dtype: str
    files: dict[str, dict[str, Any]]
    config_ini: str

    @property
    def id(self) -> str:
        return f"{self.case}-{self.dtype}-tp{self.tp}"


def load_runs(case_dir: Path) -> Iterator[GoldenRun]:
    """Every run of a golden case."""
    manifest = json.loads((case_dir / "manifest.json").read_text())
    for run in manifest["runs"]:
        args = run["arguments"]
        tp = next(int(args[i + 1]) for i, a in enumerate(args) if a in TP_FLAGS)
        yield GoldenRun(case_dir.name, tp, run["output_dtype"], run["files"], run["config_ini"])


def mismatches(out_root: Path, run: GoldenRun, *, may_omit: Collection[str] = ()) -> list[str]:
    """Differences between ``out_root/<tp>-gpu`` and the run's ``.bin`` files (empty = parity)."""
    problems = []
    for rel, info in sorted(run.files.items()):
        name = rel.split("/", 1)[1]
        if not name.endswith(".bin"):
            continue
        path = out_root / rel
        if not path.is_file():
            if name not in may_omit:
                problems.append(f"missing {rel}")
            continue
        if hashlib.sha256(path.read_bytes()).hexdigest() != info["sha256"]:
            problems.append(f"differs {rel}")
    return problems


def ini_mismatches(out_root: Path, run: GoldenRun) -> list[str]:
    """Keys of upstream's ``config.ini`` whose value in ``out_root/<tp>-gpu/config.ini`` differs or is
    missing (empty = parity; upstream writes only keys FasterTransformer reads)."""
    upstream = configparser.ConfigParser(interpolation=None)
    upstream.read_string(run.config_ini)
    ours = read_ini(out_root / f"{run.tp}-gpu" / "config.ini")
    return [
        f"[{section}] {key}: ours {ours.get(section, {}).get(key)!r}, upstream {value!r}"
        for section in upstream.sections()
        for key, value in upstream[section].items()
        if ours.get(section, {}).get(key) != value
    ]
