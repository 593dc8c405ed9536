"""Helpers for the python-runtime tests: tiny checkpoints per family, conversions, FT requests.

Everything is built offline from ``transformers`` config classes and ``tokenizers``/``sentencepiece``
trainers; servers are the real tritonserver from the nvidia-pytriton wheel.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ftx_triton.conversion.convert import convert_directory
from ftx_triton.conversion.family import Family

T5_SPECIALS: dict[str, Any] = {"pad_id": 0, "eos_id": 1, "unk_id": 2, "bos_id": -1}
T5_SENTENCES = (
    "translate English to German: The house is wonderful.",
    "translate English to German: Hello world, this is a tiny model.",
    "translate English to German: Once upon a time there was a small language model.",
    "translate English to German: A tensor parallel model is split across several GPUs.",
)
T5_REFERENCES = (
    "Das Haus ist wunderbar.",
    "Hallo Welt, das ist ein winziges Modell.",
    "Es war einmal ein kleines Sprachmodell.",
    "Ein tensorparalleles Modell ist auf mehrere GPUs verteilt.",
)


def tiny_gptj(dest: Path) -> Path:
    from ftx_gptj.tiny import tiny_gptj as build

    return build(dest, random_init=True, seed=3)


def tiny_gptneox(dest: Path) -> Path:
    from ftx_gptneox.tiny import tiny_gptneox as build

    return build(dest, random_init=True, seed=4)


def tiny_kogpt(dest: Path, vocab_size: int = 504) -> Path:
    """KoGPT's shape scaled down (``vocab_size``: KoGPT's own is 64512), with its tokenizer."""
    from ftx_kogpt.tiny import tiny_kogpt as build

    return build(dest, vocab_size=vocab_size)


def train_t5_spiece(dest: Path, vocab_size: int = 120) -> Any:
    """A sentencepiece model with T5's special ids (pad 0, </s> 1, <unk> 2) as ``dest/spiece.model``."""
    import io

    import sentencepiece as spm
    from ftx_triton.tiny import CORPUS

    lines = [s.strip() + "." for s in CORPUS.split(".") if s.strip()] + list(T5_SENTENCES) + list(T5_REFERENCES)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines * 4),
        model_writer=model,
        vocab_size=vocab_size,
        model_type="unigram",
        character_coverage=1.0,
        hard_vocab_limit=False,
        **T5_SPECIALS,
        minloglevel=2,
    )
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "spiece.model").write_bytes(model.getvalue())
    processor = spm.SentencePieceProcessor()
    processor.Load(str(dest / "spiece.model"))
    return processor


def tiny_t5(dest: Path) -> Path:
    from ftx_t5.tiny import tiny_t5 as build

    processor = train_t5_spiece(dest)
    build(dest, vocab_size=max(128, processor.GetPieceSize()), seed=5)
    return dest


BUILDERS: dict[str, Callable[[Path], Path]] = {
    "gptj": tiny_gptj,
    "gptneox": tiny_gptneox,
    "kogpt": tiny_kogpt,
    "t5": tiny_t5,
}


def registered_families() -> dict[str, Family]:
    from ftx_triton.plugins import load_host

    host = load_host()
    return {name: host.family(name) for name in host.families if name in BUILDERS}


def convert(family: Family, src: Path, out: Path, tp: int, weight_dtype: str = "fp32") -> Path:
    """``out/<tp>-gpu`` converted from ``src``."""
    return convert_directory(family, src, out, tp=tp, weight_dtype=weight_dtype).directory


def options(
    family: Family,
    ckpt: Path,
    tp: int,
    *,
    streaming: bool = False,
    max_batch_size: int = 8,
    data_type: str = "fp32",
    **choices: Any,
) -> Any:
    """FtModelOptions for the fastertransformer model of ``family`` (``choices``: more deployment options)."""
    from ftx_triton.repository.model_config import FtModelOptions

    return FtModelOptions.for_family(
        family, ckpt, tp, data_type=data_type, max_batch_size=max_batch_size, streaming=streaming, **choices
    )


def build_repository(src: Path, home: Path, family: str, tp: int, **settings: Any) -> Any:
    """Fetch → convert → tune → configure with the python runtime, in ``home`` (a ModelRepository)."""
    from ftx_triton.engine.pipeline import Pipeline
    from ftx_triton.plan.settings import RunSettings
    from ftx_triton.plugins import load_host
    from ftx_triton.store.artifact_store import ArtifactStore

    run = RunSettings.of(
        str(src), family=family, tp=tp, runtime="python", until="configure", accept_license=True, **settings
    )
    result = Pipeline(load_host(), ArtifactStore(home), run).run()
    assert result.repository is not None
    return result.repository


