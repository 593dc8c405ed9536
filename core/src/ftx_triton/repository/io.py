"""Inputs and outputs of the ``fastertransformer`` Triton model, per I/O kind.

Names, dtypes and dims are FasterTransformer's own, so existing
FasterTransformer clients work unchanged. Dims exclude the batch dimension.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

TEXT_MODEL_NAME = "text"
"""The generate-extension ensemble (text in, text out) that ftx's commands and OpenAI front use."""

FT_MODEL_NAME = "fastertransformer"
"""The FasterTransformer model itself (token ids in and out)."""


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
    _scalar("presence_penalty", "FP32"),
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
    TensorDecl("response_input_lengths", "INT32", (-1,)),
)
"""``response_input_lengths``: each prompt's length, which FasterTransformer's GPT models answer
(fastertransformer_backend's GPT end-to-end client reads it)."""

ENCODER_DECODER_INPUTS = (
    TensorDecl("input_ids", "UINT32", (-1,)),
    TensorDecl("sequence_length", "UINT32", (1,), reshape=()),
    TensorDecl("max_output_len", "UINT32", (1,), reshape=()),
    *SAMPLING_INPUTS,
    _scalar("ia3_tasks", "INT32"),
    _scalar("request_prompt_lengths", "UINT32"),
    TensorDecl("request_prompt_embedding", "FP16", (-1, -1), optional=True),
)
ENCODER_DECODER_OUTPUTS = (
    TensorDecl("output_ids", "INT32", (-1, -1)),
    TensorDecl("sequence_length", "INT32", (-1,)),
    TensorDecl("cum_log_probs", "FP32", (-1,)),
    TensorDecl("output_log_probs", "FP32", (-1, -1)),
)

ENCODER_DECODER = "encoder-decoder"
"""The I/O kind of an encoder-decoder model type (T5's); the other is ``decoder``."""
IO_KINDS = {
    "decoder": (DECODER_INPUTS, DECODER_OUTPUTS),
    ENCODER_DECODER: (ENCODER_DECODER_INPUTS, ENCODER_DECODER_OUTPUTS),
}


def ft_outputs(io_kind: str, dtypes: Mapping[str, str] | None = None) -> tuple[TensorDecl, ...]:
    """The fastertransformer model's outputs for ``io_kind``, with the ``dtypes`` a model type really
    returns where they differ from the kind's table (GPT-J's ``sequence_length`` is INT32)."""
    overrides = dtypes or {}
    return tuple(replace(d, dtype=overrides.get(d.name, d.dtype)) for d in IO_KINDS[io_kind][1])


# --------------------------------------------------------------------------- generate extension
# The ensemble speaks Triton's generate-extension names; preprocessing takes the same inputs and
# produces the fastertransformer model's native ones; postprocessing turns FT's outputs into text.
# Integers are INT64: Triton converts a JSON number to the declared type without a range check, so
# ``max_tokens: 4294967301`` would reach an INT32 input as 5; as INT64 it arrives whole and is refused.

GENERATE_INPUTS = (
    TensorDecl("text_input", "STRING", (1,)),
    TensorDecl("max_tokens", "INT64", (1,)),
    TensorDecl("temperature", "FP32", (1,), optional=True),
    TensorDecl("top_k", "INT64", (1,), optional=True),
    TensorDecl("top_p", "FP32", (1,), optional=True),
    TensorDecl("beam_width", "INT64", (1,), optional=True),
    TensorDecl("repetition_penalty", "FP32", (1,), optional=True),
    TensorDecl("random_seed", "UINT64", (1,), optional=True),
    TensorDecl("stop", "STRING", (-1,), optional=True),
    TensorDecl("bad_words", "STRING", (-1,), optional=True),
    TensorDecl("bad_token_ids", "INT64", (-1,), optional=True),
    TensorDecl("logprobs", "BOOL", (1,), optional=True),
    TensorDecl("stream", "BOOL", (1,), optional=True),
)
TOKEN_IDS = "output_token_ids"
TOKEN_LOG_PROBS = "output_token_log_probs"
GENERATE_OUTPUTS = (
    TensorDecl("text_output", "STRING", (-1,)),
    TensorDecl(TOKEN_IDS, "INT64", (-1,)),
    TensorDecl(TOKEN_LOG_PROBS, "FP32", (-1,)),
)
"""``text_output`` (the text, one string per beam); the generated token ids of the best beam that the
text holds (this response's new ones when streaming; -1 pads) and FasterTransformer's log probability of
each (``output_log_probs``: the generate path always asks for them)."""

