"""The native FasterTransformer runtime on real GPUs (``-m gpu``; skipped without an NVIDIA GPU, never in CI).

For GPT-J, a KoGPT-shaped GPT-J, GPT-NeoX (parallel and sequential residual) and T5 (v1.0 relu, v1.1
gated-gelu): a tiny model, briefly trained on a few sentences so that greedy decoding is far from a
tie, is converted, tuned (gpt_gemm/t5_gemm), configured and served by ftx's pipeline with
``--runtime fastertransformer-native``; text goes in through the ensemble and the text that comes
out equals what ``transformers`` generates from the original checkpoint (same token ids through the
raw ``fastertransformer`` model too), at every tp in ``FTX_GPU_TPS`` (default: 1, and 2 when there
are two GPUs) and fp16 and bf16 compute (where FasterTransformer has the family in that type);
``FTX_GPU_CUSTOM_AR=on|off`` chooses FasterTransformer's custom all-reduce at tp > 1.

The backend is built once for the session from ``FTX_FT_SOURCES`` (or the pinned public archives).
FasterTransformer stops at end_id, so sequences are compared up to its sequence_length.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs an NVIDIA GPU (no nvidia-smi)"),
]

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time there was a small language model that wanted to grow.",
    "A tensor parallel model is split across several GPUs, and every rank holds a slice.",
    "Converting a checkpoint writes one binary file per tensor and rank.",
]
PROMPTS = ["The quick brown fox", "Once upon a time there", "A tensor parallel model is"]
NEW_TOKENS = 12
TRAIN_DEVICE = "cuda"
"""Where the tiny models are trained (a CPU smoke run of the builders sets "cpu")."""


def _gpu_count() -> int:
    from ftx_triton.runtime.fastertransformer.gpus import local_gpus

    return len(local_gpus())


def _tps() -> list[int]:
    text = os.environ.get("FTX_GPU_TPS")
    if text:
        return [int(t) for t in text.split(",") if t.strip()]
    return [1, 2] if _gpu_count() >= 2 else [1]


# --------------------------------------------------------------------------- tiny trained models


def _train_causal(model: Any, ids: list[list[int]], steps: int = 150) -> Any:
    import torch

    device = TRAIN_DEVICE
    model = model.to(device).train()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    width = max(len(r) for r in ids)
    batch = torch.tensor([r + [r[-1]] * (width - len(r)) for r in ids], device=device)
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in ids], device=device)
    labels = batch.masked_fill(mask == 0, -100)
    for _ in range(steps):
        loss = model(input_ids=batch, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval().to("cpu"), float(loss)


def _causal_model(kind: str, dest: Path) -> Path:
    import transformers
    from ftx_gptj.tiny import tiny_gptj
    from ftx_gptneox.tiny import tiny_gptneox
    from ftx_kogpt.tiny import tiny_kogpt
    from tokenizers import Tokenizer

    if kind == "gptj":
        tiny_gptj(dest, n_embd=128, n_head=4, rotary_dim=16, vocab_size=256, random_init=True, seed=3)
    elif kind == "kogpt":
        tiny_kogpt(dest, n_embd=128, rotary_dim=16, vocab_size=256)
    else:
        tiny_gptneox(
            dest,
            hidden_size=128,
            num_attention_heads=4,
            intermediate_size=512,
            use_parallel_residual=kind == "gptneox",
            random_init=True,
            seed=4,
        )
    tokenizer = Tokenizer.from_file(str(dest / "tokenizer.json"))
    model = transformers.AutoModelForCausalLM.from_pretrained(dest)
    ids = [tokenizer.encode(text).ids for text in CORPUS]
    model, loss = _train_causal(model, ids)
    model.save_pretrained(dest)
    (dest / "ftx-test-train.json").write_text(json.dumps({"loss": loss}))
    return dest


def _t5_model(kind: str, dest: Path) -> Path:
    import torch
    import transformers
    from ftx_t5.tiny import tiny_t5
    from python_runtime_support import T5_REFERENCES, T5_SENTENCES, train_t5_spiece

    processor = train_t5_spiece(dest)
    tiny_t5(
        dest,
        d_model=128,
        d_kv=32,
        num_heads=4,
        d_ff=256,
        gated=kind == "t5-v1_1",
        vocab_size=max(128, processor.GetPieceSize()),
        seed=5,
    )
    model = transformers.T5ForConditionalGeneration.from_pretrained(dest).to(TRAIN_DEVICE).train()
    src = [processor.EncodeAsIds(s) + [1] for s in T5_SENTENCES]
    tgt = [processor.EncodeAsIds(s) + [1] for s in T5_REFERENCES]

    def pad(rows: list[list[int]]) -> Any:
        return torch.tensor([r + [0] * (max(map(len, rows)) - len(r)) for r in rows], device=TRAIN_DEVICE)

    inputs, labels = pad(src), pad(tgt)
    labels = labels.masked_fill(labels == 0, -100)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(200):
        loss = model(input_ids=inputs, attention_mask=(inputs != 0).long(), labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval().to("cpu").save_pretrained(dest)
    return dest


MODELS = {
    "gptj": "gptj",
    "kogpt": "kogpt",
    "gptneox": "gptneox",
    "gptneox-sequential": "gptneox",
    "t5": "t5",
    "t5-v1_1": "t5",
}
"""Test case -> ftx family."""


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    torch.manual_seed(0)
    out = {}
    for case in MODELS:
        dest = tmp_path_factory.mktemp(f"hf-{case}") / "hf"
        out[case] = _t5_model(case, dest) if case.startswith("t5") else _causal_model(case, dest)
    return out


@pytest.fixture(scope="session")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(os.environ["FTX_HOME"]) if os.environ.get("FTX_HOME") else tmp_path_factory.mktemp("ftx-home")


@pytest.fixture(scope="session")
def built(home: Path) -> Any:
    """The backend for this machine's GPUs (built once; later sessions hit the store)."""
    from ftx_triton.plan.settings import RunSettings
    from ftx_triton.runtime.fastertransformer.native.options import NativeOptions, backend_for
    from ftx_triton.store.artifact_store import ArtifactStore

    options = NativeOptions.from_settings(RunSettings.of("x"))
    return backend_for(
        ArtifactStore(home),
        sm=options.sm,
        sources=options.sources,
        jobs=options.jobs,
        say=lambda text: print(text, flush=True),
        show_progress=False,
    )


