"""``ftx configure`` and the configure stage: the repository, its config.pbtxt files, bad input.

Every config.pbtxt is parsed back through Triton's protobuf schema here; the models are served on
the real tritonserver in test_triton_repository.py.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from ftx_triton.errors import ConfigError
from ftx_triton.plan.settings import DEFAULT_BATCH_DELAY_US, DEFAULT_TEXT_BATCH_DELAY_US
from ftx_triton.repository.ensemble import check_ensemble
from ftx_triton.repository.model_config import (
    DEFAULT_MAX_BATCH_SIZE,
    FtModelOptions,
    build_ft_model_config,
    check_data_type,
    parameter,
    parse_config,
    refuse_data_type,
)
from ftx_triton.repository.writer import check_checkpoint, verify_repository
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

MODELS = {"fastertransformer", "preprocessing", "postprocessing", "ensemble", "text"}


def configure(ftx_cli, source: Path, out: Path, *extra: str):
    result = ftx_cli("--log-format", "json", "configure", str(source), "--output", str(out), *extra)
    assert result.exit_code == 0, result.stderr + repr(result.exception)
    assert result.stdout.strip() == str(out.resolve())
    assert not list(out.parent.glob(f".{out.name}*")), "nothing beside the output (no lock, no temp copy)"
    return result


def refused(ftx_cli, source: Path, out: Path, *extra: str):
    result = ftx_cli("configure", str(source), "--output", str(out), *extra)
    assert result.exit_code != 0, result.stdout
    assert result.exception is None, repr(result.exception)  # an FtxError or a click error, not a crash
    return result


def ft_config(repo: Path) -> mc.ModelConfig:
    return parse_config(repo / "fastertransformer" / "config.pbtxt")


def inputs(config: mc.ModelConfig) -> dict[str, mc.ModelInput]:
    return {i.name: i for i in config.input}


# --------------------------------------------------------------------------- the repository


def test_help_documents_every_option(ftx_cli) -> None:
    result = ftx_cli("configure", "--help")
    assert result.exit_code == 0
    for option in (
        "--output",
        "--family",
        "--revision",
        "--tp",
        "--pp",
        "--weight-dtype",
        "--data-type",
        "--tokenizer",
        "--max-batch-size",
        "--instances",
        "--text-instances",
        "--text-batch-delay-us",
        "--streaming",
        "--dynamic-batching",
        "--runtime",
    ):
        assert option in result.stdout, option
    from ftx_triton.cli.configure import configure as command

    for param in command.params:
        if param.param_type_name == "option":
            assert param.help, f"{param.name} has no help"


def test_custom_all_reduce_is_written_as_chosen(ftx_cli, tiny_gptj_dir: Path, tmp_path: Path) -> None:
    """--custom-all-reduce / --no-custom-all-reduce reach FasterTransformer's parameter; left out, the
    default of CUSTOM_ALL_REDUCE for the compute type and tp applies (on for fp16 at tp 2 and 4, where it was
    measured faster than NCCL; off for bf16, unmeasured)."""
    for args, expected in (
        (("--custom-all-reduce", "--data-type", "bf16"), "1"),
        (("--no-custom-all-reduce",), "0"),
        ((), "1"),
        (("--data-type", "bf16"), "0"),
        (("--tp", "4"), "1"),
        (("--tp", "4", "--data-type", "bf16"), "0"),
    ):
        out = tmp_path / f"repo{expected}{'-'.join(args)}"
        configure(ftx_cli, tiny_gptj_dir, out, "--tp", "2", *args)
        assert parameter(ft_config(out), "enable_custom_all_reduce") == expected, args


def test_gptj_repository_layout_and_ft_config(ftx_cli, ftx_home: Path, tiny_gptj_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "repo"
    configure(ftx_cli, tiny_gptj_dir, out)
    assert {p.name for p in out.iterdir() if p.is_dir()} == MODELS
    assert verify_repository(out)  # every config.pbtxt parses back, checks pass
    for name in MODELS:
        assert (out / name / "1").is_dir()
    ft = ft_config(out)
    assert (
        ft.backend == "fastertransformer"
        and ft.name == "fastertransformer"
        and ft.max_batch_size == DEFAULT_MAX_BATCH_SIZE
    )
    assert [(g.kind, g.count) for g in ft.instance_group] == [(mc.ModelInstanceGroup.Kind.KIND_CPU, 1)]
    assert parameter(ft, "model_type") == "GPT-J"
    assert parameter(ft, "tensor_para_size") == "1" and parameter(ft, "pipeline_para_size") == "1"
    assert parameter(ft, "data_type") == "fp16"  # the fastertransformer runtime computes in fp16 by default
    assert parameter(ft, "enable_custom_all_reduce") == "0"
    ckpt = Path(parameter(ft, "model_checkpoint_path"))
    assert ckpt.name == "1-gpu" and ckpt.is_relative_to(ftx_home / "store" / "convert")
    assert (ckpt / "config.ini").is_file()
    assert not ft.model_transaction_policy.decoupled
    # ragged input_ids with its BATCH_ITEM_SHAPE batch input
    ids = inputs(ft)["input_ids"]
    assert ids.allow_ragged_batch and ids.data_type == mc.TYPE_UINT32
    (batch_input,) = ft.batch_input
    assert batch_input.kind == mc.BatchInput.Kind.BATCH_ITEM_SHAPE
    assert list(batch_input.target_name) == ["input_ids_item_shape"] and list(batch_input.source_input) == ["input_ids"]
    assert batch_input.data_type == mc.TYPE_INT32
    assert ft.HasField("dynamic_batching")
    assert ft.dynamic_batching.max_queue_delay_microseconds == DEFAULT_BATCH_DELAY_US  # against the 1 / c-1 split
    # FasterTransformer's own names and dtypes
    assert inputs(ft)["input_lengths"].data_type == mc.TYPE_UINT32
    assert inputs(ft)["request_output_len"].data_type == mc.TYPE_UINT32
    assert inputs(ft)["bad_words_list"].optional and list(inputs(ft)["bad_words_list"].dims) == [2, -1]
    assert {o.name: o.data_type for o in ft.output}["output_ids"] == mc.TYPE_UINT32


def test_text_model_speaks_generate_names_and_is_wired(ftx_cli, tiny_gptj_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "repo"
    configure(ftx_cli, tiny_gptj_dir, out)
    ens = parse_config(out / "text" / "config.pbtxt")
    assert ens.platform == "ensemble"
    ins = inputs(ens)
    assert ins["text_input"].data_type == mc.TYPE_STRING and not ins["text_input"].optional
    # INT64: Triton casts a JSON number to the declared type unchecked, so INT32 would wrap 2**32 + 5 to 5
    assert ins["max_tokens"].data_type == mc.TYPE_INT64 and not ins["max_tokens"].optional
    for name in ("temperature", "top_k", "top_p", "stop", "beam_width", "stream", "random_seed", "bad_token_ids"):
        assert ins[name].optional, name
    assert ins["stream"].data_type == mc.TYPE_BOOL
    assert [(o.name, o.data_type) for o in ens.output] == [
        ("text_output", mc.TYPE_STRING),
        ("output_token_ids", mc.TYPE_INT64),
        ("output_token_log_probs", mc.TYPE_FP32),
    ]
    assert [s.model_name for s in ens.ensemble_scheduling.step] == [
        "preprocessing",
        "fastertransformer",
        "postprocessing",
    ]
    assert check_ensemble(out, "text") == []


def test_ensemble_speaks_fastertransformer_backends_ensemble_names(
    ftx_cli, tiny_gptj_dir: Path, tmp_path: Path
) -> None:
    """``ensemble`` has fastertransformer_backend's all_models/gptj/ensemble interface."""
    out = tmp_path / "repo"
    configure(ftx_cli, tiny_gptj_dir, out)
    ens = parse_config(out / "ensemble" / "config.pbtxt")
    ins = inputs(ens)
    expected = {
        "INPUT_0": (mc.TYPE_STRING, [-1]),
        "INPUT_1": (mc.TYPE_UINT32, [-1]),
        "INPUT_2": (mc.TYPE_STRING, [-1]),
        "INPUT_3": (mc.TYPE_STRING, [-1]),
        "beam_width": (mc.TYPE_UINT32, [1]),
        "runtime_top_k": (mc.TYPE_UINT32, [1]),
        "runtime_top_p": (mc.TYPE_FP32, [1]),
        "random_seed": (mc.TYPE_UINT64, [1]),
        "is_return_log_probs": (mc.TYPE_BOOL, [1]),
        "start_id": (mc.TYPE_UINT32, [1]),
        "end_id": (mc.TYPE_UINT32, [1]),
        "temperature": (mc.TYPE_FP32, [1]),
        "len_penalty": (mc.TYPE_FP32, [1]),
        "repetition_penalty": (mc.TYPE_FP32, [1]),
        "beam_search_diversity_rate": (mc.TYPE_FP32, [1]),
    }
    for name, (dtype, dims) in expected.items():
        assert (ins[name].data_type, list(ins[name].dims)) == (dtype, dims), name
    assert not ins["INPUT_0"].optional and not ins["INPUT_1"].optional and ins["INPUT_2"].optional
    outs = {o.name: o.data_type for o in ens.output}
    # FasterTransformer's GPT-J returns INT32 lengths (its NeoX UINT32): the ensemble passes on what it gets
    assert outs == {
        "OUTPUT_0": mc.TYPE_STRING,
        "sequence_length": mc.TYPE_INT32,
        "cum_log_probs": mc.TYPE_FP32,
        "output_log_probs": mc.TYPE_FP32,
    }
    assert check_ensemble(out) == []
    record = json.loads((out / "ftx-deployment.json").read_text())
    assert "ensemble" in record["models"] and record["endpoints"]["ensemble"] == "/v2/models/ensemble/infer"


