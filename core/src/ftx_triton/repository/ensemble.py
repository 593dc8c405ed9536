"""The ensembles: preprocessing → fastertransformer → postprocessing, two interfaces.

``ensemble`` is fastertransformer_backend's own ensemble (``INPUT_0``..``INPUT_3`` and FT's sampling
inputs → ``OUTPUT_0``, ``sequence_length``, log probabilities), by that project's model and tensor
names, so its clients work unchanged. ``text`` speaks Triton's generate-extension names
(``text_input``, ``max_tokens`` … → ``text_output``), so ``POST /v2/models/text/generate`` works;
ftx's own commands and the OpenAI front use it. Both share the preprocessing and postprocessing
models, whose tensors carry fastertransformer_backend's names too.

One ensemble cannot serve both: the generate extension answers every output of the model (a
generate reply would carry FT's tensors too), and a streamed ensemble sends each step's outputs as
their steps produce them, so generate_stream would get replies without ``text_output``.

Triton refuses an ensemble step that reads outputs of a decoupled (streaming) model together with
outputs of another model, so with streaming the postprocessing step gets FT's outputs only: the
prompt length then travels as the FT model's stream offset, when it has one.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from ftx_triton.errors import ConfigError
from ftx_triton.repository.io import (
    FT_LOG_PROBS,
    FT_PASS_THROUGH,
    FT_TEXT_INPUTS,
    FT_TEXT_OUTPUT,
    FT_TEXT_TO_PREPROCESSING,
    GENERATE_INPUTS,
    GENERATE_OUTPUTS,
    PROMPT_LENGTHS,
    PROMPT_TO_FT,
    RESPONSE_INPUT_LENGTHS,
    SAMPLING_FROM_PREPROCESSING,
    STREAM_OFFSET,
    TEXT_MODEL_NAME,
    TOKENS_BATCH,
    ft_ensemble_outputs,
)
from ftx_triton.repository.model_config import FT_MODEL_NAME, add_inputs_outputs, parse_config

ENSEMBLE_NAME = "ensemble"
PREPROCESSING = "preprocessing"
POSTPROCESSING = "postprocessing"


def _internal(name: str) -> str:
    return f"_{name}"


def _prompt_steps(config: mc.ModelConfig, io_kind: str, ft_model: str) -> tuple[mc.ModelEnsembling.Step, ...]:
    """The three steps with preprocessing's prompt outputs wired into the fastertransformer model."""
    if io_kind not in PROMPT_TO_FT:
        raise ConfigError(f"unknown I/O kind {io_kind!r}")
    steps = config.ensemble_scheduling.step
    pre = steps.add(model_name=PREPROCESSING, model_version=-1)
    ft = steps.add(model_name=ft_model, model_version=-1)
    post = steps.add(model_name=POSTPROCESSING, model_version=-1)
    for name, ft_name in PROMPT_TO_FT[io_kind].items():
        pre.output_map[name] = _internal(name)
        ft.input_map[ft_name] = _internal(name)
    ft.output_map["output_ids"] = _internal(TOKENS_BATCH)
    post.input_map[TOKENS_BATCH] = _internal(TOKENS_BATCH)
    return pre, ft, post


def build_text_ensemble_config(
    io_kind: str,
    *,
    max_batch_size: int,
    streaming: bool,
    ft_model: str = FT_MODEL_NAME,
    ft_outputs: Collection[str] = (),
) -> mc.ModelConfig:
    """The generate ensemble's config (``text``): generate-extension I/O over the three steps.

    ``ft_outputs`` are the outputs the fastertransformer model declares; when it has a stream
    offset, postprocessing reads it and streams each piece of text once.
    """
    config = mc.ModelConfig(name=TEXT_MODEL_NAME, platform="ensemble", max_batch_size=max_batch_size)
    add_inputs_outputs(config, GENERATE_INPUTS, GENERATE_OUTPUTS)
    pre, ft, post = _prompt_steps(config, io_kind, ft_model)
    for decl in GENERATE_INPUTS:
        pre.input_map[decl.name] = decl.name
    for decl in SAMPLING_FROM_PREPROCESSING:
        pre.output_map[decl.name] = _internal(decl.name)
        ft.input_map[decl.name] = _internal(decl.name)
    ft.output_map["sequence_length"] = "_generated_length"
    post.input_map["sequence_length"] = "_generated_length"
    ft.output_map[FT_LOG_PROBS] = _internal(FT_LOG_PROBS)
    post.input_map[FT_LOG_PROBS] = _internal(FT_LOG_PROBS)
    if STREAM_OFFSET in ft_outputs:
        ft.output_map[STREAM_OFFSET] = _internal(STREAM_OFFSET)
        post.input_map[STREAM_OFFSET] = _internal(STREAM_OFFSET)
        if io_kind == "decoder":  # where the generated tokens (and their log probabilities) start
            ft.output_map["response_input_lengths"] = _internal(RESPONSE_INPUT_LENGTHS)
            post.input_map[RESPONSE_INPUT_LENGTHS] = _internal(RESPONSE_INPUT_LENGTHS)
    elif io_kind == "decoder" and not streaming:
        post.input_map[PROMPT_LENGTHS] = _internal(PROMPT_LENGTHS)
    for decl in GENERATE_OUTPUTS:
        post.output_map[decl.name] = decl.name
    return config


