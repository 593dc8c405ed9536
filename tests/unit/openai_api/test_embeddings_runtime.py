"""Which deployments /v1/embeddings serves, read from the repository's ftx-deployment.json (written here as ftx
writes it; no server is needed to decide)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from ftx_triton.openai_api.embeddings import Embeddings
from ftx_triton.openai_api.params import BadRequest

TRITON = "127.0.0.1:1"


def _repository(tmp_path: Path, **record: Any) -> Path:
    (tmp_path / "ftx-deployment.json").write_text(json.dumps(record))
    return tmp_path


def test_t5_started_without_embeddings_is_501_naming_the_flag(tmp_path: Path) -> None:
    repo = _repository(tmp_path, family="t5", io_kind="encoder-decoder", models=["fastertransformer", "text"])
    with pytest.raises(BadRequest) as refused:
        Embeddings(repo, TRITON).encoder()
    assert refused.value.status == 501 and refused.value.code == "embeddings_unsupported"
    assert "--embeddings" in str(refused.value)


def test_a_decoder_only_family_is_400(tmp_path: Path) -> None:
    repo = _repository(tmp_path, family="gptj", io_kind="decoder", models=["fastertransformer", "text"])
    with pytest.raises(BadRequest) as refused:
        Embeddings(repo, TRITON).encoder()
    assert refused.value.status == 400 and "no encoder" in str(refused.value)


def test_a_repository_without_its_record_is_501(tmp_path: Path) -> None:
    with pytest.raises(BadRequest) as refused:
        Embeddings(tmp_path, TRITON).encoder()
    assert refused.value.status == 501


def test_a_deployment_with_its_encoder_model_gets_a_client_with_the_models_vocabulary(tmp_path: Path) -> None:
    repo = _repository(
        tmp_path,
        family="t5",
        io_kind="encoder-decoder",
        models=["fastertransformer", "encoder"],
        max_batch_size=8,
        spec={"dims": {"V": 32128}},
        tokenizer={"vocab_size": 32100},
    )
    encoder = Embeddings(repo, TRITON).encoder()
    assert (encoder.vocab_size, encoder.max_batch, encoder.url) == (32128, 8, "127.0.0.1:1")


def test_an_endpoint_without_tritons_grpc_address_is_501(tmp_path: Path) -> None:
    repo = _repository(tmp_path, family="t5", io_kind="encoder-decoder", models=["encoder"])
    with pytest.raises(BadRequest, match="gRPC") as refused:
        Embeddings(repo, None).encoder()
    assert refused.value.status == 501