STREAM_OFFSET = "ftx_stream_offset"
"""An output of the python runtime's decoupled fastertransformer model ([B, beam], UINT32): where the
tokens new in this response start in ``output_ids``. Postprocessing decodes only those, so a stream
carries each piece of text once (FasterTransformer itself resends the whole sequence every step)."""
STREAM_OFFSET_DECL = TensorDecl(STREAM_OFFSET, "UINT32", (-1,))

# --------------------------------------------------------------------------- the encoder (embeddings)

ENCODER_MODEL_NAME = "encoder"
"""An encoder-decoder deployment's encoder alone (``--embeddings``): FasterTransformer's ``T5-Encoder`` model type,
or the python runtime's stand-in, read by ``/v1/embeddings``."""
ENCODER_INPUTS = (TensorDecl("input_ids", "UINT32", (-1,)), TensorDecl("sequence_length", "UINT32", (1,), reshape=()))
ENCODER_HIDDEN = "output_hidden_state"
"""[B, S, d_model] in the compute type: the encoder's last hidden states (final layer norm applied)."""


def encoder_outputs(data_type: str) -> tuple[TensorDecl, ...]:
    """The encoder's output; FasterTransformer's backend returns it in the compute type."""
    return (TensorDecl(ENCODER_HIDDEN, ENCODER_DTYPES.get(data_type, "FP32"), (-1, -1)),)


ENCODER_DTYPES = {"fp32": "FP32", "fp16": "FP16", "bf16": "BF16"}

# --------------------------------------------------------------------------- FasterTransformer's ensemble
# fastertransformer_backend's own ensemble interface (its all_models/<family>/ensemble), served as
# ``ensemble`` so its clients work unchanged: prompt strings, output lengths and CSV word lists in,
# text plus FT's sequence_length and log probabilities out; sampling inputs go to FT untouched.

FT_TEXT_INPUTS = (
    TensorDecl("INPUT_0", "STRING", (-1,)),
    TensorDecl("INPUT_1", "UINT32", (-1,)),
    TensorDecl("INPUT_2", "STRING", (-1,), optional=True),
    TensorDecl("INPUT_3", "STRING", (-1,), optional=True),
)
FT_TEXT_TO_PREPROCESSING = {
    "INPUT_0": "QUERY",
    "INPUT_1": "REQUEST_OUTPUT_LEN",
    "INPUT_2": "BAD_WORDS_DICT",
    "INPUT_3": "STOP_WORDS_DICT",
}
"""FT ensemble input -> the preprocessing input it feeds (upstream's preprocessing names)."""
FT_PASS_THROUGH = tuple(
    TensorDecl(d.name, d.dtype, d.dims, optional=True)
    for d in SAMPLING_INPUTS
    if d.name not in ("bad_words_list", "stop_words_list")
)
"""Sampling inputs the FT ensemble hands to the fastertransformer model as they are."""
FT_TEXT_OUTPUT = "OUTPUT_0"


def ft_ensemble_outputs(io_kind: str, dtypes: Mapping[str, str] | None = None) -> tuple[TensorDecl, ...]:
    """``OUTPUT_0`` (text) and FT's ``sequence_length``, ``cum_log_probs``, ``output_log_probs``."""
    outputs = {d.name: d for d in ft_outputs(io_kind, dtypes)}
    return (
        TensorDecl(FT_TEXT_OUTPUT, "STRING", (-1, -1)),
        outputs["sequence_length"],
        outputs["cum_log_probs"],
        outputs["output_log_probs"],
    )


# --------------------------------------------------------------------------- pre/post-processing
# Both speak fastertransformer_backend's names (a client that calls them one by one, as its
# end-to-end tests do, works unchanged); the generate path's extra inputs and outputs are optional.

PREPROCESSING_INPUTS = (
    *(TensorDecl(FT_TEXT_TO_PREPROCESSING[d.name], d.dtype, d.dims, optional=True) for d in FT_TEXT_INPUTS),
    *(TensorDecl(d.name, d.dtype, d.dims, optional=True) for d in GENERATE_INPUTS),
)
"""Both interfaces' text inputs, all optional here: each ensemble declares which it requires."""

