"""Compare the FT reference's logits with transformers' on the original checkpoint.

The prompt is a fixed spread of token ids over the vocabulary. transformers runs in float32 on
the checkpoint's weights rounded to the converted files' dtype, so both sides compute from the
same values and only the computation is compared. A pass means the largest absolute logit
difference is at most :data:`RELATIVE_TOLERANCE` of the logits' own scale: the two then differ
only by FT's own approximations (tanh GELU where a checkpoint uses the exact one, FT's fixed
layernorm epsilon), measured below 0.5% on tiny random models. A wrong layout moves the logits
by far more on any checkpoint whose attention is not uniform (which is why the conformance kit's
tiny checkpoints are drawn with larger than default weights).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ftx_triton.errors import CheckpointError, ConfigError
from ftx_triton.formats.ftformat import non_finite_files
from ftx_triton.oracle import gpt, gptj, gptneox, t5
from ftx_triton.oracle.files import FtFiles

MODEL_TYPES = ("GPT", "GPT-J", "GPT-NeoX", "T5")
"""The Triton ``model_type`` values the reference covers."""

_SECTIONS = (("gptj", "GPT-J"), ("gptneox", "GPT-NeoX"), ("gpt", "GPT"), ("encoder", "T5"))
"""The config.ini section each FT model type reads its sizes from."""
_SECTION_OF = {model_type: section for section, model_type in _SECTIONS}

RELATIVE_TOLERANCE = 1e-2
"""Largest allowed ``max |reference - transformers|`` as a share of ``max |transformers|``."""

PROMPT_LENGTH = 8


@dataclass(frozen=True)
class Verdict:
    """One converted directory checked against transformers."""

    path: Path
    model_type: str
    tp: int
    weight_dtype: str
    max_abs_diff: float
    scale: float
    tolerance: float
    non_finite: Mapping[str, int] = field(default_factory=dict)
    """``{file name: count}`` of the converted files holding NaN or Inf values (a FAIL whatever the logits)."""

    @property
    def passed(self) -> bool:
        return not self.non_finite and bool(np.isfinite(self.max_abs_diff)) and self.max_abs_diff <= self.tolerance

    def describe(self) -> str:
        word = "PASS" if self.passed else "FAIL"
        line = (
            f"{word}  {self.path}  {self.model_type} tp={self.tp} {self.weight_dtype}: max |FT reference - "
            f"transformers| = {self.max_abs_diff:.3g} (tolerance {self.tolerance:.3g}, logits up to {self.scale:.3g})"
        )
        if self.non_finite:
            shown = ", ".join(f"{name} ({count})" for name, count in list(self.non_finite.items())[:3])
            more = " …" if len(self.non_finite) > 3 else ""
            line += f"; NaN or Inf values in {len(self.non_finite)} files: {shown}{more}"
        return line


def model_type_of(files: FtFiles) -> str:
    """The FT model type whose section config.ini holds."""
    for section, model_type in _SECTIONS:
        if section in files.ini:
            return model_type
    raise ConfigError(
        f"{files.path / 'config.ini'} has none of the sections FasterTransformer's GPT, GPT-J, "
        "GPT-NeoX or T5 read ([gpt], [gptj], [gptneox], [encoder])",
        hint="the reference covers those four model types only",
    )


def prompt(vocab: int, length: int = PROMPT_LENGTH, salt: int = 0) -> list[int]:
    """A fixed spread of ids over ``[0, vocab)`` (no randomness: the same prompt every run)."""
    step = max(1, vocab // length)
    return [(3 + salt + i * step + (i * i * 7)) % vocab for i in range(length)]


def _decoder_prompt(files: FtFiles) -> list[int]:
    ini = files.section("decoder")
    start, vocab = ini.integer("decoder_start_token_id"), ini.size("vocab_size")
    if not 0 <= start < vocab:
        raise ConfigError(
            f"{ini.path}: [decoder] decoder_start_token_id = {start} is outside the vocabulary of {vocab}",
            hint="re-convert the checkpoint with ftx convert",
        )
    return [start] + prompt(vocab, PROMPT_LENGTH - 2, salt=5)


def reference_logits(
    path: Path, input_ids: Sequence[int], decoder_input_ids: Sequence[int] | None = None, *, tp: int | None = None
) -> np.ndarray:
    """What FasterTransformer computes from the converted directory ``path`` (``<tp>-gpu``)."""
    files = FtFiles(path, tp)
    model_type = model_type_of(files)
    if model_type == "T5":
        return t5.logits(
            files, input_ids, decoder_input_ids if decoder_input_ids is not None else _decoder_prompt(files)
        )
    module = {"GPT": gpt, "GPT-J": gptj, "GPT-NeoX": gptneox}[model_type]
    return module.logits(files, input_ids)


def load_transformers(checkpoint: Path, model_class: str | None, *, seq2seq: bool, weight_dtype: str = "fp32") -> Any:
    """The original checkpoint as a transformers model computing in float32 on CPU, its weights first rounded to
    ``weight_dtype`` as the converted files are (so that only the computation is compared)."""
    import torch
    import transformers

    if model_class:
        cls = getattr(transformers, model_class)
    else:
        cls = transformers.AutoModelForSeq2SeqLM if seq2seq else transformers.AutoModelForCausalLM
    rounded = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[weight_dtype]
    try:
        return cls.from_pretrained(checkpoint).to(rounded).float().eval()
    except (OSError, ValueError) as exc:
        raise CheckpointError(
            f"transformers cannot load {checkpoint} to compare against ({exc})",
            hint="verify compares with the original checkpoint in Hugging Face format "
            "(config.json + weights): give a converted directory with --checkpoint DIR "
            "naming such a checkpoint",
        ) from exc


def transformers_logits(
    model: Any, input_ids: Sequence[int], decoder_input_ids: Sequence[int] | None = None
) -> np.ndarray:
    """``[tokens, vocab]`` logits of a model from :func:`load_transformers`."""
    import torch

    with torch.no_grad():
        ids = torch.tensor([list(input_ids)])
        if decoder_input_ids is not None:
            out = model(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                decoder_input_ids=torch.tensor([list(decoder_input_ids)]),
            )
        else:
            out = model(input_ids=ids, attention_mask=torch.ones_like(ids))
    return out.logits[0].float().numpy()


def verify(path: Path, checkpoint: Path, *, model_class: str | None = None, tp: int | None = None) -> Verdict:
    """Check the converted directory ``path`` against transformers on ``checkpoint``."""
    files = FtFiles(path, tp)
    model_type = model_type_of(files)
    section = files.section(_SECTION_OF[model_type])
    weight_dtype = {"float32": "fp32", "float16": "fp16"}.get(section.file_dtype().name, "bf16")
    non_finite = non_finite_files(files.path, section.file_dtype())  # rows the prompt never reaches included
    model = load_transformers(checkpoint, model_class, seq2seq=model_type == "T5", weight_dtype=weight_dtype)
    vocab = section.size("vocab_size")
    if int(getattr(model.config, "vocab_size", vocab)) != vocab:
        raise CheckpointError(
            f"{section.path} says vocab_size = {vocab}; {checkpoint} has {model.config.vocab_size}",
            hint="this is not the checkpoint the directory was converted from, or re-convert it",
        )
    ids = prompt(vocab)
    decoder_ids = _decoder_prompt(files) if model_type == "T5" else None
    want = transformers_logits(model, ids, decoder_ids)
    got = reference_logits(path, ids, decoder_ids, tp=files.tp)
    if got.shape != want.shape:
        raise CheckpointError(
            f"{path} gives logits of shape {list(got.shape)}; transformers gives {list(want.shape)}",
            hint="this is not the checkpoint the directory was converted from, or re-convert it",
        )
    scale = float(np.abs(want).max())
    return Verdict(
        path=Path(path),
        model_type=model_type,
        tp=files.tp,
        weight_dtype=weight_dtype,
        max_abs_diff=float(np.abs(got - want).max()),
        scale=scale,
        tolerance=RELATIVE_TOLERANCE * max(scale, 1e-6),
        non_finite=non_finite,
    )
