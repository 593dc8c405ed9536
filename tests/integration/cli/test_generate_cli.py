"""The python runtime end to end: the whole repository (ensemble included) built by the pipeline,
served by the real tritonserver, driven through the ensemble's text interface, ``ftx generate``
and ``ftx run`` (prompt, detach, foreground with Ctrl-C / SIGTERM)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ftx_triton.cli.serving import resolve_target
from ftx_triton.client.generate import generate_answer, generate_text
from ftx_triton.client.text_client import sampling_values
from ftx_triton.errors import ServeError
from python_runtime_support import (
    SERVER_MARKS,
    build_repository,
    decoder_inputs,
    hf_greedy,
    infer,
    registered_families,
    t5_inputs,
    tiny_sources,
)
from triton_helpers import command_lines, home_shm_prefixes

pytestmark = SERVER_MARKS

FAMILIES = registered_families()
CASES = [(name, 1) for name in sorted(FAMILIES)] + [(name, 2) for name in ("gptj", "t5") if name in FAMILIES]
"""Every family at tp 1, and the pipeline's tp-2 repository for one decoder and the encoder-decoder: the
python runtime at tp 2 is checked token for token for every family by test_python_runtime_server, and
the ensemble around the model does not depend on tp (kogpt-tp2 and gptneox-tp2 proved the same path)."""
FTX = [str(Path(sys.executable).parent / "ftx")]
TEXT_PROMPTS = ("Once upon a time", "The quick brown fox", "Hello world")
RUN_TINY_GPTJ = ("run", "tiny-gptj", "--runtime", "python")
"""`ftx run` of the built-in demo model on the python runtime (the CPU here), before its other options."""


def _ftx(*args: str, env: Mapping[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``ftx ARGS...`` run to its end, its output captured as text; the exit code is the caller's to check."""
    return subprocess.run([*FTX, *args], check=False, capture_output=True, text=True, timeout=timeout, env=env)


def _no_ftx_servers_left(home: Path) -> None:
    """No tritonserver of this home runs and none of its Python-backend shared memory remains
    (other servers on this machine, e.g. of concurrent test runs, are not ours to judge)."""
    from ftx_triton.server.process_tree import SHM_DIR

    prefixes = home_shm_prefixes(home)
    assert prefixes, f"no server log under {home}"
    deadline = time.monotonic() + 15
    while True:
        procs = [text for text in command_lines() if "tritonserver" in text and str(home) in text]
        shm = [p.name for prefix in prefixes for p in SHM_DIR.glob(f"{prefix}*")]
        if not procs and not shm:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"left behind: processes {procs}, shared memory {shm}")
        time.sleep(0.2)


# --------------------------------------------------------------------------- repositories via the pipeline


class Deployment:
    def __init__(self, name: str, tp: int, src: Path, ref: Any, server: Any) -> None:
        self.name, self.tp, self.src, self.ref, self.server = name, tp, src, ref, server
        self.family = FAMILIES[name]
        self.encoder_decoder = self.family.triton_io == "encoder-decoder"

    def encode(self, text: str) -> list[int]:
        """The prompt ids the preprocessing model makes (the tokenizer the repository holds)."""
        from ftx_triton.repository.textproc import load_codec

        codec = load_codec(Path(self.server.repository) / "preprocessing" / "1")
        return codec.encode(text, prompt=True)

    def decode(self, ids: list[int]) -> str:
        from ftx_triton.repository.textproc import load_codec

        codec = load_codec(Path(self.server.repository) / "postprocessing" / "1")
        end = self.ref.config.eos_token_id
        # text_output keeps what the tokenizer makes of a last character whose bytes max_tokens cut off
        return codec.decode(ids[: ids.index(end)] if end in ids else ids)


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Any]]:
    return tiny_sources(tmp_path_factory, FAMILIES, "cli-src")