def test_deployment_record(ftx_cli, ftx_home: Path, tiny_gptj_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "repo"
    configure(ftx_cli, tiny_gptj_dir, out, "--data-type", "fp16")
    record = json.loads((out / "ftx-deployment.json").read_text())
    assert record["family"] == "gptj" and record["model_type"] == "GPT-J"
    assert (record["tp"], record["pp"], record["weight_dtype"], record["data_type"]) == (
        1,
        1,
        "fp16",
        "fp16",
    )  # weights in the compute type
    assert record["source"]["path"] == str(tiny_gptj_dir) and record["source"]["revision"]
    assert record["plugins"]["family"]["distribution"] == "ftx-triton-gptj" and record["plugins"]["ftx"]
    for stage in ("fetch", "convert", "tune"):
        assert re.fullmatch(r"[0-9a-f]{24}", record["artifacts"][stage]), stage
    assert (ftx_home / "store" / "convert" / record["artifacts"]["convert"]).is_dir()
    assert record["preset"] is None and record["endpoints"]["generate"] == "/v2/models/text/generate"
    assert record["tokenizer"]["files"] == ["tokenizer.json", "tokenizer_config.json"]


def test_tp2_points_at_the_2gpu_checkpoint(ftx_cli, tiny_gptj_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "repo"
    configure(ftx_cli, tiny_gptj_dir, out, "--tp", "2", "--max-batch-size", "16", "--instances", "2")
    ft = ft_config(out)
    assert parameter(ft, "tensor_para_size") == "2"
    assert Path(parameter(ft, "model_checkpoint_path")).name == "2-gpu"
    assert ft.max_batch_size == 16 and [g.count for g in ft.instance_group] == [2]
    assert parse_config(out / "ensemble" / "config.pbtxt").max_batch_size == 16


def test_text_instances_count_both_text_models(ftx_cli, tiny_gptj_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "repo"
    configure(ftx_cli, tiny_gptj_dir, out, "--text-instances", "3")
    for role in ("preprocessing", "postprocessing"):
        assert [g.count for g in parse_config(out / role / "config.pbtxt").instance_group] == [3], role
    assert [g.count for g in ft_config(out).instance_group] == [1]
    assert json.loads((out / "ftx-deployment.json").read_text())["text_instances"] == 3
    streaming = tmp_path / "streaming"
    told = configure(ftx_cli, tiny_gptj_dir, streaming, "--text-instances", "3", "--streaming")
    assert "interval auto: a response every ceil(requests in the batch / 4) tokens" in told.stderr
    counts = {
        r: parse_config(streaming / r / "config.pbtxt").instance_group[0].count
        for r in ("preprocessing", "postprocessing")
    }
    assert counts == {"preprocessing": 3, "postprocessing": 1}  # a stream's pieces keep their order
    plan = ftx_cli("run", str(tiny_gptj_dir), "--dry-run", "--streaming", "--text-instances", "3")
    assert plan.exit_code == 0, plan.stderr
    told = "preprocessing x3, postprocessing x1, batched, streaming (interval auto"
    assert told in plan.stdout
    assert json.loads((streaming / "ftx-deployment.json").read_text())["stream_interval"] == "auto"  # the default
    assert ft_config(streaming).parameters["ftx_stream_interval"].string_value == "auto"


def test_text_models_batch_unless_told_not_to(ftx_cli, tiny_gptj_dir: Path, tmp_path: Path) -> None:
    """Dynamic batching with every input ragged (the Python model answers each request on its own)."""
    batched, alone = tmp_path / "batched", tmp_path / "alone"
    configure(ftx_cli, tiny_gptj_dir, batched)
    configure(ftx_cli, tiny_gptj_dir, alone, "--no-text-batching")
    for role in ("preprocessing", "postprocessing"):
        on, off = parse_config(batched / role / "config.pbtxt"), parse_config(alone / role / "config.pbtxt")
        assert on.HasField("dynamic_batching") and all(i.allow_ragged_batch for i in on.input), role
        assert not off.HasField("dynamic_batching") and not any(i.allow_ragged_batch for i in off.input), role
    plan = ftx_cli("run", str(tiny_gptj_dir), "--dry-run", "--no-text-batching")
    assert "preprocessing x1, postprocessing x1, ensemble" in plan.stdout


def test_text_batch_delay_holds_preprocessing_requests_only(ftx_cli, tiny_gptj_dir: Path, tmp_path: Path) -> None:
    """--text-batch-delay-us is preprocessing's batcher delay (a burst tokenized in one call); postprocessing never
    waits (a stream's pieces would); without text batching there is no batcher to set, so a delay is refused."""
    out = tmp_path / "repo"
    configure(ftx_cli, tiny_gptj_dir, out, "--text-batch-delay-us", "3000")
    delays = {r: parse_config(out / r / "config.pbtxt").dynamic_batching for r in ("preprocessing", "postprocessing")}
    assert {r: d.max_queue_delay_microseconds for r, d in delays.items()} == {
        "preprocessing": 3000,
        "postprocessing": 0,
    }
    assert json.loads((out / "ftx-deployment.json").read_text())["text_batch_delay_us"] == 3000
    default = tmp_path / "default"
    configure(ftx_cli, tiny_gptj_dir, default)
    written = parse_config(default / "preprocessing" / "config.pbtxt").dynamic_batching.max_queue_delay_microseconds
    assert written == DEFAULT_TEXT_BATCH_DELAY_US
    result = refused(ftx_cli, tiny_gptj_dir, tmp_path / "off", "--no-text-batching", "--text-batch-delay-us", "3000")
    assert "error: --text-batch-delay-us" in result.stderr and "hint:" in result.stderr
    assert not (tmp_path / "off").exists()
    configure(ftx_cli, tiny_gptj_dir, tmp_path / "off-zero", "--no-text-batching", "--text-batch-delay-us", "0")


def test_streaming_is_decoupled_and_postprocessing_reads_ft_outputs_only(
    ftx_cli, tiny_gptj_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "repo"
    configure(ftx_cli, tiny_gptj_dir, out, "--streaming")
    assert ft_config(out).model_transaction_policy.decoupled
    for name, reads in (
        ("text", {"TOKENS_BATCH", "sequence_length", "output_log_probs"}),
        ("ensemble", {"TOKENS_BATCH", "sequence_length"}),
    ):
        post = parse_config(out / name / "config.pbtxt").ensemble_scheduling.step[2]
        assert set(post.input_map) == reads, name
        assert all(v.startswith("_") for v in post.input_map.values()) or name == "ensemble"
    params = parse_config(out / "preprocessing" / "config.pbtxt").parameters
    assert params["streaming"].string_value == "1"


def test_the_native_runtime_streams_each_piece_once_through_its_stream_offset(
    ftx_cli, tiny_gptj_dir: Path, tmp_path: Path
) -> None:
    """FasterTransformer resends the whole sequence in every streamed response; ftx's patched backend (the native
    runtime) also answers where the new tokens start and the prompt lengths, so its streaming FT model declares
    the offset and the text ensemble hands both to postprocessing (which then decodes only the new tokens). The
    upstream-built backend (the default runtime here) answers neither, so nothing reads them there."""
    native = tmp_path / "native"
    configure(ftx_cli, tiny_gptj_dir, native, "--streaming", "--runtime", "fastertransformer-native")
    assert "ftx_stream_offset" in {o.name for o in ft_config(native).output}
    post = parse_config(native / "text" / "config.pbtxt").ensemble_scheduling.step[2]
    assert {"ftx_stream_offset", "RESPONSE_INPUT_LENGTHS"} <= set(post.input_map)

    upstream = tmp_path / "upstream"
    configure(ftx_cli, tiny_gptj_dir, upstream, "--streaming")
    assert "ftx_stream_offset" not in {o.name for o in ft_config(upstream).output}
    not_streaming = tmp_path / "not-streaming"
    configure(ftx_cli, tiny_gptj_dir, not_streaming, "--runtime", "fastertransformer-native")
    assert "ftx_stream_offset" not in {o.name for o in ft_config(not_streaming).output}


def test_no_dynamic_batching(ftx_cli, tiny_gptj_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "repo"
    configure(ftx_cli, tiny_gptj_dir, out, "--no-dynamic-batching")
    ft = ft_config(out)
    assert not ft.HasField("dynamic_batching") and not ft.batch_input
    assert not inputs(ft)["input_ids"].allow_ragged_batch


def test_python_runtime_writes_the_python_ft_model(ftx_cli, tiny_gptj_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("ftx_triton.runtime.python.repository")
    out = tmp_path / "repo"
    configure(ftx_cli, tiny_gptj_dir, out, "--runtime", "python")
    ft = ft_config(out)
    assert ft.backend == "python" and (out / "fastertransformer" / "1" / "model.py").is_file()
    assert check_ensemble(out) == []
    assert json.loads((out / "ftx-deployment.json").read_text())["runtime"] == "python"


def test_second_configure_reuses_the_store(ftx_cli, ftx_home: Path, tiny_gptj_dir: Path, tmp_path: Path) -> None:
    configure(ftx_cli, tiny_gptj_dir, tmp_path / "a")
    again = configure(ftx_cli, tiny_gptj_dir, tmp_path / "b")
    events = [json.loads(line) for line in again.stderr.splitlines() if line.startswith("{")]
    assert {e["stage"] for e in events if e["event"] == "cache.hit"} == {"fetch", "convert", "tune", "configure"}
    assert (tmp_path / "b" / "ensemble" / "config.pbtxt").read_text() == (
        tmp_path / "a" / "ensemble" / "config.pbtxt"
    ).read_text()


def test_explicit_tokenizer_is_used(ftx_cli, tiny_gptj_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "src"
    shutil.copytree(tiny_gptj_dir, source)
    tokenizer = tmp_path / "tok"
    tokenizer.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (source / name).rename(tokenizer / name)
    configure(ftx_cli, source, tmp_path / "repo", "--tokenizer", str(tokenizer))
    for model in ("preprocessing", "postprocessing"):
        assert (tmp_path / "repo" / model / "1" / "tokenizer.json").read_bytes() == (
            tokenizer / "tokenizer.json"
        ).read_bytes()


# --------------------------------------------------------------------------- bad input


def _nothing_written(ftx_home: Path, out: Path, stages: tuple[str, ...] = ("configure",)) -> None:
    assert not out.exists()
    for stage in stages:
        assert not list((ftx_home / "store" / stage).glob("*")) if (ftx_home / "store" / stage).exists() else True
    assert not [p for p in out.parent.glob(f".{out.name}.tmp-*")]


def test_fp8_data_type_is_a_click_choice_error(ftx_cli, ftx_home: Path, tiny_gptj_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "repo"
    result = refused(ftx_cli, tiny_gptj_dir, out, "--data-type", "fp8")
    assert result.exit_code == 2 and "fp8" in result.stderr and "fp16" in result.stderr
    _nothing_written(ftx_home, out, ("fetch", "convert", "configure"))


@pytest.fixture
def no_tokenizer_dir(tiny_gptj_dir: Path, tmp_path: Path) -> Path:
    """The tiny GPT-J checkpoint without its tokenizer files."""
    source = tmp_path / "src"
    shutil.copytree(tiny_gptj_dir, source, ignore=shutil.ignore_patterns("tokenizer*"))
    return source


def test_missing_tokenizer_is_refused_before_converting(
    ftx_cli, ftx_home: Path, no_tokenizer_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "repo"
    result = refused(ftx_cli, no_tokenizer_dir, out)
    assert result.exit_code == 1
    assert "error:" in result.stderr and "no tokenizer" in result.stderr and "--tokenizer" in result.stderr
    _nothing_written(ftx_home, out, ("fetch", "convert", "configure"))


def test_missing_tokenizer_in_the_stage_writes_no_repository(ftx_cli, ftx_home: Path, no_tokenizer_dir: Path) -> None:
    """`ftx run --until configure` reaches the stage itself: it fails before publishing anything."""
    result = ftx_cli("run", str(no_tokenizer_dir), "--until", "configure", "--runtime", "python")
    assert result.exit_code == 1 and "no tokenizer" in result.stderr
    assert not list((ftx_home / "store" / "configure").glob("*"))


def test_output_must_be_empty(ftx_cli, tiny_gptj_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "repo"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = refused(ftx_cli, tiny_gptj_dir, out)
    assert result.exit_code == 1 and "not empty" in result.stderr
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_gptneox_refuses_bf16_with_the_reason(ftx_cli, ftx_home: Path, tmp_path: Path) -> None:
    """FasterTransformer runs GPT-NeoX in fp16 or (silently, for anything else) fp32."""
    from ftx_gptneox.tiny import tiny_gptneox

    source = tiny_gptneox(tmp_path / "neox")
    out = tmp_path / "repo"
    result = refused(ftx_cli, source, out, "--family", "gptneox", "--data-type", "bf16")
    assert result.exit_code == 1
    assert "GPT-NeoX" in result.stderr and "fp32" in result.stderr and "--data-type fp32 or fp16" in result.stderr
    _nothing_written(ftx_home, out, ("convert", "configure"))
    configure(ftx_cli, source, out, "--family", "gptneox", "--data-type", "fp16")
    assert parameter(ft_config(out), "model_type") == "GPT-NeoX"


def test_data_type_rules_come_from_the_family(plugin_host) -> None:
    check_data_type(plugin_host.family("gptj"), "bf16")
    check_data_type(plugin_host.family("t5"), "bf16")
    check_data_type(plugin_host.family("gptneox"), "fp16")
    with pytest.raises(ConfigError, match="silently runs as fp32") as caught:
        check_data_type(plugin_host.family("gptneox"), "bf16")
    assert caught.value.hint == "use --data-type fp32 or fp16"
    with pytest.raises(ConfigError, match="runs GPT-J in fp32 only"):
        refuse_data_type("GPT-J", "fp16", ("fp32",))


def test_ft_options_the_backend_refuses_are_refused(plugin_host) -> None:
    base = FtModelOptions(model_type="GPT-J", io_kind="decoder", checkpoint_path=Path("/x/1-gpu"), tp=1)
    neox = FtModelOptions.for_family(plugin_host.family("gptneox"), Path("/x/1-gpu"), 1, data_type="bf16")
    assert (neox.model_type, neox.data_types) == ("GPT-NeoX", ("fp32", "fp16"))
    for options, match in (
        (replace(base, max_batch_size=0), "max_batch_size"),
        (replace(base, instances=0), "instance"),
        (replace(base, text_instances=0), "text models"),
        (replace(base, tp=0), "tensor_para_size"),
        (replace(base, io_kind="encoder"), "I/O kind"),
        (neox, "GPT-NeoX"),
    ):
        with pytest.raises(ConfigError, match=match):
            build_ft_model_config(options)
    build_ft_model_config(replace(neox, data_type="fp16"))


@pytest.mark.parametrize(
    ("family", "dtype"),
    [("gptj", mc.TYPE_INT32), ("kogpt", mc.TYPE_INT32), ("gptneox", mc.TYPE_UINT32), ("t5", mc.TYPE_INT32)],
)
def test_sequence_length_is_declared_as_fastertransformer_returns_it(plugin_host, family: str, dtype: int) -> None:
    """Triton forwards the backend's own dtype and an ensemble step refuses another: a config saying
    UINT32 for GPT-J's INT32 lengths fails every ensemble request on the real backend."""
    options = FtModelOptions.for_family(plugin_host.family(family), Path("/x/1-gpu"), 1)
    assert {o.name: o.data_type for o in build_ft_model_config(options).output}["sequence_length"] == dtype


def test_postprocessing_reads_the_lengths_in_the_dtype_the_model_declares(
    ftx_cli, tiny_gptj_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "repo"
    configure(ftx_cli, tiny_gptj_dir, out)
    declared = {o.name: o.data_type for o in ft_config(out).output}["sequence_length"]
    post = inputs(parse_config(out / "postprocessing" / "config.pbtxt"))
    assert post["sequence_length"].data_type == declared == mc.TYPE_INT32
    assert check_ensemble(out) == [] and check_ensemble(out, "text") == []


def test_t5_config_uses_encoder_decoder_io() -> None:
    opts = FtModelOptions(model_type="T5", io_kind="encoder-decoder", checkpoint_path=Path("/x/2-gpu"), tp=2)
    config = build_ft_model_config(opts)
    names = inputs(config)
    assert {"input_ids", "sequence_length", "max_output_len"} <= set(names)
    assert "input_lengths" not in names and names["input_ids"].allow_ragged_batch
    assert {o.name: o.data_type for o in config.output}["output_ids"] == mc.TYPE_INT32
    assert parameter(config, "tensor_para_size") == "2" and parameter(config, "pipeline_para_size") == "1"


# --------------------------------------------------------------------------- checkpoint vs repository


@pytest.fixture
def converted(ftx_cli, ftx_home: Path, tiny_gptj_dir: Path) -> Path:
    """The store's 2-gpu conversion of the tiny GPT-J."""
    result = ftx_cli("run", str(tiny_gptj_dir), "--until", "convert", "--tp", "2")
    assert result.exit_code == 0, result.stderr
    return Path(result.stdout.strip())


def test_checkpoint_for_another_tp_is_refused(converted: Path, tmp_path: Path, plugin_host) -> None:
    family = plugin_host.family("gptj")
    check_checkpoint(family, converted, tp=2, weight_dtype="fp32")
    with pytest.raises(ConfigError, match="not for --tp 1"):
        check_checkpoint(family, converted, tp=1, weight_dtype="fp32")
    renamed = tmp_path / "1-gpu"
    shutil.copytree(converted, renamed)  # a 2-way split that claims to be 1-gpu
    with pytest.raises(ConfigError, match=r"ranks \[0, 1\]"):
        check_checkpoint(family, renamed, tp=1, weight_dtype="fp32")
    with pytest.raises(ConfigError, match="weight_data_type"):
        check_checkpoint(family, converted, tp=2, weight_dtype="fp16")
    with pytest.raises(ConfigError, match="section"):
        check_checkpoint(plugin_host.family("gptneox"), converted, tp=2, weight_dtype="fp32")


def test_configure_hook_refuses_a_checkpoint_for_another_tp(converted: Path, ftx_home: Path, plugin_host) -> None:
    from ftx_triton.engine.default_plugins.configure import ftx_configure
    from ftx_triton.plan.artifacts import Checkpoint, GemmConfig, Source, SourceRef
    from ftx_triton.plan.context import StageContext
    from ftx_triton.plan.settings import RunSettings
    from ftx_triton.runtime.fastertransformer.docker.plugin import DockerFasterTransformer
    from ftx_triton.store.artifact_store import ArtifactStore

    family = plugin_host.family("gptj")
    source_path = Path(
        json.loads(
            (
                ftx_home
                / "store"
                / "fetch"
                / json.loads((converted.parent / "ftx-artifact.json").read_text())["inputs"]["fetch"]
                / "ftx-artifact.json"
            ).read_text()
        )["result"]["path"]
    )
    source = Source(SourceRef("local", str(source_path)), source_path, "local-x")
    hf_config = family.read_hf_config(source_path)
    ctx = StageContext(
        RunSettings.of("x", tp=1, weight_dtype="fp32"),
        ArtifactStore(ftx_home),
        ftx_home,
        runtime=DockerFasterTransformer(),
    )
    dest = ftx_home / "dest"
    with pytest.raises(ConfigError, match="tp 2, not the requested --tp 1"):
        ftx_configure(
            family=family,
            spec=family.spec(hf_config),
            source=source,
            checkpoint=Checkpoint(converted, 2, "fp32", "gptj"),
            gemm=GemmConfig(None, False),
            dest=dest,
            ctx=ctx,
            runtime=ctx.runtime,
        )
    assert not dest.exists()


def test_prompt_learning_keys_in_config_ini_are_refused(converted: Path, tmp_path: Path, plugin_host) -> None:
    """A sample config.ini with num_tasks/prompt_learning_type next to real weights."""
    copy = tmp_path / "2-gpu"
    shutil.copytree(converted, copy)
    ini = copy / "config.ini"
    ini.write_text(ini.read_text() + "num_tasks = 2\nprompt_learning_type = 2\n\n[task_0]\ntask_name = squad\n")
    with pytest.raises(ConfigError, match="prompt learning"):
        check_checkpoint(plugin_host.family("gptj"), copy, tp=2, weight_dtype="fp32")


def test_verify_catches_config_pbtxt_that_disagrees_with_config_ini(
    ftx_cli, tiny_gptj_dir: Path, tmp_path: Path
) -> None:
    """The tp in config.pbtxt must match the converted files."""
    out = tmp_path / "repo"
    configure(ftx_cli, tiny_gptj_dir, out)
    path = out / "fastertransformer" / "config.pbtxt"
    original = path.read_text()
    config = parse_config(path)
    config.parameters["tensor_para_size"].string_value = "2"
    path.write_text(text_format.MessageToString(config))
    with pytest.raises(ConfigError, match="tensor_para_size 2"):
        verify_repository(out)
    config.parameters["tensor_para_size"].string_value = "1"
    config.parameters["model_type"].string_value = "T5"
    path.write_text(text_format.MessageToString(config))
    with pytest.raises(ConfigError, match="model_type T5"):
        verify_repository(out)
    path.write_text(original)
    record = json.loads((out / "ftx-deployment.json").read_text())
    assert (record["model_type"], record["ini_sections"], record["data_types"]) == (
        "GPT-J",
        ["gptj"],
        ["fp32", "fp16", "bf16"],
    )
    # the model type's facts travel in the record: sections FT reads, compute types it runs
    (out / "ftx-deployment.json").write_text(json.dumps({**record, "ini_sections": ["encoder", "decoder"]}))
    with pytest.raises(ConfigError, match=r"model_type GPT-J reads config.ini section\(s\) encoder, decoder"):
        verify_repository(out)
    data_type = parameter(parse_config(path), "data_type")
    others = [t for t in record["data_types"] if t != data_type]
    (out / "ftx-deployment.json").write_text(json.dumps({**record, "data_types": others}))
    with pytest.raises(ConfigError, match=f"data_type {data_type} is not run by FasterTransformer for GPT-J"):
        verify_repository(out)
    other_weights = "bf16" if record["weight_dtype"] != "bf16" else "fp32"
    (out / "ftx-deployment.json").write_text(json.dumps({**record, "weight_dtype": other_weights}))
    with pytest.raises(ConfigError, match=f"weight_dtype {other_weights}"):
        verify_repository(out)
    path.write_text(original.replace("max_batch_size", "max_batch_sise"))
    with pytest.raises(ConfigError, match="max_batch_sise"):
        verify_repository(out)


def test_t5_fastertransformer_model_takes_upstreams_optional_inputs(tmp_path: Path) -> None:
    """#16.3: ia3_tasks, request_prompt_lengths and request_prompt_embedding as upstream's T5 config has
    them, so Triton passes such requests to FasterTransformer (and to the python runtime)."""
    options = FtModelOptions(model_type="T5", io_kind="encoder-decoder", checkpoint_path=tmp_path / "1-gpu", tp=1)
    ins = inputs(build_ft_model_config(options))
    expected = {
        "ia3_tasks": (mc.TYPE_INT32, [1]),
        "request_prompt_lengths": (mc.TYPE_UINT32, [1]),
        "request_prompt_embedding": (mc.TYPE_FP16, [-1, -1]),
    }
    for name, (dtype, dims) in expected.items():
        assert (ins[name].data_type, list(ins[name].dims), ins[name].optional) == (dtype, dims, True), name


def test_default_max_batch_size_takes_upstreams_client_batches(ftx_cli) -> None:
    """#16.6: 32 (the guides) and 128 (evaluate_lambada.py's default) fit; the CLI, the settings and
    the model options agree."""
    from ftx_triton.plan.settings import RunSettings

    assert DEFAULT_MAX_BATCH_SIZE >= 128
    help_text = " ".join(ftx_cli("configure", "--help").stdout.split())
    assert re.search(
        r"--max-batch-size INTEGER RANGE Largest batch Triton sends to the model\. "
        rf"\[(env var: \w+; )?default: {DEFAULT_MAX_BATCH_SIZE};",
        help_text,
    ), help_text
    assert RunSettings.of("m").configure.max_batch_size == DEFAULT_MAX_BATCH_SIZE
    assert FtModelOptions("GPT-J", "decoder", Path("x"), 1).max_batch_size == DEFAULT_MAX_BATCH_SIZE


def test_configure_says_once_that_it_does_not_tune_and_blames_no_flag(
    ftx_cli, ftx_home: Path, tiny_gptj_dir: Path, tmp_path: Path
) -> None:
    """It warned twice about a --no-tune nobody passed."""
    result = ftx_cli("configure", str(tiny_gptj_dir), "--output", str(tmp_path / "repo"))
    assert result.exit_code == 0, result.stderr
    assert "--no-tune" not in result.stderr and "tune.skipped" not in result.stderr
    assert result.stderr.count("ftx configure writes the repository without tuning") == 1
