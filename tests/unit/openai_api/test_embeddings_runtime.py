"""Which deployments /v1/embeddings serves, read from the repository's ftx-deployment.json (written here as ftx
writes it; no server is needed to decide)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ftx_triton.openai_api.embeddings import Embeddings
from ftx_triton.openai_api.params import BadRequest


def _repository(tmp_path: Path, **record: str) -> Path:
    (tmp_path / "ftx-deployment.json").write_text(json.dumps(record))
    return tmp_path


def test_t5_on_the_fastertransformer_runtime_is_501_saying_why(tmp_path: Path) -> None:
    embeddings = Embeddings(_repository(tmp_path, family="t5", runtime="fastertransformer", checkpoint="/none"))
    with pytest.raises(BadRequest) as refused:
        embeddings.encoder()
    assert refused.value.status == 501 and refused.value.code == "embeddings_unsupported"
    assert "T5-Encoder" in str(refused.value) and "--runtime python" in str(refused.value)


def test_a_decoder_only_family_is_400(tmp_path: Path) -> None:
    embeddings = Embeddings(_repository(tmp_path, family="gptj", runtime="python", checkpoint="/none"))
    with pytest.raises(BadRequest) as refused:
        embeddings.encoder()
    assert refused.value.status == 400 and "no encoder" in str(refused.value)


def test_a_repository_without_its_record_is_501(tmp_path: Path) -> None:
    with pytest.raises(BadRequest) as refused:
        Embeddings(tmp_path).encoder()
    assert refused.value.status == 501