def build_ensemble_config(
    io_kind: str, *, max_batch_size: int, ft_model: str = FT_MODEL_NAME, output_dtypes: Mapping[str, str] | None = None
) -> mc.ModelConfig:
    """fastertransformer_backend's ensemble (``ensemble``) over the same three steps.

    Preprocessing turns the prompts, output lengths and word lists into FT tensors; every sampling
    input goes to the fastertransformer model unchanged; ``OUTPUT_0`` is the whole sequence (prompt
    plus generation for decoder models) as upstream's postprocessing gives it, the rest are FT's
    own outputs.
    """
    outputs = ft_ensemble_outputs(io_kind, output_dtypes)
    config = mc.ModelConfig(name=ENSEMBLE_NAME, platform="ensemble", max_batch_size=max_batch_size)
    add_inputs_outputs(config, (*FT_TEXT_INPUTS, *FT_PASS_THROUGH), outputs)
    pre, ft, post = _prompt_steps(config, io_kind, ft_model)
    for decl in FT_TEXT_INPUTS:
        pre.input_map[FT_TEXT_TO_PREPROCESSING[decl.name]] = decl.name
    for decl in FT_PASS_THROUGH:
        ft.input_map[decl.name] = decl.name
    for decl in outputs[1:]:
        ft.output_map[decl.name] = decl.name
    post.input_map["sequence_length"] = "sequence_length"
    post.output_map["OUTPUT"] = FT_TEXT_OUTPUT
    return config


def check_ensemble(repository: Path, name: str = ENSEMBLE_NAME) -> list[str]:
    """Wiring problems of an ensemble against the configs of its steps (names, dtypes, required inputs).

    Checks what Triton would check at load time, without loading: every mapped tensor exists in
    the step model with the dtype its producer gives it; every required input is fed; every
    ensemble output is produced.
    """
    config = parse_config(repository / name / "config.pbtxt")
    problems: list[str] = []
    if not (repository / name / "1").is_dir():
        problems.append(f"{name}/1/ is missing (Triton needs the version directory even for an ensemble)")
    types: dict[str, int] = {t.name: t.data_type for t in config.input}
    producers: dict[str, str] = {t.name: "the ensemble input" for t in config.input}
    for step in config.ensemble_scheduling.step:
        path = repository / step.model_name / "config.pbtxt"
        if not path.is_file():
            problems.append(f"step model {step.model_name} has no {path}")
            continue
        model = parse_config(path)
        inputs = {t.name: t for t in model.input}
        outputs = {t.name: t for t in model.output}
        for key, tensor in step.input_map.items():
            if key not in inputs:
                problems.append(f"{step.model_name} has no input {key!r} (ensemble maps {tensor!r} to it)")
            elif tensor not in types:
                problems.append(f"{step.model_name}.{key} reads {tensor!r}, which nothing produced before it")
            elif types[tensor] != inputs[key].data_type:
                problems.append(
                    f"{step.model_name}.{key} is {mc.DataType.Name(inputs[key].data_type)} but {tensor!r} from "
                    f"{producers[tensor]} is {mc.DataType.Name(types[tensor])}"
                )
        for key, value in inputs.items():
            if not value.optional and key not in step.input_map:
                problems.append(f"required input {step.model_name}.{key} is not fed by the ensemble")
        for key, tensor in step.output_map.items():
            if key not in outputs:
                problems.append(f"{step.model_name} has no output {key!r}")
                continue
            types[tensor] = outputs[key].data_type
            producers[tensor] = f"{step.model_name}.{key}"
    for out in config.output:
        if out.name not in types:
            problems.append(f"ensemble output {out.name!r} is produced by no step")
        elif types[out.name] != out.data_type:
            problems.append(
                f"ensemble output {out.name!r} is {mc.DataType.Name(out.data_type)} but "
                f"{producers[out.name]} gives {mc.DataType.Name(types[out.name])}"
            )
    return problems