def test_backend_build_is_cached_and_complete(built: Any, home: Path) -> None:
    from ftx_triton.plan.settings import RunSettings
    from ftx_triton.runtime.fastertransformer.native.options import NativeOptions, backend_for
    from ftx_triton.store.artifact_store import ArtifactStore

    options = NativeOptions.from_settings(RunSettings.of("x"))
    again = backend_for(ArtifactStore(home), sm=options.sm, sources=options.sources, show_progress=False)
    assert again.cached and again.key == built.key and again.path == built.path
    assert (built.backend_dir / "libtriton_fastertransformer.so").stat().st_size > 100_000
    assert (built.backend_dir / "libtransformer-shared.so").stat().st_size > 10_000_000  # every model's kernels
    for tool in ("gpt_gemm", "t5_gemm"):
        assert os.access(built.tool(tool), os.X_OK)


# --------------------------------------------------------------------------- several MPI ranks


def _serve_ids(checkpoint: Path, home: Path, built: Any, **flat: Any) -> tuple[list[list[int]], list[str], str]:
    """Serve the tiny GPT-J through ftx with ``flat`` settings; the raw model's ids and the ensemble's
    text for every prompt, and the server's log; the server is stopped after."""
    from ftx_triton.engine.pipeline import Pipeline
    from ftx_triton.plan.settings import RunSettings
    from ftx_triton.plugins import load_host
    from ftx_triton.store.artifact_store import ArtifactStore
    from python_runtime_support import decoder_inputs
    from tokenizers import Tokenizer

    settings = RunSettings.of(
        str(checkpoint),
        runtime="fastertransformer-native",
        data_type="fp16",
        family="gptj",
        max_batch_size=4,
        tune_batch=len(PROMPTS),
        tune_max_input_len=16,
        **flat,
    )
    result = Pipeline(load_host(), ArtifactStore(home), settings, say=lambda text: print(text, flush=True)).run()
    assert result.runtime is not None and result.endpoint is not None and result.endpoint.handle is not None
    log_path = result.endpoint.handle.log_path
    assert log_path is not None
    try:
        tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
        ids, texts = [], []
        for prompt in PROMPTS:
            out = _infer_json(result.endpoint.http_url, decoder_inputs([tokenizer.encode(prompt).ids], NEW_TOKENS))
            ids.append([int(t) for t in out["output_ids"][0, 0, : int(out["sequence_length"][0, 0])]])
            url = f"http://{result.endpoint.http_url}/v2/models/text/generate"
            texts.append(_post(url, {"text_input": prompt, "max_tokens": NEW_TOKENS})["text_output"])
        log_text = log_path.read_text(errors="replace")
    finally:
        result.runtime.stop(result.endpoint)
    return ids, texts, log_text