@pytest.fixture(scope="module", params=CASES, ids=[f"{n}-tp{tp}" for n, tp in CASES])
def deployment(
    request: pytest.FixtureRequest, sources: dict[str, tuple[Path, Any]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    from ftx_triton.server.tritonserver import TritonServer

    name, tp = request.param
    src, ref = sources[name]
    home = tmp_path_factory.mktemp(f"cli-home-{name}-{tp}")
    repository = build_repository(src, home, name, tp, max_batch_size=4)
    server = TritonServer(repository.path, home=home, env={"FTX_DEVICE": "cpu"}, name=f"e2e-{name}-{tp}")
    server.start()
    try:
        yield Deployment(name, tp, src, ref, server)
    finally:
        server.stop()
    _no_ftx_servers_left(home)


def test_repository_holds_the_python_runtime_model_with_ft_io(deployment: Deployment) -> None:
    from ftx_triton.repository.io import IO_KINDS
    from ftx_triton.repository.model_config import parse_config

    config = parse_config(Path(deployment.server.repository) / "fastertransformer" / "config.pbtxt")
    assert (config.name, config.backend) == ("fastertransformer", "python")
    inputs, outputs = IO_KINDS[deployment.family.triton_io]
    assert [i.name for i in config.input] == [d.name for d in inputs]
    assert [o.name for o in config.output] == [d.name for d in outputs]


def test_ensemble_and_raw_model_greedy_equal_transformers(deployment: Deployment) -> None:
    grpc = deployment.server.grpc_url
    for text in TEXT_PROMPTS:
        ids = deployment.encode(text)
        expected = hf_greedy(deployment.ref, ids, 12)
        generated = expected if deployment.encoder_decoder else expected[len(ids) :]
        # the raw fastertransformer model, token for token
        inputs = t5_inputs([ids], 12) if deployment.encoder_decoder else decoder_inputs([ids], 12)
        out = infer(deployment.server.http_url, inputs)
        assert out["output_ids"][0, 0, : out["sequence_length"][0, 0]].tolist() == expected
        # the ensemble's text interface: the text of exactly those tokens
        got = generate_text(grpc, "text", text, max_tokens=12)
        assert got == deployment.decode(generated), (deployment.name, text)
        # what `ftx generate` prints: a decoder continues the prompt, T5 answers it
        shown = generate_text(grpc, "text", text, max_tokens=12, echo_prompt=True)
        assert shown == (got if deployment.encoder_decoder else text + got)


def _teacher_forced_log_probs(deployment: Deployment, prompt: list[int], generated: list[int]) -> list[float]:
    """transformers' log-softmax of each generated token, the sequence fed back through the original model."""
    import torch

    model = deployment.ref
    with torch.inference_mode():
        if deployment.encoder_decoder:
            start = model.config.decoder_start_token_id
            decoder = torch.tensor([[start, *generated]])
            logits = model(input_ids=torch.tensor([prompt]), decoder_input_ids=decoder).logits[0]
            steps = logits.float().log_softmax(-1)
            return [float(steps[i, t]) for i, t in enumerate(generated)]
        logits = model(torch.tensor([prompt + generated])).logits[0].float().log_softmax(-1)
        return [float(logits[len(prompt) + i - 1, t]) for i, t in enumerate(generated)]


def test_text_model_gives_log_probs_beams_seeds_and_bans_like_transformers(deployment: Deployment) -> None:
    """#36 through the whole repository (text model over both protocols) for every family: the generated ids
    and their log probabilities (transformers' log-softmax within fp32 tolerance), beam search equal to
    generate(num_beams=3), a seed that repeats its text, and banned tokens that never appear."""
    http = f"http://{deployment.server.http_url}"
    text = TEXT_PROMPTS[0]
    prompt = deployment.encode(text)
    expected = hf_greedy(deployment.ref, prompt, 8)
    generated = expected if deployment.encoder_decoder else expected[len(prompt) :]
    end = deployment.ref.config.eos_token_id
    kept = generated[: generated.index(end)] if end in generated else generated
    for url, options in ((http, {}), (deployment.server.grpc_url, {"logprobs": True})):
        # asked for log probabilities, greedy decoding goes through a tiny nucleus (FT's top-k 1 answers 0)
        answer = generate_answer(url, "text", text, max_tokens=8, options=options)
        assert answer.token_ids == tuple(kept), url
        assert answer.log_probs is not None
        wanted = _teacher_forced_log_probs(deployment, prompt, kept)
        assert np.allclose(answer.log_probs, wanted, atol=1e-3), (url, answer.log_probs, wanted)
    beams = hf_greedy(deployment.ref, prompt, 8, num_beams=3, early_stopping=False, length_penalty=0.0)
    best = beams if deployment.encoder_decoder else beams[len(prompt) :]
    got = generate_answer(http, "text", text, max_tokens=8, options={"beam_width": 3})
    assert got.text == deployment.decode(best)
    sampled = {"seed": 17}
    first = generate_answer(deployment.server.grpc_url, "text", text, max_tokens=8, temperature=1.0, options=sampled)
    again = generate_answer(http, "text", text, max_tokens=8, temperature=1.0, options=sampled)
    assert first.token_ids == again.token_ids and first.text == again.text
    banned = sorted(set(kept[:2]))
    free = generate_answer(http, "text", text, max_tokens=8, options={"bad_token_ids": banned})
    assert free.token_ids and not set(free.token_ids) & set(banned)


def test_openai_endpoint_on_a_deployment_that_answers_whole(deployment: Deployment) -> None:
    """The OpenAI endpoint over a deployment without --streaming (every family, T5 included), through the
    official client: logprobs and usage from the text model's own ids, n with seeds, best_of."""
    openai = pytest.importorskip("openai")
    from ftx_triton.front.server import Front
    from ftx_triton.openai_api.app import make_app

    http = f"http://{deployment.server.http_url}"
    tokenizer = Path(deployment.server.repository) / "preprocessing" / "1"
    front = Front(make_app(http, "m", tokenizer), "127.0.0.1", 0)
    front.start()
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{front.port}/v1", api_key="none", max_retries=0)
        text = TEXT_PROMPTS[1]
        reference = generate_answer(http, "text", text, max_tokens=6, options={"logprobs": True})
        answer = client.completions.create(model="m", prompt=text, max_tokens=6, logprobs=0)
        choice = answer.choices[0]
        assert choice.text == reference.text and answer.usage.completion_tokens == len(reference.token_ids)
        assert np.allclose(choice.logprobs.token_logprobs, reference.log_probs, atol=1e-6)
        many = client.completions.create(model="m", prompt=text, max_tokens=6, temperature=1.0, seed=4, n=2)
        one = client.completions.create(model="m", prompt=text, max_tokens=6, temperature=1.0, seed=5)
        assert many.choices[1].text == one.choices[0].text
        best = client.completions.create(model="m", prompt=text, max_tokens=6, temperature=1.0, seed=4, best_of=2)
        assert best.choices[0].text in {c.text for c in many.choices} and len(best.choices) == 1
    finally:
        front.stop()


def test_malformed_ensemble_requests_get_errors_and_serving_continues(deployment: Deployment) -> None:
    from tritonclient.utils import InferenceServerException

    url = deployment.server.http_url

    def text_request(texts: list[str], max_tokens: Any, types: dict[str, str] | None = None) -> dict[str, Any]:
        n = len(texts)
        inputs = {
            "text_input": np.array([[t.encode()] for t in texts], dtype=np.object_),
            "max_tokens": np.array([[max_tokens]] * n, dtype=np.int64 if not types else np.float32),
        }
        return infer(url, inputs, model="text", outputs=("text_output",), types=types)

    good = text_request(["Once upon a time"], 6)["text_output"]
    bad = {
        "empty text": (lambda: text_request([""], 6), "empty"),
        "negative max_tokens": (lambda: text_request(["Hello"], -3), "max_tokens"),
        "huge max_tokens": (lambda: text_request(["Hello"], 2**31 - 1), "exceeds"),
        "wrong dtype": (lambda: text_request(["Hello"], 6.0, types={"max_tokens": "FP32"}), "data-type|datatype|FP32"),
        "batch over the max": (lambda: text_request(["Hello"] * 5, 6), "batch"),
    }
    for what, (call, message) in bad.items():
        with pytest.raises(InferenceServerException, match=message):
            call()
        assert np.array_equal(text_request(["Once upon a time"], 6)["text_output"], good), what


def test_curl_generate_endpoint_answers(deployment: Deployment) -> None:
    import urllib.request

    body = json.dumps({"text_input": "Hello world", "max_tokens": 5}).encode()
    request = urllib.request.Request(f"http://{deployment.server.http_url}/v2/models/text/generate", data=body)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=120) as response:
        answer = json.loads(response.read())
    assert answer["text_output"] == generate_text(deployment.server.grpc_url, "text", "Hello world", max_tokens=5)


# --------------------------------------------------------------------------- the client pieces


def test_a_temperature_alone_means_sampling_from_the_whole_distribution() -> None:
    assert sampling_values(8, 0.7, None, None)["top_p"] == 1.0
    assert sampling_values(8, 0.7, 5, None)["top_p"] is None
    assert sampling_values(8, None, None, None)["top_p"] is None


def test_resolve_target_without_servers_says_how_to_start_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTX_HOME", str(tmp_path))
    with pytest.raises(ServeError, match="no running ftx server") as err:
        resolve_target("ensemble", None)
    assert "--detach" in (err.value.hint or "")
    assert resolve_target("ensemble", "127.0.0.1:1") == ("127.0.0.1:1", "ensemble")


def test_generate_against_nothing_is_an_error_with_a_hint(tmp_path: Path) -> None:
    from ftx_triton.server.ports import free_ports

    port = free_ports().grpc
    env = {**os.environ, "FTX_HOME": str(tmp_path)}
    result = _ftx("generate", "text", "Hello", "--url", f"127.0.0.1:{port}", "--timeout", "5", env=env, timeout=120)
    assert result.returncode == 1
    assert "error: cannot reach" in result.stderr and "hint:" in result.stderr


@pytest.mark.parametrize(
    "argv, says",
    [
        (["Hello", "--url", "http://[::1"], "is not a server address"),  # an IPv6 bracket never closed
        (["Hello", "--url", "127.0.0.1:99999"], "is not a server address"),  # port out of range
        (["Hello", "--url", "http://:8000"], "is not a server address"),  # no host
        ([b"a\xff".decode("utf-8", "surrogateescape")], "not valid UTF-8"),  # bytes a terminal could not decode
    ],
    ids=["ipv6", "port", "no-host", "non-utf8"],
)
def test_generate_refuses_a_bad_url_or_prompt_with_a_usage_error(tmp_path: Path, argv: list[str], says: str) -> None:
    env = {**os.environ, "FTX_HOME": str(tmp_path), "PYTHONIOENCODING": "utf-8"}
    result = subprocess.run([*FTX, "generate", *argv], check=False, capture_output=True, timeout=120, env=env)
    stderr = result.stderr.decode(errors="replace")
    assert result.returncode == 2 and says in stderr and "Traceback" not in stderr, stderr


# --------------------------------------------------------------------------- ftx run, end to end


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "FTX_HOME": str(home), "FTX_DEVICE": "cpu"}