def ft_only_repository(repo: Path, family: Family, ckpt: Path, tp: int, **kwargs: Any) -> Path:
    """A repository holding only the python runtime's ``fastertransformer`` model."""
    from ftx_triton.runtime.python.repository import write_python_ft_model

    write_python_ft_model(repo / "fastertransformer", options(family, ckpt, tp, **kwargs), family)
    return repo


def reference_model(src: Path) -> Any:
    """The original checkpoint in transformers (what the server must agree with)."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(src)
    cls = getattr(transformers, config.architectures[0])
    return cls.from_pretrained(src).eval()


def tiny_sources(
    tmp_path_factory: pytest.TempPathFactory, families: Iterable[str], prefix: str
) -> dict[str, tuple[Path, Any]]:
    """Each family's tiny checkpoint (in a fresh ``<prefix>-<family>`` folder) and its model in transformers."""
    out = {}
    for name in families:
        src = BUILDERS[name](tmp_path_factory.mktemp(f"{prefix}-{name}") / "hf")
        out[name] = (src, reference_model(src))
    return out


def hf_greedy(model: Any, prompt: Sequence[int], max_new_tokens: int, **kwargs: Any) -> list[int]:
    """transformers' greedy generate on one prompt: decoder → prompt + new tokens; T5 → decoder tokens (no start)."""
    return _hf_generate(model, prompt, max_new_tokens, do_sample=False, **kwargs)


def hf_sampled(model: Any, prompt: Sequence[int], max_new_tokens: int, seed: int, **kwargs: Any) -> list[int]:
    """transformers' sampling generate on one prompt (like :func:`hf_greedy`), torch seeded with ``seed`` first
    as the python runtime seeds it."""
    import torch

    torch.manual_seed(seed)
    return _hf_generate(model, prompt, max_new_tokens, do_sample=True, **kwargs)


def _hf_generate(model: Any, prompt: Sequence[int], max_new_tokens: int, **kwargs: Any) -> list[int]:
    import torch

    ids = torch.tensor([list(prompt)])
    eos = kwargs.pop("eos_token_id", model.config.eos_token_id)
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            eos_token_id=eos,
            pad_token_id=eos,
            **kwargs,
        )[0].tolist()
    return out[1:] if model.config.is_encoder_decoder else out


def decoder_inputs(
    prompts: Sequence[Sequence[int]], output_len: int | Sequence[int], **extra: Any
) -> dict[str, np.ndarray]:
    """FT decoder inputs as FasterTransformer's identity client sends them (UINT32, right-padded)."""
    width = max(len(p) for p in prompts)
    ids = np.zeros((len(prompts), width), np.uint32)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = p
    lens = output_len if isinstance(output_len, Sequence) else [output_len] * len(prompts)
    inputs = {
        "input_ids": ids,
        "input_lengths": np.array([[len(p)] for p in prompts], np.uint32),
        "request_output_len": np.array([[n] for n in lens], np.uint32),
    }
    inputs.update(extra)
    return inputs


def t5_inputs(prompts: Sequence[Sequence[int]], max_output_len: int, **extra: Any) -> dict[str, np.ndarray]:
    width = max(len(p) for p in prompts)
    ids = np.zeros((len(prompts), width), np.uint32)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = p
    inputs = {
        "input_ids": ids,
        "sequence_length": np.array([[len(p)] for p in prompts], np.uint32),
        "max_output_len": np.array([[max_output_len]] * len(prompts), np.uint32),
    }
    inputs.update(extra)
    return inputs


def column(value: Any, batch: int, dtype: Any) -> np.ndarray:
    return np.full((batch, 1), value, dtype=dtype)


TRITON_TYPES = {
    np.dtype(np.uint32): "UINT32",
    np.dtype(np.int32): "INT32",
    np.dtype(np.float32): "FP32",
    np.dtype(np.uint64): "UINT64",
    np.dtype(np.bool_): "BOOL",
    np.dtype(np.int64): "INT64",
    np.dtype(np.object_): "BYTES",
}