@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2)], ids=["tp2-over-2-ranks", "pp2-over-2-ranks"])
def test_two_mpi_ranks_on_one_host_equal_the_single_process_tp2_run(
    tp: int, pp: int, checkpoints: dict[str, Path], built: Any, home: Path, tmp_path: Path
) -> None:
    """The ``--hosts`` path for real: a hosts file naming localhost twice makes ftx start tritonserver as
    two MPI ranks (mpirun, one GPU each, no ssh), split as tp=2 or pp=2 across the two "nodes"; the
    generated ids and text equal one process serving tp=2 on both GPUs."""
    if _gpu_count() < 2:
        pytest.skip("needs two GPUs")
    reference = _serve_ids(checkpoints["gptj"], home, built, tp=2)
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost\nlocalhost\n")
    got = _serve_ids(checkpoints["gptj"], home, built, tp=tp, pp=pp, hosts=str(hosts), ready_timeout=240.0)
    assert "MPI rank 1 (local 1) on GPU(s) 1" in got[2] and "MPI rank 0 (local 0) on GPU(s) 0" in got[2], got[2][-3000:]
    assert got[0] == reference[0], (tp, pp, got[0], reference[0])
    assert got[1] == reference[1], (tp, pp, got[1], reference[1])
    assert all(len(ids) > len(PROMPTS[0].split()) for ids in got[0])


# --------------------------------------------------------------------------- serving through ftx


@dataclass
class Served:
    case: str
    tp: int
    dtype: str
    endpoint: Any
    repository: Path
    source: Path
    gemm: Any


def _dtypes() -> list[str]:
    text = os.environ.get("FTX_GPU_DTYPES", "fp16,bf16")
    return [t.strip() for t in text.split(",") if t.strip()]


def _custom_all_reduce() -> bool | None:
    """FTX_GPU_CUSTOM_AR=on/off: FasterTransformer's custom all-reduce at tp > 1 (unset: ftx's default)."""
    return {"on": True, "off": False}.get(os.environ.get("FTX_GPU_CUSTOM_AR", "").strip().lower())


def _cases() -> list[tuple[str, int, str]]:
    """Every family at the first tp and dtype first, so a run cut short has covered the families."""
    return [(case, tp, dtype) for dtype in _dtypes() for tp in _tps() for case in MODELS]


@pytest.fixture(scope="module", params=_cases(), ids=[f"{c}-tp{tp}-{d}" for c, tp, d in _cases()])
def served(request: pytest.FixtureRequest, checkpoints: dict[str, Path], built: Any, home: Path) -> Iterator[Served]:
    from ftx_triton.engine.pipeline import Pipeline
    from ftx_triton.plan.settings import RunSettings
    from ftx_triton.plugins import load_host
    from ftx_triton.store.artifact_store import ArtifactStore

    case, tp, dtype = request.param
    host = load_host()
    family = host.family(MODELS[case])
    if dtype not in family.data_types:
        pytest.skip(f"FasterTransformer has no {dtype} {family.name} (the family computes in {family.data_types})")
    if tp > _gpu_count():
        pytest.skip(f"tp {tp} needs {tp} GPUs")
    # under numpy 2 the server's Python stubs run in ftx's numpy-1 side environment (FTX_STUB_NUMPY: the wheel)
    settings = RunSettings.of(
        str(checkpoints[case]),
        runtime="fastertransformer-native",
        tp=tp,
        data_type=dtype,
        family=family.name,
        max_batch_size=4,
        tune_batch=len(PROMPTS),
        tune_max_input_len=16,
        accept_license=True,
        custom_all_reduce=_custom_all_reduce(),
    )
    result = Pipeline(host, ArtifactStore(home), settings, say=lambda text: print(text, flush=True)).run()
    assert result.runtime is not None and result.runtime.name == "fastertransformer-native"
    assert result.gemm is not None and result.gemm.tuned, result.gemm
    assert result.endpoint is not None and result.repository is not None
    try:
        yield Served(case, tp, dtype, result.endpoint, result.repository.path, checkpoints[case], result.gemm)
    finally:
        result.runtime.stop(result.endpoint)


