"""``/v1/embeddings`` on a T5 deployment: `ftx run --embeddings` of a tiny random T5 on the python runtime (real
tritonserver serving the repository's ``encoder`` model, real HTTP), asked by the official ``openai`` client,
compared with ``transformers``' T5EncoderModel mean-pooled over the same tokens."""

from __future__ import annotations

import json
import re
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from python_runtime_support import SERVER_MARKS, detached_run, tiny_t5

pytestmark = SERVER_MARKS

FTX = [str(Path(sys.executable).parent / "ftx")]
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
TEXTS = ["translate English to German: The house is wonderful.", "Hello world"]


def _post(url: str, body: Any) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with _OPENER.open(request, timeout=300) as response:
            return response.status, json.loads(response.read().decode())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read().decode())


class Served:
    def __init__(self, home: Path, source: Path, stdout: str) -> None:
        self.home, self.source, self.stdout_text = home, source, stdout
        self.openai = re.search(r"OpenAI\s+(http://\S+/v1)", stdout).group(1)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    home = tmp_path_factory.mktemp("embed-home")
    source = tiny_t5(tmp_path_factory.mktemp("tiny-t5"))
    with detached_run(home, str(source), "--embeddings") as (run, _env):
        yield Served(home, source, run.stdout)


def _reference(source: Path, texts: list[str]) -> np.ndarray:
    """transformers' T5EncoderModel on the original checkpoint, mean-pooled over each input's tokens."""
    import torch
    from transformers import T5EncoderModel, T5Tokenizer

    tokenizer = T5Tokenizer(str(source / "spiece.model"), legacy=False)
    model = T5EncoderModel.from_pretrained(source).eval()
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    with torch.inference_mode():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    return ((hidden * mask).sum(dim=1) / mask.sum(dim=1)).numpy()


def test_openai_client_embeddings_equal_transformers_t5_encoder_mean_pool(served: Served) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=served.openai, api_key="unused", max_retries=0)
    answer = client.embeddings.create(model=client.models.list().data[0].id, input=TEXTS)  # base64 on the wire
    got = np.array([item.embedding for item in answer.data], dtype=np.float32)
    want = _reference(served.source, TEXTS)
    assert got.shape == want.shape and got.shape[1] > 1
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert [item.index for item in answer.data] == [0, 1]
    assert answer.usage.prompt_tokens == answer.usage.total_tokens > len(TEXTS)
    floats = client.embeddings.create(model=answer.model, input=TEXTS[1], encoding_format="float")
    np.testing.assert_allclose(floats.data[0].embedding, got[1], rtol=1e-5, atol=1e-6)  # alone = in a padded batch


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": []}, "input"),
        ({"input": ""}, "input"),
        ({"input": [1, "a"]}, "input"),
        ({"input": [[5, 10_000_000]]}, "input"),
        ({"input": [[-1]]}, "input"),
        ({"input": [[1] * 513]}, "input"),
        ({"input": ["a"] * 65}, "input"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "a", "dimensions": 4}, "dimensions"),
    ],
)
def test_bad_embedding_requests_are_400_naming_the_field(served: Served, body: dict, param: str) -> None:
    status, answer = _post(served.openai + "/embeddings", body)
    assert status == 400, answer
    assert answer["error"]["param"] == param and answer["error"]["type"] == "invalid_request_error"


def test_the_repository_serves_the_encoder_as_a_triton_model(served: Served) -> None:
    """The encoder is a model of the deployment: Triton's own clients reach it too (ids and lengths in)."""
    import tritonclient.http as httpclient

    record = json.loads(next(served.home.rglob("ftx-deployment.json")).read_text())
    assert "encoder" in record["models"] and record["embeddings"] is True
    url = re.search(r"http://(127\.0\.0\.1:\d+)", served.stdout_text).group(1)
    client = httpclient.InferenceServerClient(url)
    ids = np.array([[5, 6, 7, 1]], dtype=np.uint32)
    inputs = [
        httpclient.InferInput("input_ids", [1, 4], "UINT32"),
        httpclient.InferInput("sequence_length", [1, 1], "UINT32"),
    ]
    inputs[0].set_data_from_numpy(ids)
    inputs[1].set_data_from_numpy(np.array([[4]], dtype=np.uint32))
    hidden = client.infer("encoder", inputs).as_numpy("output_hidden_state")
    assert hidden.shape[:2] == (1, 4) and hidden.dtype == np.float32 and np.isfinite(hidden).all()
    inputs[1].set_data_from_numpy(np.array([[9]], dtype=np.uint32))  # longer than the row: refused, not read past
    with pytest.raises(Exception, match="sequence_length"):
        client.infer("encoder", inputs)