def infer(
    url: str,
    inputs: Mapping[str, np.ndarray],
    model: str = "fastertransformer",
    outputs: Sequence[str] = ("output_ids", "sequence_length"),
    types: Mapping[str, str] | None = None,
) -> dict[str, np.ndarray]:
    """One HTTP request (client closed afterwards); raises InferenceServerException on an error response."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(url, network_timeout=300, connection_timeout=300)
    try:
        tensors = []
        for name, value in inputs.items():
            dtype = (types or {}).get(name) or TRITON_TYPES[np.asarray(value).dtype]
            tensor = httpclient.InferInput(name, list(np.shape(value)), dtype)
            tensor.set_data_from_numpy(np.asarray(value), binary_data=True)
            tensors.append(tensor)
        result = client.infer(model, tensors, outputs=[httpclient.InferRequestedOutput(n) for n in outputs])
        return {n: result.as_numpy(n) for n in outputs}
    finally:
        client.close()


def stream(
    url: str,
    inputs: Mapping[str, np.ndarray],
    model: str = "fastertransformer",
    outputs: Sequence[str] = ("output_ids", "sequence_length"),
    timeout_s: float = 120.0,
    on_response: Any = None,
) -> list[tuple[dict[str, np.ndarray], bool]]:
    """One gRPC streaming request: every response's outputs and final flag, in arrival order (``on_response()``
    is called as each arrives)."""
    import queue

    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    got: queue.Queue[Any] = queue.Queue()
    responses: list[tuple[dict[str, np.ndarray], bool]] = []
    try:
        client.start_stream(callback=lambda result, error: got.put((result, error)))
        tensors = []
        for name, value in inputs.items():
            tensor = grpcclient.InferInput(name, list(np.shape(value)), TRITON_TYPES[np.asarray(value).dtype])
            tensor.set_data_from_numpy(np.asarray(value))
            tensors.append(tensor)
        client.async_stream_infer(
            model,
            tensors,
            outputs=[grpcclient.InferRequestedOutput(n) for n in outputs],
            enable_empty_final_response=True,
        )
        while True:
            result, error = got.get(timeout=timeout_s)
            if error is not None:
                raise error
            final = result.get_response().parameters["triton_final_response"].bool_param
            data = {n: result.as_numpy(n) for n in outputs if result.as_numpy(n) is not None}
            responses.append((data, final))  # an empty final response would show as ({}, True)
            if on_response is not None:
                on_response()
            if final:
                return responses
    finally:
        client.stop_stream()
        client.close()


def own_ports() -> list[str]:
    """``ftx run`` arguments giving a deployment four free ports of its own (HTTP, gRPC, metrics, OpenAI): two
    deployments started at once by tests on different workers would otherwise both see Triton's 8000-8002 and
    the OpenAI endpoint's 9000 free, and the one that binds second would have to start again on new ports."""
    from ftx_triton.server.ports import free_ports, loopback_port

    while True:
        ports = free_ports()
        openai = loopback_port()
        if openai not in (ports.http, ports.grpc, ports.metrics):
            break
    return [
        *("--http-port", str(ports.http), "--grpc-port", str(ports.grpc)),
        *("--metrics-port", str(ports.metrics), "--openai-port", str(openai)),
    ]


FTX_COMMAND = str(Path(sys.executable).parent / "ftx")


@contextlib.contextmanager
def detached_run(home: Path, *args: str) -> Iterator[tuple[subprocess.CompletedProcess[str], dict[str, str]]]:
    """``ftx run ARGS --runtime python --detach`` on the CPU in FTX_HOME ``home``: its finished process (stdout
    holds the addresses) and the environment to call ftx with; ``ftx stop --all`` once the block ends."""
    env = {**os.environ, "FTX_HOME": str(home), "FTX_DEVICE": "cpu"}
    run = subprocess.run(
        [FTX_COMMAND, "run", *args, "--runtime", "python", "--detach"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    try:
        yield run, env
    finally:
        subprocess.run([FTX_COMMAND, "stop", "--all"], capture_output=True, timeout=120, env=env)


DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
"""An opener that never goes through a proxy the environment names (the servers are on 127.0.0.1)."""


def post_json(url: str, body: Any, timeout_s: float = 300) -> tuple[int, dict[str, str], str]:
    """POST ``body`` as JSON: the status, headers and text of the answer, an HTTP error's included."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with DIRECT.open(request, timeout=timeout_s) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


SERVER_MARKS = [
    pytest.mark.skipif(find_spec("pytriton") is None, reason="nvidia-pytriton is not installed"),
    pytest.mark.skipif(find_spec("torch") is None, reason="torch is not installed"),
]
"""Skips for tests that serve the python runtime on the real tritonserver."""


def family_tp_cases(families: Mapping[str, Family]) -> list[tuple[str, int]]:
    """Every registered family at tp 1 and 2."""
    return [(name, tp) for name in sorted(families) for tp in (1, 2)]