def _post(url: str, payload: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:  # the server's reason, not only the status
        raise AssertionError(f"{url}: HTTP {exc.code}: {exc.read().decode(errors='replace')[:2000]}") from exc


def _processors(repository: Path) -> tuple[Any, Any]:
    from ftx_triton.repository import textproc
    from ftx_triton.repository.model_config import parse_config

    out = []
    for role in ("preprocessing", "postprocessing"):
        config = parse_config(repository / role / "config.pbtxt")
        params = {k: v.string_value for k, v in config.parameters.items()}
        out.append(textproc.build_processor(role, repository / role / "1", params, config.max_batch_size))
    return out[0], out[1]


def _reference(served: Served, prompt: str) -> tuple[list[int], list[int], str]:
    """(prompt ids, transformers' generated ids, their text) with ftx's own tokenization on both sides."""
    import torch
    import transformers

    pre, post = _processors(served.repository)
    encoded = pre.run(
        {
            "text_input": np.array([[prompt.encode()]], dtype=object),
            "max_tokens": np.array([[NEW_TOKENS]], dtype=np.int32),
        }
    )
    n = int(encoded["REQUEST_INPUT_LEN"][0, 0])
    ids = [int(t) for t in encoded["INPUT_ID"][0, :n]]
    config = transformers.AutoConfig.from_pretrained(served.source)
    model = getattr(transformers, config.architectures[0]).from_pretrained(served.source).eval()
    end_id = post.settings.end_id if hasattr(post, "settings") else config.eos_token_id
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, n, dtype=torch.long),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            eos_token_id=end_id,
            pad_token_id=end_id,
        )[0].tolist()
    generated = out[1:] if config.is_encoder_decoder else out[n:]
    if end_id in generated:
        generated = generated[: generated.index(end_id)]
    if config.is_encoder_decoder:
        row = np.array([[generated + [end_id]]], dtype=np.int32)
        text = post.texts(row, np.array([[len(generated)]]), None)[0][0]
    else:
        row = np.array([[ids + generated]], dtype=np.uint32)
        text = post.texts(row, np.array([[n + len(generated)]]), np.array([[n]]))[0][0]
    return ids, generated, text


def test_text_through_the_ensemble_equals_transformers(served: Served) -> None:
    url = f"http://{served.endpoint.http_url}/v2/models/text/generate"
    for prompt in PROMPTS:
        got = _post(url, {"text_input": prompt, "max_tokens": NEW_TOKENS})["text_output"]
        _, generated, expected = _reference(served, prompt)
        assert generated, f"transformers generated nothing for {prompt!r}"
        assert got == expected, (served.case, served.tp, served.dtype, prompt, got, expected, generated)


