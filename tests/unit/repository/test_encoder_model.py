"""The ``encoder`` model that ``--embeddings`` adds to an encoder-decoder repository: FasterTransformer's
``T5-Encoder`` model type on the fastertransformer runtimes (its config as fastertransformer_backend's own
t5-encoder model declares it), the python runtime's stand-in, and the refusals."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from ftx_triton.errors import ConfigError
from ftx_triton.plugins import load_host
from ftx_triton.repository.model_config import FtModelOptions, check_embeddings, parse_config
from ftx_triton.runtime.fastertransformer.base import FasterTransformerRuntime
from ftx_triton.runtime.python.plugin import PythonRuntime
from repo_paths import REPO
from tritonclient.grpc import model_config_pb2 as mc

UPSTREAM = Path(os.environ.get("FTX_UPSTREAM_CLIENTS", REPO.parent / "shared" / "upstream-clients"))


def _options(tp: int = 1, data_type: str = "fp16", **choices: object) -> FtModelOptions:
    return FtModelOptions(  # type: ignore[arg-type]
        model_type="T5",
        io_kind="encoder-decoder",
        checkpoint_path=Path(f"/x/{tp}-gpu"),
        tp=tp,
        data_type=data_type,
        embeddings=True,
        **choices,
    )


def _io(config: mc.ModelConfig) -> list[tuple[str, int, list[int], list[int]]]:
    return [
        (t.name, t.data_type, list(t.dims), list(t.reshape.shape))
        for t in (*config.input, *config.output)
        if not getattr(t, "optional", False)
    ]


@pytest.mark.parametrize(("data_type", "wanted"), [("fp16", "TYPE_FP16"), ("bf16", "TYPE_BF16"), ("fp32", "TYPE_FP32")])
def test_fastertransformer_writes_the_backends_t5_encoder_model(tmp_path: Path, data_type: str, wanted: str) -> None:
    t5 = load_host().family("t5")
    backend = FasterTransformerRuntime.write_encoder_model(
        None, tmp_path / "encoder", _options(data_type=data_type), t5
    )  # type: ignore[arg-type]
    config = parse_config(tmp_path / "encoder" / "config.pbtxt")
    assert backend == config.backend == "fastertransformer"
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert params["model_type"] == "T5-Encoder" and params["model_checkpoint_path"] == "/x/1-gpu"
    assert params["data_type"] == data_type and params["tensor_para_size"] == "1"
    # the backend sets the hidden states' type to the compute type; declared so, the config needs no rewrite
    assert mc.DataType.Name(config.output[0].data_type) == wanted
    assert [(i.name, mc.DataType.Name(i.data_type)) for i in config.input] == [
        ("input_ids", "TYPE_UINT32"),
        ("sequence_length", "TYPE_UINT32"),
    ]


@pytest.mark.skipif(
    not (UPSTREAM / "all_models" / "t5-encoder").is_dir(), reason="upstream's model interfaces are absent"
)
def test_the_encoder_models_interface_is_upstreams_t5_encoder(tmp_path: Path) -> None:
    upstream = parse_config(UPSTREAM / "all_models" / "t5-encoder" / "fastertransformer" / "config.pbtxt")
    FasterTransformerRuntime.write_encoder_model(
        None, tmp_path / "encoder", _options(data_type="fp32"), load_host().family("t5")
    )  # type: ignore[arg-type]
    ours = parse_config(tmp_path / "encoder" / "config.pbtxt")
    wanted = [t for t in _io(upstream) if t[0] != "output_attentions"]  # attentions: never asked for here
    assert _io(ours) == wanted
    assert {k: v.string_value for k, v in ours.parameters.items()}["model_type"] == upstream.parameters[
        "model_type"
    ].string_value


def test_fastertransformer_refuses_the_encoder_beside_a_multi_gpu_model(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="tp x pp = 2 x 1") as refused:
        FasterTransformerRuntime.write_encoder_model(
            None, tmp_path / "encoder", _options(tp=2), load_host().family("t5")
        )  # type: ignore[arg-type]
    assert "--tp 1" in (refused.value.hint or "")
    assert not (tmp_path / "encoder" / "config.pbtxt").exists()


def test_python_runtime_writes_its_stand_in_with_float32_hidden_states(tmp_path: Path) -> None:
    t5 = load_host().family("t5")
    assert PythonRuntime.write_encoder_model(None, tmp_path / "encoder", _options(), t5) == "python"  # type: ignore[arg-type]
    config = parse_config(tmp_path / "encoder" / "config.pbtxt")
    assert config.backend == "python" and config.parameters["ftx_family"].string_value == "t5"
    assert config.output[0].data_type == mc.DataType.TYPE_FP32
    assert "ftx_triton.runtime.python.encoder_model" in (tmp_path / "encoder" / "1" / "model.py").read_text()


def test_embeddings_of_a_decoder_only_model_are_refused() -> None:
    options = FtModelOptions(
        model_type="GPT-J", io_kind="decoder", checkpoint_path=Path("/x/1-gpu"), tp=1, embeddings=True
    )
    with pytest.raises(ConfigError, match="decoder-only"):
        check_embeddings(options, "gptj")
    check_embeddings(_options(), "t5")  # an encoder-decoder model passes
