"""Inputs and outputs of the ``fastertransformer`` Triton model, per I/O kind.

Names, dtypes and dims are FasterTransformer's own (ft-format.md §6.3), so existing
FasterTransformer clients work unchanged. Dims exclude the batch dimension.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TensorDecl:
    """One input or output of a Triton model."""

    name: str
    dtype: str  # Triton type without the TYPE_ prefix: UINT32, FP32, BOOL, STRING …
    dims: tuple[int, ...]
    optional: bool = False
    reshape: tuple[int, ...] | None = None
    ragged: bool = False


def _scalar(name: str, dtype: str) -> TensorDecl:
    return TensorDecl(name, dtype, (1,), optional=True, reshape=())


SAMPLING_INPUTS = (
    _scalar("runtime_top_k", "UINT32"),
    _scalar("runtime_top_p", "FP32"),
    _scalar("beam_search_diversity_rate", "FP32"),
    _scalar("temperature", "FP32"),
    _scalar("len_penalty", "FP32"),
    _scalar("repetition_penalty", "FP32"),
    _scalar("random_seed", "UINT64"),
    _scalar("is_return_log_probs", "BOOL"),
    _scalar("beam_width", "UINT32"),
    _scalar("start_id", "UINT32"),
    _scalar("end_id", "UINT32"),
    TensorDecl("bad_words_list", "INT32", (2, -1), optional=True),
    TensorDecl("stop_words_list", "INT32", (2, -1), optional=True),
    _scalar("prompt_learning_task_name_ids", "UINT32"),
    _scalar("top_p_decay", "FP32"),
    _scalar("top_p_min", "FP32"),
    _scalar("top_p_reset_ids", "UINT32"),
)

DECODER_INPUTS = (
    TensorDecl("input_ids", "UINT32", (-1,)),
    TensorDecl("input_lengths", "UINT32", (1,), reshape=()),
    TensorDecl("request_output_len", "UINT32", (-1,)),
    *SAMPLING_INPUTS,
)
DECODER_OUTPUTS = (
    TensorDecl("output_ids", "UINT32", (-1, -1)),
    TensorDecl("sequence_length", "UINT32", (-1,)),
    TensorDecl("cum_log_probs", "FP32", (-1,)),
    TensorDecl("output_log_probs", "FP32", (-1, -1)),
)

ENCODER_DECODER_INPUTS = (
    TensorDecl("input_ids", "UINT32", (-1,)),
    TensorDecl("sequence_length", "UINT32", (1,), reshape=()),
    TensorDecl("max_output_len", "UINT32", (1,), reshape=()),
    *SAMPLING_INPUTS,
)
ENCODER_DECODER_OUTPUTS = (
    TensorDecl("output_ids", "INT32", (-1, -1)),
    TensorDecl("sequence_length", "INT32", (-1,)),
    TensorDecl("cum_log_probs", "FP32", (-1,)),
    TensorDecl("output_log_probs", "FP32", (-1, -1)),
)

IO_KINDS = {
    "decoder": (DECODER_INPUTS, DECODER_OUTPUTS),
    "encoder-decoder": (ENCODER_DECODER_INPUTS, ENCODER_DECODER_OUTPUTS),
}


# --------------------------------------------------------------------------- generate extension
# The ensemble speaks Triton's generate-extension names; preprocessing takes the same inputs and
# produces the fastertransformer model's native ones; postprocessing turns FT's outputs into text.

GENERATE_INPUTS = (
    TensorDecl("text_input", "STRING", (1,)),
    TensorDecl("max_tokens", "INT32", (1,)),
    TensorDecl("temperature", "FP32", (1,), optional=True),
    TensorDecl("top_k", "INT32", (1,), optional=True),
    TensorDecl("top_p", "FP32", (1,), optional=True),
    TensorDecl("beam_width", "INT32", (1,), optional=True),
    TensorDecl("repetition_penalty", "FP32", (1,), optional=True),
    TensorDecl("random_seed", "UINT64", (1,), optional=True),
    TensorDecl("stop", "STRING", (-1,), optional=True),
    TensorDecl("bad_words", "STRING", (-1,), optional=True),
    TensorDecl("stream", "BOOL", (1,), optional=True),
)
GENERATE_OUTPUTS = (TensorDecl("text_output", "STRING", (-1,)),)

_SAMPLING_FROM_PREPROCESSING = (
    TensorDecl("runtime_top_k", "UINT32", (1,)),
    TensorDecl("runtime_top_p", "FP32", (1,)),
    TensorDecl("temperature", "FP32", (1,)),
    TensorDecl("repetition_penalty", "FP32", (1,)),
    TensorDecl("random_seed", "UINT64", (1,)),
    TensorDecl("beam_width", "UINT32", (1,)),
    TensorDecl("bad_words_list", "INT32", (2, -1)),
    TensorDecl("stop_words_list", "INT32", (2, -1)),
)
PREPROCESSING_OUTPUTS = {
    "decoder": (
        TensorDecl("input_ids", "UINT32", (-1,)),
        TensorDecl("input_lengths", "UINT32", (1,)),
        TensorDecl("request_output_len", "UINT32", (1,)),
        *_SAMPLING_FROM_PREPROCESSING,
    ),
    "encoder-decoder": (
        TensorDecl("input_ids", "UINT32", (-1,)),
        TensorDecl("sequence_length", "UINT32", (1,)),
        TensorDecl("max_output_len", "UINT32", (1,)),
        *_SAMPLING_FROM_PREPROCESSING,
    ),
}
"""Every preprocessing output feeds the fastertransformer input of the same name."""


def postprocessing_inputs(io_kind: str) -> tuple[TensorDecl, ...]:
    """FT's ``output_ids``/``sequence_length`` (dtypes per I/O kind) and the optional prompt lengths."""
    outputs = {d.name: d for d in IO_KINDS[io_kind][1]}
    return (
        outputs["output_ids"],
        outputs["sequence_length"],
        TensorDecl("input_lengths", "UINT32", (1,), optional=True),
    )