def _infer_json(http_url: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One request to the raw fastertransformer model through Triton's JSON API (UINT32 inputs)."""
    payload = {
        "inputs": [
            {"name": k, "shape": list(v.shape), "datatype": "UINT32", "data": v.flatten().tolist()}
            for k, v in inputs.items()
        ],
        "outputs": [{"name": "output_ids"}, {"name": "sequence_length"}],
    }
    answer = _post(f"http://{http_url}/v2/models/fastertransformer/infer", payload)
    return {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in answer["outputs"]}


def test_token_ids_of_the_raw_model_equal_transformers(served: Served) -> None:
    from python_runtime_support import decoder_inputs, t5_inputs

    encoder_decoder = served.case.startswith("t5")
    for prompt in PROMPTS:
        ids, generated, _ = _reference(served, prompt)
        inputs = t5_inputs([ids], NEW_TOKENS) if encoder_decoder else decoder_inputs([ids], NEW_TOKENS)
        out = _infer_json(served.endpoint.http_url, inputs)
        length = int(out["sequence_length"][0, 0])
        tokens = [int(t) for t in out["output_ids"][0, 0, :length]]
        got = tokens if encoder_decoder else tokens[len(ids) :]
        assert got[: len(generated)] == generated, (served.case, served.tp, served.dtype, prompt, got, generated)


def _teacher_forced(served: Served, prompt: list[int], generated: list[int]) -> list[float]:
    """transformers' fp32 log-softmax of each generated token, the sequence fed back through the source model."""
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(served.source)
    model = getattr(transformers, config.architectures[0]).from_pretrained(served.source).eval()
    with torch.inference_mode():
        if config.is_encoder_decoder:
            decoder = torch.tensor([[config.decoder_start_token_id, *generated]])
            steps = model(input_ids=torch.tensor([prompt]), decoder_input_ids=decoder).logits[0].float().log_softmax(-1)
            return [float(steps[i, t]) for i, t in enumerate(generated)]
        steps = model(torch.tensor([prompt + generated])).logits[0].float().log_softmax(-1)
        return [float(steps[len(prompt) + i - 1, t]) for i, t in enumerate(generated)]


LOG_PROB_TOLERANCE = {"fp16": 0.05, "bf16": 0.15}
"""Per-token log-probability tolerance against transformers' fp32 (the GPU computes in the served dtype)."""


def test_log_probs_equal_transformers(served: Served) -> None:
    """#36 on FasterTransformer: the raw model's cum_log_probs under greedy decoding (its top-k 1 answers
    output_log_probs of 0, the chosen token renormalized among one) and the text model's per-token log
    probabilities when asked for them (decoded through a tiny nucleus) equal transformers' log-softmax."""
    encoder_decoder = served.case.startswith("t5")
    tolerance = LOG_PROB_TOLERANCE.get(served.dtype, 0.05)
    for prompt in PROMPTS:
        ids, generated, _ = _reference(served, prompt)
        expected = _teacher_forced(served, ids, generated)
        inputs = t5_or_decoder_inputs(ids, encoder_decoder)
        payload = {
            "inputs": [
                *(
                    {"name": k, "shape": list(v.shape), "datatype": "UINT32", "data": v.flatten().tolist()}
                    for k, v in inputs.items()
                ),
                {"name": "is_return_log_probs", "shape": [1, 1], "datatype": "BOOL", "data": [True]},
            ],
            "outputs": [{"name": "output_ids"}, {"name": "sequence_length"}, {"name": "cum_log_probs"}],
        }
        answer = _post(f"http://{served.endpoint.http_url}/v2/models/fastertransformer/infer", payload)
        out = {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in answer["outputs"]}
        cumulative = float(out["cum_log_probs"][0, 0])
        assert abs(cumulative - sum(expected)) <= tolerance * len(expected), (served.case, prompt, cumulative)
        text = _post(
            f"http://{served.endpoint.http_url}/v2/models/text/generate",
            {"text_input": prompt, "max_tokens": NEW_TOKENS, "logprobs": True},
        )
        got_ids = [int(t) for t in np.atleast_1d(text["output_token_ids"]) if int(t) >= 0]
        assert got_ids[: len(generated)] == generated, (served.case, prompt, got_ids, generated)
        got = np.atleast_1d(np.asarray(text["output_token_log_probs"], np.float64))[: len(expected)]
        assert np.allclose(got, expected, atol=tolerance), (served.case, served.dtype, prompt, got, expected)


def test_beam_search_equals_transformers(served: Served) -> None:
    """#36 on FasterTransformer: beam width 3 through the raw model; the best beam equals transformers'
    generate(num_beams=3) (length penalty 0, no early stop, as FT's beam search runs) and every beam is
    answered ([batch, beam, length])."""
    import torch
    import transformers

    encoder_decoder = served.case.startswith("t5")
    config = transformers.AutoConfig.from_pretrained(served.source)
    model = getattr(transformers, config.architectures[0]).from_pretrained(served.source).eval()
    for prompt in PROMPTS:
        ids, _generated, _ = _reference(served, prompt)
        with torch.no_grad():
            beams = model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=NEW_TOKENS,
                num_beams=3,
                num_return_sequences=3,
                do_sample=False,
                length_penalty=0.0,
                early_stopping=False,
                eos_token_id=config.eos_token_id,
                pad_token_id=config.eos_token_id,
            ).tolist()
        best = beams[0][1:] if encoder_decoder else beams[0][len(ids) :]
        best = best[: best.index(config.eos_token_id)] if config.eos_token_id in best else best
        inputs = t5_or_decoder_inputs(ids, encoder_decoder)
        payload = {
            "inputs": [
                *(
                    {"name": k, "shape": list(v.shape), "datatype": "UINT32", "data": v.flatten().tolist()}
                    for k, v in inputs.items()
                ),
                {"name": "beam_width", "shape": [1, 1], "datatype": "UINT32", "data": [3]},
            ],
            "outputs": [{"name": "output_ids"}, {"name": "sequence_length"}],
        }
        answer = _post(f"http://{served.endpoint.http_url}/v2/models/fastertransformer/infer", payload)
        out = {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in answer["outputs"]}
        assert out["output_ids"].shape[:2] == (1, 3)
        tokens = [int(t) for t in out["output_ids"][0, 0, : int(out["sequence_length"][0, 0])]]
        got = tokens if encoder_decoder else tokens[len(ids) :]
        got = got[: got.index(config.eos_token_id)] if config.eos_token_id in got else got
        assert got == best, (served.case, served.tp, served.dtype, prompt, got, best)


def t5_or_decoder_inputs(ids: list[int], encoder_decoder: bool) -> dict[str, np.ndarray]:
    from python_runtime_support import decoder_inputs, t5_inputs

    return t5_inputs([ids], NEW_TOKENS) if encoder_decoder else decoder_inputs([ids], NEW_TOKENS)


def test_the_server_loaded_the_tuned_gemm_config(served: Served) -> None:
    """ftx placed gemm_config.in in the server's working directory and FasterTransformer read it."""
    server = served.endpoint.handle
    assert (server.cwd / "gemm_config.in").read_bytes() == Path(served.gemm.path).read_bytes()
    assert "gemm_config.in is not found" not in server.log_path.read_text(errors="replace")