PROMPT_IDS = "INPUT_ID"
PROMPT_LENGTHS = "REQUEST_INPUT_LEN"
OUTPUT_LENGTHS = "REQUEST_OUTPUT_LEN"
BAD_WORDS_IDS = "BAD_WORDS_IDS"
STOP_WORDS_IDS = "STOP_WORDS_IDS"
PROMPT_TO_FT = {
    "decoder": {
        PROMPT_IDS: "input_ids",
        PROMPT_LENGTHS: "input_lengths",
        OUTPUT_LENGTHS: "request_output_len",
        BAD_WORDS_IDS: "bad_words_list",
        STOP_WORDS_IDS: "stop_words_list",
    },
    "encoder-decoder": {
        PROMPT_IDS: "input_ids",
        PROMPT_LENGTHS: "sequence_length",
        OUTPUT_LENGTHS: "max_output_len",
        BAD_WORDS_IDS: "bad_words_list",
        STOP_WORDS_IDS: "stop_words_list",
    },
}
"""Preprocessing's prompt outputs -> the fastertransformer inputs they feed, per I/O kind."""

PROMPT_OUTPUTS = (
    TensorDecl(PROMPT_IDS, "UINT32", (-1,)),
    TensorDecl(PROMPT_LENGTHS, "UINT32", (1,)),
    TensorDecl(BAD_WORDS_IDS, "INT32", (2, -1)),
    TensorDecl(STOP_WORDS_IDS, "INT32", (2, -1)),
    TensorDecl(OUTPUT_LENGTHS, "UINT32", (-1,)),
)
"""Preprocessing's outputs in fastertransformer_backend's names. Its ``PROMPT_LEARNING_TASK_NAME_IDS`` is
left out: ftx serves no prompt-learning tables, and no client reads it."""
SAMPLING_FROM_PREPROCESSING = (
    TensorDecl("runtime_top_k", "UINT32", (1,)),
    TensorDecl("runtime_top_p", "FP32", (1,)),
    TensorDecl("temperature", "FP32", (1,)),
    TensorDecl("repetition_penalty", "FP32", (1,)),
    TensorDecl("random_seed", "UINT64", (1,)),
    TensorDecl("beam_width", "UINT32", (1,)),
    TensorDecl("is_return_log_probs", "BOOL", (1,)),
)
"""The generate path's sampling settings as FT inputs of the same names (absent on the FT path)."""
PREPROCESSING_OUTPUTS = (*PROMPT_OUTPUTS, *SAMPLING_FROM_PREPROCESSING)

TOKENS_BATCH = "TOKENS_BATCH"
RESPONSE_INPUT_LENGTHS = "RESPONSE_INPUT_LENGTHS"
POSTPROCESSING_OUTPUTS = (TensorDecl("OUTPUT", "STRING", (-1, -1)), *GENERATE_OUTPUTS)
FT_LOG_PROBS = "output_log_probs"
"""``OUTPUT``: the whole sequence as decoded, FasterTransformer's ensemble text (its ``OUTPUT_0``);
``text_output``: the generated text (only the new piece of it per streamed response)."""


def postprocessing_inputs(io_kind: str, dtypes: Mapping[str, str] | None = None) -> tuple[TensorDecl, ...]:
    """FT's ids as ``TOKENS_BATCH`` and its optional ``sequence_length`` (dtypes per I/O kind and model
    type), the optional prompt lengths (upstream clients send FT's ``response_input_lengths`` as
    ``RESPONSE_INPUT_LENGTHS``, ftx's generate path preprocessing's ``REQUEST_INPUT_LEN``) and stream
    offsets."""
    outputs = {d.name: d for d in ft_outputs(io_kind, dtypes)}
    return (
        replace(outputs["output_ids"], name=TOKENS_BATCH),
        replace(outputs["sequence_length"], optional=True),
        TensorDecl(RESPONSE_INPUT_LENGTHS, "INT32", (-1,), optional=True),
        TensorDecl(PROMPT_LENGTHS, "UINT32", (1,), optional=True),
        TensorDecl(STREAM_OFFSET, "UINT32", (-1,), optional=True),
        TensorDecl(FT_LOG_PROBS, "FP32", (-1, -1), optional=True),
    )