@pytest.fixture(scope="module")
def demo_home(tmp_path_factory: pytest.TempPathFactory, built_demo: Path) -> Path:
    """An FTX_HOME whose built-in tiny-gptj is already built (a copy of the session's build)."""
    from fetch_helpers import seed_demo

    home = tmp_path_factory.mktemp("demo-home")
    seed_demo(home, built_demo)
    return home


def test_ftx_run_with_a_prompt_prints_a_continuation_and_stops(demo_home: Path) -> None:
    started = time.monotonic()
    result = _ftx(
        *RUN_TINY_GPTJ, "--prompt", "Once upon a time", "--max-tokens", "12", env=_env(demo_home), timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "Once upon a time there was a small language model that wanted"
    # quiet by default: one summary line, no "try it" hints for the server it has already stopped
    summary = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(summary) <= 2 and summary[0].startswith("tiny-gptj: python runtime,"), result.stderr
    assert "-v shows every step" in summary[0]
    assert "ftx generate" not in result.stderr and "curl" not in result.stderr
    _no_ftx_servers_left(demo_home)
    print(f"ftx run --prompt (demo already built): {time.monotonic() - started:.1f} s")
    # the bytecode the stubs wrote beside the models is dropped on the next lookup, which reuses every stage
    # instead of finding the configure artifact changed
    verbose = _ftx(
        *RUN_TINY_GPTJ, "--prompt", "Once upon a time", "--max-tokens", "4", "-v", env=_env(demo_home), timeout=600
    )
    assert verbose.returncode == 0 and "convert   cached" in verbose.stderr, verbose.stderr[-3000:]
    assert "ftx generate" not in verbose.stderr  # the stopped server gets no hints even with -v
    again = _ftx(*RUN_TINY_GPTJ, "--until", "configure", "--log-format", "json", env=_env(demo_home), timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    events = [json.loads(line) for line in again.stderr.splitlines() if line.startswith("{")]
    assert not [e for e in events if e["event"] == "cache.corrupt"]
    assert {e["stage"] for e in events if e["event"] == "cache.hit"} >= {"convert", "configure"}
    assert not list((demo_home / "store").rglob("__pycache__"))


def test_a_detached_run_that_fails_after_its_server_started_leaves_nothing_running(demo_home: Path) -> None:
    """The OpenAI front cannot take its port (held here) after tritonserver is up: the run fails with
    error/hint and stops the server it started, instead of leaving one that `ftx stop` does not know."""
    env = _env(demo_home)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        run = _ftx(*RUN_TINY_GPTJ, "--detach", "--openai-port", str(held.getsockname()[1]), env=env, timeout=600)
    assert run.returncode == 1 and "error:" in run.stderr and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert "tritonserver ready" in run.stderr  # it failed after the server was up
    _no_ftx_servers_left(demo_home)
    ps = _ftx("ps", "--json", env=env, timeout=120)
    assert not [r for r in json.loads(ps.stdout or "[]") if r["alive"]]


@dataclass
class Detached:
    """A deployment `ftx run --detach` left running: what that command printed, and once its ``with`` block
    has ended, what `ftx stop` printed."""

    run: subprocess.CompletedProcess[str]
    stop: subprocess.CompletedProcess[str] | None = None


@contextlib.contextmanager
def _detached(env: Mapping[str, str], *options: str, stop: str = "--all") -> Iterator[Detached]:
    """`ftx run tiny-gptj --runtime python --detach OPTIONS...`, which must succeed; the block runs while it
    serves, and `ftx stop STOP` (every server of the home by default) follows however the block ends."""
    run = _ftx(*RUN_TINY_GPTJ, "--detach", *options, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    deployment = Detached(run)
    try:
        yield deployment
    finally:
        deployment.stop = _ftx("stop", stop, env=env, timeout=120)


def test_a_detached_json_run_prints_its_addresses_as_json_as_ps_does(demo_home: Path) -> None:
    """`ftx --log-format json run --detach` printed the human block on stdout; `ftx ps --json` gave each address
    twice (``http`` without a scheme beside ``http_url``); JSON lines said by ftx carried no timestamp."""
    env = _env(demo_home)
    run = _ftx("--log-format", "json", *RUN_TINY_GPTJ, "--detach", "--name", "jsoned", env=env, timeout=600)
    try:
        assert run.returncode == 0, run.stderr[-3000:]
        printed = json.loads(run.stdout)
        assert printed["name"] == "jsoned" and printed["runtime"] == "python" and printed["stop"] == "ftx stop jsoned"
        assert printed["http"].startswith("http://127.0.0.1:") and printed["grpc"].startswith("grpc://127.0.0.1:")
        assert printed["openai"].startswith("http://127.0.0.1:") and printed["openai"].endswith("/v1")
        events = [json.loads(line) for line in run.stderr.splitlines() if line.startswith("{")]
        assert any(e["event"] == "message" for e in events) and all("timestamp" in e for e in events)
        (row,) = [r for r in json.loads(_ftx("ps", "--json", env=env, timeout=120).stdout) if r["alive"]]
        assert {k: row[k] for k in ("name", "http", "grpc", "openai")} == {
            k: printed[k] for k in ("name", "http", "grpc", "openai")
        }
        assert "http_url" not in row and "grpc_url" not in row
    finally:
        _ftx("stop", "--all", env=env, timeout=120)


def test_detach_then_generate_ps_and_stop(demo_home: Path) -> None:
    env = _env(demo_home)
    with _detached(env, stop="tiny-gptj") as deployment:
        run = deployment.run
        assert "ftx stop tiny-gptj" in run.stdout and "curl -s http://127.0.0.1:" in run.stdout
        ps = _ftx("ps", "--json", env=env, timeout=120)
        records = json.loads(ps.stdout)
        assert [r["name"] for r in records if r["alive"]] == ["tiny-gptj"]
        plain = _ftx("generate", "text", "The quick brown", "--max-tokens", "6", env=env)
        assert plain.returncode == 0, plain.stderr
        assert plain.stdout.startswith("The quick brown fox jumps over")
        by_name = _ftx("generate", "tiny-gptj", "The quick brown", "--max-tokens", "6", "--stream", env=env)
        assert by_name.returncode == 0, by_name.stderr
        assert by_name.stdout.strip() == plain.stdout.strip()
        sampled = _ftx(
            "generate", "text", "Hello", "--max-tokens", "5", "--temperature", "0.8", "--top-k", "5", env=env
        )
        assert sampled.returncode == 0 and sampled.stdout.startswith("Hello"), sampled.stderr
        # MODEL omitted (the served ensemble), --url as `ftx run` prints it (HTTP), and --stream against a
        # model deployed without --streaming: the same text, and a note saying why it came whole
        http = re.search(r"HTTP\s+(http://\S+)", run.stdout).group(1)
        over_http = _ftx("generate", "The quick brown", "--max-tokens", "6", "--url", http, env=env)
        assert over_http.returncode == 0, over_http.stderr
        assert over_http.stdout == plain.stdout
        streamed = _ftx("generate", "The quick brown", "--max-tokens", "6", "--url", http, "--stream", env=env)
        assert streamed.returncode == 0 and streamed.stdout.strip() == plain.stdout.strip(), streamed.stderr
        assert "deployed without --streaming, so the text arrives whole" in streamed.stderr
        no_model = _ftx("generate", "The quick brown", "--max-tokens", "6", env=env)
        assert no_model.returncode == 0 and no_model.stdout == plain.stdout, no_model.stderr
        _check_generate_options(env, plain.stdout)
    stop = deployment.stop
    assert stop is not None  # set on the way out of the block
    assert stop.returncode == 0 and "stopped tiny-gptj" in stop.stdout, stop.stderr
    _no_ftx_servers_left(demo_home)


def _check_generate_options(env: Mapping[str, str], plain: str) -> None:
    """#36: `ftx generate --logprobs / --beam / --n / --seed / --ban` against a served deployment."""
    base = ("generate", "The quick brown", "--max-tokens", "6")
    scored = _ftx(*base, "--logprobs", env=env)
    assert scored.returncode == 0, scored.stderr
    text, table = scored.stdout.split("\n\n", 1)
    assert text + "\n" == plain
    rows = [line.split("\t") for line in table.strip().splitlines()]
    assert len(rows) == 6 and all(int(t) >= 0 and float(v) <= 0 for t, v in rows)
    beam = _ftx(*base, "--beam", "2", env=env)
    assert beam.returncode == 0 and beam.stdout.startswith("The quick brown"), beam.stderr
    seeded = _ftx(*base, "--temperature", "1", "--seed", "5", "--n", "2", env=env)
    assert seeded.returncode == 0, seeded.stderr
    assert "--- generation 1 of 2 (seed 5)" in seeded.stdout and "--- generation 2 of 2 (seed 6)" in seeded.stdout
    alone = _ftx(*base, "--temperature", "1", "--seed", "6", env=env)
    assert seeded.stdout.split("(seed 6)\n", 1)[1] == alone.stdout
    word = plain.removeprefix("The quick brown").split()[0]
    banned = _ftx(*base, "--ban", f" {word}", env=env)
    assert banned.returncode == 0 and f" {word}" not in banned.stdout.removeprefix("The quick brown"), banned.stdout
    refused = _ftx(*base, "--ban", "", env=env)
    assert refused.returncode != 0 and "empty word" in refused.stderr


def test_streaming_deployment_streams_tokens_through_the_ensemble(demo_home: Path) -> None:
    env = _env(demo_home)
    with _detached(env, "--streaming") as deployment:
        assert "generate_stream" in deployment.run.stdout and "--stream" in deployment.run.stdout
        from ftx_triton.server.records import list_servers

        record = next(r for r in list_servers(demo_home) if r.alive)
        pieces: list[str] = []
        text = generate_text(
            record.grpc_url, "text", "Once upon a time", max_tokens=8, stream=True, on_text=pieces.append
        )
        assert len(pieces) >= 8  # one piece per token (the first carries the prompt)
        assert text.startswith("Once upon a time there was")
        cli = _ftx("generate", "text", "Once upon a time", "--max-tokens", "8", "--stream", env=env)
        assert cli.returncode == 0 and cli.stdout.strip() == text.strip(), cli.stderr
        # without --stream a streaming deployment is read whole
        whole = _ftx("generate", "text", "Once upon a time", "--max-tokens", "8", env=env)
        assert whole.returncode == 0 and whole.stdout.strip() == text.strip(), whole.stderr
        assert generate_text(record.grpc_url, "text", "Once upon a time", max_tokens=8) == text.removeprefix(
            "Once upon a time"
        )
        over_http: list[str] = []  # the generate extension's server-sent events
        assert (
            generate_text(
                f"http://{record.http_url}",
                "text",
                "Once upon a time",
                max_tokens=8,
                stream=True,
                on_text=over_http.append,
            )
            == text
        )
        assert len(over_http) >= 8
    _no_ftx_servers_left(demo_home)


@contextlib.contextmanager
def _foreground_run(home: Path, *options: str) -> Iterator[tuple[subprocess.Popen[str], list[str]]]:
    """`ftx run tiny-gptj --runtime python OPTIONS...` in the foreground: yields the process and the lines it printed
    up to the one saying "Ctrl-C stops the server" (all of them if it ended first, or what came within 300 s); the
    process is killed on the way out if it still runs."""
    proc = subprocess.Popen(
        [*FTX, *RUN_TINY_GPTJ, *options], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(home)
    )
    try:
        lines: list[str] = []
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and (line := proc.stdout.readline()):
            lines.append(line)
            if "Ctrl-C stops the server" in line:
                break
        yield proc, lines
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_foreground_server_stops_cleanly_on_a_signal(demo_home: Path, sig: int) -> None:
    name = f"fg-{sig}"  # `ftx ps` names a foreground run by its --name (it said "(foreground)")
    with _foreground_run(demo_home, "--name", name) as (proc, lines):
        assert any("Ctrl-C stops the server" in line for line in lines), "".join(lines) + proc.stderr.read()
        grpc = re.search(r"gRPC\s+(\S+)", "".join(lines)).group(1)
        assert generate_text(grpc, "text", "Hello world", max_tokens=3).startswith(",")
        # `ftx generate` finds a foreground run as `ftx ps` does (it knew only detached ones), and `ftx ps`
        # shows its OpenAI endpoint (it showed "-")
        found = _ftx("generate", "Hello world", "--max-tokens", "3", env=_env(demo_home), timeout=120)
        assert found.returncode == 0 and found.stdout.startswith("Hello world,"), found.stderr
        ps = json.loads(_ftx("ps", "--json", env=_env(demo_home), timeout=120).stdout)
        openai_url = re.search(r"OpenAI\s+(\S+)", "".join(lines)).group(1)
        assert [(row["openai"], row["detached"]) for row in ps if row["name"] == name] == [(openai_url, False)]
        # a deployment without --streaming says so on a `stream: true` request instead of passing one chunk off
        # as a stream: a header and an SSE comment
        request = urllib.request.Request(
            f"{openai_url}/completions",
            method="POST",
            data=json.dumps({"prompt": "Hello world", "max_tokens": 3, "stream": True}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=120) as answer:
            assert answer.headers["X-Ftx-Stream"] == "whole"
            raw = answer.read().decode()
        assert raw.startswith(": this deployment answers in one piece") and "--streaming" in raw.split("\n")[0]
        assert "stream: true answers in one chunk" in "".join(lines)
        proc.send_signal(sig)
        code = proc.wait(timeout=60)
        err = proc.stderr.read()
    assert code == 0, err[-3000:]
    assert "stopped" in err
    assert not list((demo_home / "openai").glob("*.json"))  # the foreground's endpoint record went with it
    _no_ftx_servers_left(demo_home)


def test_foreground_server_whose_stub_dies_stops_with_the_cause(demo_home: Path) -> None:
    """#14.4/#14.6: a server that dies under `ftx run` (here: its model's stub is killed) is seen,
    reported with the cause from its log, and stopped with nothing left behind."""
    from ftx_triton.server.process_tree import stub_processes

    with _foreground_run(demo_home) as (proc, lines):
        log_line = next(line for line in lines if line.strip().startswith("log"))
        log_path = Path(log_line.split(None, 1)[1].strip())
        supervisor = _supervisor_pid(log_path)
        time.sleep(1.5)  # the supervisor looks at the stubs every 0.5 s
        next(p for p in stub_processes(supervisor) if "/fastertransformer/" in p.cmdline()[1]).kill()
        code = proc.wait(timeout=60)
        err = proc.stderr.read()
    assert code == 1, err[-3000:]
    assert "fastertransformer_0_0" in err and "SIGKILL" in err and "error:" in err
    _no_ftx_servers_left(demo_home)


def _supervisor_pid(log_path: Path) -> int:
    """The pid of the supervisor that writes ``log_path`` (the process whose stdout it is)."""
    import psutil

    for process in psutil.process_iter(["cmdline"]):
        args = process.info["cmdline"] or []
        if args[1:3] == ["-m", "ftx_triton.server.supervisor"]:
            with contextlib.suppress(psutil.Error):
                if any(f.path == str(log_path) for f in process.open_files()):
                    return process.pid
    raise AssertionError(f"no supervisor writes {log_path}")


@pytest.mark.parametrize(
    "body",
    [b"<html>not triton</html>", b"[1, 2]", b'{"error": null}'],
    ids=["html", "json-array", "json-object-without-models"],
)
@pytest.mark.parametrize("model", [[], ["ensemble"]], ids=["model-omitted", "model-named"])
def test_generate_against_a_server_that_is_not_triton(tmp_path: Path, body: bytes, model: list[str]) -> None:
    """Issue 27: `ftx generate --url` of a server that answers non-JSON crashed with a JSONDecodeError traceback."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class NotTriton(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer  # noqa: N815

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), NotTriton)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        env = {**os.environ, "FTX_HOME": str(tmp_path)}
        result = _ftx("generate", *model, "Hello", "--url", url, "--timeout", "10", env=env, timeout=120)
    finally:
        server.shutdown()
        server.server_close()
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 1, result.stderr
    assert "error: " in result.stderr and "hint:" in result.stderr
    if body.startswith(b"<"):
        assert "is not Triton's HTTP endpoint" in result.stderr and "<html>" in result.stderr


def test_deployment_names_long_taken_and_chosen(demo_home: Path, tmp_path: Path) -> None:
    """Issue 27: a 250-character checkpoint directory with --detach failed with "File name too long" (server
    names went whole into file names); a second `ftx run MODEL --detach` loaded a whole server before refusing
    the name, and no deployment could be named. Now a derived name is cut to 64 characters and numbered when
    taken, and `--name` picks one, refused before anything starts when a running server has it."""
    from fetch_helpers import demo_dir

    env = _env(demo_home)
    ckpt = shutil.copytree(demo_dir(demo_home), tmp_path / ("c" * 250))
    names: list[str] = []
    try:
        for _ in range(2):
            run = _ftx("run", str(ckpt), "--runtime", "python", "--detach", "--no-openai", env=env, timeout=600)
            assert run.returncode == 0, run.stderr[-3000:]
            names.append(re.search(r"left running as '([^']+)'", run.stdout).group(1))
        assert names == ["c" * 64, "c" * 62 + "-2"]
        started = time.monotonic()
        taken = _ftx(*RUN_TINY_GPTJ, "--detach", "--name", names[1], env=env, timeout=600)
        assert taken.returncode == 1 and f"a server named '{names[1]}' is already running" in taken.stderr
        assert "hint:" in taken.stderr and "tritonserver" not in taken.stderr and "fetch" not in taken.stderr
        print(f"taken --name refused in {time.monotonic() - started:.1f} s")
        bad = _ftx("run", "tiny-gptj", "--name", "a/../b", env=env, timeout=120)
        assert bad.returncode == 2 and "is not a name" in bad.stderr
        chosen = _ftx(*RUN_TINY_GPTJ, "--detach", "--no-openai", "--name", "demo.v1", env=env, timeout=600)
        assert chosen.returncode == 0 and "left running as 'demo.v1'" in chosen.stdout, chosen.stderr[-3000:]
        names.append("demo.v1")
        ps = _ftx("ps", "--json", env=env, timeout=120)
        assert sorted(r["name"] for r in json.loads(ps.stdout) if r["alive"]) == sorted(names)
    finally:
        _ftx("stop", "--all", env=env)
    _no_ftx_servers_left(demo_home)