def test_each_gpu_logged_its_weight_loading_through_the_loader_that_fits_the_files(served: Served) -> None:
    """ftx's backend logs every GPU's weight loading (files, GB, seconds, GB/s); files written in the served dtype
    take the pinned loader, files of another dtype upstream's (and the model still equals transformers: the tests
    above)."""
    import configparser

    from ftx_triton.repository.model_config import FT_MODEL_NAME, parameter, parse_config
    from ftx_triton.runtime.fastertransformer.native.weight_load import weight_loads

    config = parse_config(served.repository / FT_MODEL_NAME / "config.pbtxt")
    ini = configparser.ConfigParser()
    ini.read(Path(parameter(config, "model_checkpoint_path") or "") / "config.ini")
    file_dtypes = {ini[s]["weight_data_type"] for s in ini.sections() if "weight_data_type" in ini[s]}
    expected = "pinned" if file_dtypes == {parameter(config, "data_type")} else "upstream"
    loads = weight_loads(served.endpoint.handle.log_path.read_text(errors="replace"))
    assert sorted(load.rank for load in loads) == list(range(served.tp)), loads
    for load in loads:
        assert load.loader == expected and load.files > 0 and load.bytes > 0, (file_dtypes, load)
        assert 0 <= load.seconds <= load.total_s, load


def test_gptjs_decoding_step_was_replayed_from_a_cuda_graph_when_asked(served: Served) -> None:
    """FTX_FT_CUDA_GRAPH=1 in the suite's environment (the server inherits it): GPT-J's greedy requests above
    (beam width 1, 12 new tokens) captured the decoder step on every rank, and no capture failed (a failure
    decodes eagerly and says so); the ids equal transformers' in the tests above all the same."""
    if os.environ.get("FTX_FT_CUDA_GRAPH") != "1" or MODELS[served.case] != "gptj":
        pytest.skip("FTX_FT_CUDA_GRAPH=1 with a GPT-J case only")
    log = served.endpoint.handle.log_path.read_text(errors="replace")
    assert "could not be captured in a CUDA graph" not in log, log[-3000:]
    assert log.count("ftx: decoding step captured in a CUDA graph") == served.tp, log[-3000:]


# --------------------------------------------------------------------------- fastertransformer_backend's interface


def _stream_texts(url: str, payload: dict[str, Any]) -> list[str]:
    """Every ``text_output`` of one ``generate_stream`` request (server-sent events), within 120 s."""
    from python_runtime_support import post_json

    status, _headers, body = post_json(url, payload, timeout_s=120)
    assert status == 200, body[:2000]
    events = [json.loads(line[len("data: ") :]) for line in body.splitlines() if line.startswith("data: ")]
    assert events and not any("error" in e for e in events), body[:2000]
    return [str(e["text_output"]) for e in events if "text_output" in e]


@pytest.mark.parametrize("tp", _tps())
def test_streamed_text_through_the_ensemble_in_fp16_equals_transformers_without_the_cuda_graph(
    tp: int, checkpoints: dict[str, Path], built: Any, home: Path
) -> None:
    """``--streaming``, GPT-J in fp16 (where the CUDA graph is on by default when not streaming): what ``text``
    streams through the ensemble joins into the text transformers generates, for every prompt, and no rank
    captured a graph. With the graph on, every streamed request hung after its third response (tp 2, custom
    all-reduce, also with the streaming rank kept eager) or ended the server (tp 4); ftx serves a streaming
    deployment with ``FTX_FT_CUDA_GRAPH=0``."""
    from ftx_triton.engine.pipeline import Pipeline
    from ftx_triton.plan.settings import RunSettings
    from ftx_triton.plugins import load_host
    from ftx_triton.store.artifact_store import ArtifactStore

    if tp > _gpu_count():
        pytest.skip(f"tp {tp} needs {tp} GPUs")
    settings = RunSettings.of(
        str(checkpoints["gptj"]),
        runtime="fastertransformer-native",
        tp=tp,
        data_type="fp16",
        family="gptj",
        max_batch_size=4,
        tune_batch=len(PROMPTS),
        tune_max_input_len=16,
        streaming=True,
        custom_all_reduce=_custom_all_reduce(),
    )
    result = Pipeline(load_host(), ArtifactStore(home), settings, say=lambda text: print(text, flush=True)).run()
    assert result.runtime is not None and result.endpoint is not None and result.repository is not None
    served = Served("gptj", tp, "fp16", result.endpoint, result.repository.path, checkpoints["gptj"], result.gemm)
    try:
        url = f"http://{result.endpoint.http_url}/v2/models/text/generate_stream"
        for prompt in PROMPTS:
            texts = _stream_texts(url, {"text_input": prompt, "max_tokens": NEW_TOKENS, "stream": True})
            _, generated, expected = _reference(served, prompt)
            assert generated, f"transformers generated nothing for {prompt!r}"
            assert "".join(texts) == expected, (tp, prompt, texts, expected, generated)
        handle = result.endpoint.handle
        log_path = handle.log_path if handle is not None else None
        log_text = log_path.read_text(errors="replace") if log_path is not None else ""
        assert "captured in a CUDA graph" not in log_text, log_text[-3000:]
    finally:
        result.runtime.stop(result.endpoint)


def _tensor(name: str, value: np.ndarray) -> dict[str, Any]:
    from tritonclient.utils import np_to_triton_dtype

    data = [v.decode() if isinstance(v, bytes) else v for v in value.flatten().tolist()]
    return {"name": name, "shape": list(value.shape), "datatype": np_to_triton_dtype(value.dtype), "data": data}


def _infer(http_url: str, model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One request through Triton's JSON API with the dtypes the arrays have (as tritonclient sends them)."""
    answer = _post(f"http://{http_url}/v2/models/{model}/infer", {"inputs": [_tensor(k, v) for k, v in inputs.items()]})
    from tritonclient.utils import triton_to_np_dtype

    return {
        o["name"]: np.array(o["data"], dtype=triton_to_np_dtype(o["datatype"])).reshape(o["shape"])
        for o in answer["outputs"]
    }


def _upstream_expected(served: Served) -> list[str]:
    """Each prompt's whole sequence as upstream's postprocessing decodes it (prompt + generation for
    decoder models, the generation for T5), from transformers' ids."""
    _, post = _processors(served.repository)
    texts = []
    for prompt in PROMPTS:
        ids, generated, _ = _reference(served, prompt)
        texts.append(post.codec.decode(generated if served.case.startswith("t5") else ids + generated))
    return texts


def _greedy_sampling(batch: int) -> dict[str, np.ndarray]:
    """fastertransformer_backend's sampling inputs for greedy decoding (top-k 1, one beam, seed 0), one row a
    prompt."""
    ones = np.ones((batch, 1))
    return {
        "runtime_top_k": ones.astype(np.uint32),
        "runtime_top_p": 0 * ones.astype(np.float32),
        "temperature": ones.astype(np.float32),
        "len_penalty": ones.astype(np.float32),
        "repetition_penalty": ones.astype(np.float32),
        "beam_width": ones.astype(np.uint32),
        "random_seed": 0 * ones.astype(np.uint64),
        "is_return_log_probs": ones.astype(bool),
    }


def _assert_one_starts_the_other(served: Served, got: list[str], expected: list[str]) -> None:
    """Each prompt's text starts the expected one or the other way round (a length cut either side)."""
    for text, want, prompt in zip(got, expected, PROMPTS, strict=True):
        assert text.startswith(want) or want.startswith(text), (
            served.case,
            served.tp,
            served.dtype,
            prompt,
            text,
            want,
        )


def test_upstream_ensemble_request_equals_transformers(served: Served) -> None:
    """fastertransformer_backend's ``ensemble`` interface (sample_request_ensemble.json's tensors):
    INPUT_0..INPUT_3 and greedy sampling inputs in, OUTPUT_0 out."""
    batch = len(PROMPTS)
    ones = np.ones((batch, 1))
    inputs = {
        "INPUT_0": np.array([[p.encode()] for p in PROMPTS], dtype=object),
        "INPUT_1": (NEW_TOKENS * ones).astype(np.uint32),
        "INPUT_2": np.array([[b""]] * batch, dtype=object),
        "INPUT_3": np.array([[b""]] * batch, dtype=object),
        **_greedy_sampling(batch),
    }
    out = _infer(served.endpoint.http_url, "ensemble", inputs)
    assert {"OUTPUT_0", "sequence_length", "cum_log_probs", "output_log_probs"} <= set(out)
    got = [row[0] for row in out["OUTPUT_0"].tolist()]
    expected = _upstream_expected(served)
    _assert_one_starts_the_other(served, got, expected)
    for text, want, prompt in zip(got, expected, PROMPTS, strict=True):
        assert len(text) >= len(want) - 1, (served.case, prompt, text, want)


def test_end_to_end_sequence_preprocessing_fastertransformer_postprocessing(served: Served) -> None:
    """end_to_end_test.py's sequence: preprocessing, then the raw model, then postprocessing, each by
    fastertransformer_backend's tensor names; the text equals transformers' ids decoded."""
    batch = len(PROMPTS)
    ones = np.ones((batch, 1))
    pre = _infer(
        served.endpoint.http_url,
        "preprocessing",
        {
            "QUERY": np.array([[p.encode()] for p in PROMPTS], dtype=object),
            "BAD_WORDS_DICT": np.array([[b""]] * batch, dtype=object),
            "STOP_WORDS_DICT": np.array([[b""]] * batch, dtype=object),
            "REQUEST_OUTPUT_LEN": (NEW_TOKENS * ones).astype(np.uint32),
        },
    )
    t5 = served.case.startswith("t5")
    lengths = {
        "sequence_length" if t5 else "input_lengths": pre["REQUEST_INPUT_LEN"].astype(np.uint32),
        "max_output_len" if t5 else "request_output_len": pre["REQUEST_OUTPUT_LEN"].astype(np.uint32),
    }
    ft = _infer(
        served.endpoint.http_url,
        "fastertransformer",
        {
            "input_ids": pre["INPUT_ID"].astype(np.uint32),
            **lengths,
            **_greedy_sampling(batch),
            "bad_words_list": pre["BAD_WORDS_IDS"].astype(np.int32),
            "stop_words_list": pre["STOP_WORDS_IDS"].astype(np.int32),
        },
    )
    tokens_dtype = np.int32 if t5 else np.uint32
    post = _infer(
        served.endpoint.http_url,
        "postprocessing",
        {"TOKENS_BATCH": ft["output_ids"].astype(tokens_dtype), "sequence_length": ft["sequence_length"]},
    )  # in the dtype the model declares
    got = [row[0] for row in post["OUTPUT"].reshape(batch, -1).tolist()]
    _assert_one_starts_the_other(served, got, _upstream_expected(served))


# --------------------------------------------------------------------------- embeddings (T5-Encoder)


@pytest.mark.parametrize("case", ["t5", "t5-v1_1"])
@pytest.mark.parametrize("dtype", _dtypes())
def test_embeddings_through_the_backends_t5_encoder_equal_transformers(
    case: str, dtype: str, checkpoints: dict[str, Path], built: Any, home: Path
) -> None:
    """``--embeddings`` at tp 1: the repository's ``encoder`` model is FasterTransformer's ``T5-Encoder`` over
    the same converted files; what ``/v1/embeddings`` computes from it (the endpoint's own client: padded ids
    and lengths to Triton, mean-pooled here) equals transformers' T5EncoderModel mean-pooled over the same
    tokens, within the compute type's tolerance, and an input alone equals it in a padded batch."""
    import torch
    import transformers
    from ftx_triton.engine.pipeline import Pipeline
    from ftx_triton.openai_api.embeddings import Embeddings
    from ftx_triton.plan.settings import RunSettings
    from ftx_triton.plugins import load_host
    from ftx_triton.repository import textproc
    from ftx_triton.repository.model_config import parameter, parse_config
    from ftx_triton.store.artifact_store import ArtifactStore
    from python_runtime_support import T5_SENTENCES

    settings = RunSettings.of(
        str(checkpoints[case]),
        runtime="fastertransformer-native",
        tp=1,
        data_type=dtype,
        family="t5",
        max_batch_size=4,
        tune_batch=4,
        tune_max_input_len=32,
        embeddings=True,
    )
    result = Pipeline(load_host(), ArtifactStore(home), settings, say=lambda text: print(text, flush=True)).run()
    assert result.endpoint is not None and result.repository is not None and result.runtime is not None
    try:
        config = parse_config(result.repository.path / "encoder" / "config.pbtxt")
        assert config.backend == "fastertransformer" and parameter(config, "model_type") == "T5-Encoder"
        codec = textproc.load_codec(result.repository.path / "preprocessing" / "1")
        texts = (T5_SENTENCES[0], "Hello", f"{T5_SENTENCES[2]} {T5_SENTENCES[3]}")
        batch = [codec.encode(text, prompt=True) for text in texts]
        assert len({len(ids) for ids in batch}) > 1, "the inputs must differ in length to test the padding"
        encoder = Embeddings(result.repository.path, result.endpoint.grpc_url).encoder()
        got = np.array(encoder.embed(batch), dtype=np.float32)
        alone = np.array(encoder.embed(batch[1:2]), dtype=np.float32)
    finally:
        result.runtime.stop(result.endpoint)
    model = transformers.T5EncoderModel.from_pretrained(checkpoints[case]).eval()
    want = []
    with torch.inference_mode():
        for ids in batch:
            hidden = model(input_ids=torch.tensor([ids])).last_hidden_state[0]
            want.append(hidden.mean(dim=0).numpy())
    want_array = np.array(want, dtype=np.float32)
    scale = float(np.abs(want_array).max())
    tolerance = 2e-2 if dtype == "fp16" else 6e-2
    np.testing.assert_allclose(got, want_array, rtol=0, atol=tolerance * scale)
    cosine = (got * want_array).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want_array, axis=1)
    assert cosine.min() > 0.999, cosine
    np.testing.assert_allclose(alone[0], got[1], rtol=0, atol=tolerance * scale)
