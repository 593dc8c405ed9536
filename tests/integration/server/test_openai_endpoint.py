"""The OpenAI-compatible endpoint `ftx run` starts beside Triton: real HTTP against the real
tritonserver serving the built-in tiny-gptj (streaming deployment, a tokenizer with a chat template)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
from ftx_triton.server.front_records import read_record, records_dir
from python_runtime_support import SERVER_MARKS, detached_run  # noqa: E402

pytestmark = SERVER_MARKS

FTX = [str(Path(sys.executable).parent / "ftx")]
TEMPLATE = (
    "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _post(url: str, body: Any, raw: bool = False, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers=headers or {"Content-Type": "application/json"})
    try:
        with _OPENER.open(request, timeout=300) as response:
            text = response.read().decode()
            return response.status, text if raw else json.loads(text)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read().decode())


def _events(text: str) -> list[Any]:
    return [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]


class Served:
    def __init__(self, home: Path, stdout: str) -> None:
        self.home = home
        self.openai = re.search(r"OpenAI\s+(http://\S+/v1)", stdout).group(1)
        self.http = re.search(r"HTTP\s+(http://\S+)", stdout).group(1)
        self.grpc = re.search(r"gRPC\s+(\S+)", stdout).group(1)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, built_demo: Path) -> Iterator[Served]:
    from fetch_helpers import seed_demo

    home = tmp_path_factory.mktemp("openai-home")
    demo = seed_demo(home, built_demo)
    tokenizer = tmp_path_factory.mktemp("tokenizer")
    shutil.copy(demo / "tokenizer.json", tokenizer / "tokenizer.json")
    config = json.loads((demo / "tokenizer_config.json").read_text())
    (tokenizer / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    with detached_run(home, "tiny-gptj", "--streaming", "--tokenizer", str(tokenizer)) as (run, _env):
        served = Served(home, run.stdout)
        (record,) = [read_record(path) for path in records_dir(home).glob("*.json")]
        endpoint = psutil.Process(record["pid"])
        yield served
    # `ftx stop` ended the endpoint with the server (its process, not its port: another test's endpoint may take
    # the freed port at once)
    _gone, alive = psutil.wait_procs([endpoint], timeout=10)
    assert not alive, f"the OpenAI endpoint (pid {endpoint.pid}) outlived `ftx stop`"


def _triton_text(served: Served, prompt: str, max_tokens: int) -> str:
    from ftx_triton.client.generate import generate_text

    return generate_text(served.http, "text", prompt, max_tokens=max_tokens)


def test_models_lists_the_deployment(served: Served) -> None:
    with _OPENER.open(served.openai + "/models", timeout=30) as response:
        data = json.loads(response.read())
    assert [m["id"] for m in data["data"]] == ["tiny-gptj"]


def test_completion_is_the_ensembles_greedy_continuation(served: Served) -> None:
    status, answer = _post(
        served.openai + "/completions", {"model": "tiny-gptj", "prompt": "Once upon a time", "max_tokens": 8}
    )
    assert status == 200, answer
    choice = answer["choices"][0]
    assert choice["text"] == _triton_text(served, "Once upon a time", 8)
    assert choice["text"].startswith(" there was a small")
    assert choice["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 8 and answer["usage"]["prompt_tokens"] > 0
    status, echoed = _post(
        served.openai + "/completions", {"prompt": "Once upon a time", "max_tokens": 8, "echo": True}
    )
    assert echoed["choices"][0]["text"] == "Once upon a time" + choice["text"]


def test_stream_sends_tokens_as_events_and_ends_with_done(served: Served) -> None:
    status, text = _post(
        served.openai + "/completions", {"prompt": "Once upon a time", "max_tokens": 8, "stream": True}, raw=True
    )
    assert status == 200
    events = _events(text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    pieces = [c["choices"][0]["text"] for c in chunks if c["choices"][0]["text"]]
    assert len(pieces) >= 4, "a streaming deployment sends the text token by token"
    assert "".join(pieces) == _triton_text(served, "Once upon a time", 8)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_chat_uses_the_models_chat_template(served: Served) -> None:
    from ftx_triton.openai_api.chat import render

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Once upon a time"}]
    status, answer = _post(served.openai + "/chat/completions", {"messages": messages, "max_tokens": 6})
    assert status == 200, answer
    prompt = render(messages, TEMPLATE, {})
    assert prompt == "[system] Be brief.\n[user] Once upon a time\n[assistant]"
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": _triton_text(served, prompt, 6)}
    assert answer["object"] == "chat.completion"
    status, text = _post(
        served.openai + "/chat/completions", {"messages": messages, "max_tokens": 6, "stream": True}, raw=True
    )
    chunks = [json.loads(e) for e in _events(text)[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert (
        "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
        == answer["choices"][0]["message"]["content"]
    )


def test_generate_chat_reads_turns_from_stdin_and_keeps_the_history(served: Served) -> None:
    """`ftx generate --chat`: each stdin line is a user turn; the answer to each is the endpoint's answer to the
    whole conversation so far (rendered with the model's chat template), printed one per turn."""
    env = {**os.environ, "FTX_HOME": str(served.home)}
    done = subprocess.run(
        [*FTX, "generate", "--chat", "--system", "Be brief.", "--max-tokens", "5"],
        input="Once upon a time\n\nThe end\n",
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Once upon a time"}]
    _, first = _post(served.openai + "/chat/completions", {"messages": messages, "max_tokens": 5})
    messages += [first["choices"][0]["message"], {"role": "user", "content": "The end"}]
    _, second = _post(served.openai + "/chat/completions", {"messages": messages, "max_tokens": 5})
    answers = [first["choices"][0]["message"]["content"], second["choices"][0]["message"]["content"]]
    assert done.stdout == "".join(f"{a}\n" for a in answers)
    bad = subprocess.run(
        [*FTX, "generate", "--chat", "--url", "http://127.0.0.1:9/v1"],
        input="Hi\n",
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert bad.returncode == 1 and "error: cannot reach" in bad.stderr and "hint:" in bad.stderr


def test_stop_strings_cut_the_text(served: Served) -> None:
    full = _triton_text(served, "Once upon a time", 12)
    cut_at = full.split()[2]
    status, answer = _post(
        served.openai + "/completions",
        {"prompt": "Once upon a time", "max_tokens": 12, "stop": [cut_at, "z" * 500]},  # 500 z: > 64 tokens
    )
    assert status == 200
    assert answer["choices"][0]["text"] == full[: full.find(cut_at)]
    assert answer["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize(
    "body, param, status",
    [
        ({"prompt": "", "max_tokens": 4}, "prompt", 400),
        ({"prompt": "Hi", "n": 0}, "n", 400),
        ({"prompt": "Hi", "n": 10_000}, "n", 400),
        ({"prompt": "Hi", "n": 2, "best_of": 1}, "best_of", 400),
        ({"prompt": "Hi", "logprobs": -1}, "logprobs", 400),
        ({"prompt": "Hi", "logprobs": 1000}, "logprobs", 400),
        ({"prompt": "Hi", "logit_bias": {"99999999": -100}}, "logit_bias", 400),  # outside the vocabulary
        ({"prompt": "Hi", "logit_bias": {"5": "x"}}, "logit_bias", 400),
        ({"prompt": "Hi", "logit_bias": {"five": -100}}, "logit_bias", 400),
        ({"prompt": "Hi", "logit_bias": {"5": 3}}, "logit_bias", 400),  # FT can ban, not bias
        ({"prompt": "Hi", "seed": -1}, "seed", 400),
        ({"prompt": "Hi", "stop": "x" * 513}, "stop", 400),
        # #33.9: fields neither honoured nor refused used to be 200 as if absent
        ({"prompt": "Hi", "frequency_penalty": 0.5}, "frequency_penalty", 400),
        ({"prompt": "Hi", "presence_penalty": 0.5}, "presence_penalty", 400),
        ({"prompt": "Hi", "suffix": " the end"}, "suffix", 400),
        ({"prompt": "Hi", "stream_options": {"include_usage": True}}, "stream_options", 400),  # without stream
        ({"prompt": "Hi", "logprobs": 0, "echo": True}, "echo", 400),  # prompt log probs: FT has none
        ({"prompt": "Hi", "some_new_field": 1}, "some_new_field", 400),
        ({"prompt": "Hi", "best_of": 2, "stream": True}, "best_of", 400),
        (
            {"messages": [{"role": "user", "content": "Hi"}], "response_format": {"type": "json_object"}},
            "response_format",
            400,
        ),
        ({"messages": [{"role": "user", "content": "Hi"}], "logprobs": True, "top_logprobs": 2}, "top_logprobs", 400),
        ({"prompt": "Hi", "model": "gpt-4"}, "model", 404),  # OpenAI's model_not_found
        ({"prompt": "Hi", "temperature": 5}, "temperature", 400),
        ({"prompt": "Hi", "max_tokens": "many"}, "max_tokens", 400),
        ({"prompt": "Hi", "stop": ["a", "b", "c", "d", "e"]}, "stop", 400),
        ({"prompt": "Hi", "echo": "no"}, "echo", 400),
        # features the endpoint lacks are refused, never silently ignored
        ({"prompt": "Hi", "logprobs": 2}, "logprobs", 400),
        ({"prompt": "Hi", "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools", 400),
        ({"prompt": "Hi", "tool_choice": "required"}, "tool_choice", 400),
        ({"prompt": "Hi", "n": True}, "n", 400),  # a boolean is not a count, though True == 1
        ({"prompt": "Hi", "n": 1.0}, "n", 400),
        ({"prompt": ["Hi"] * 65}, "prompt", 400),  # more prompts than one request may hold
        ({"prompt": "Hi \ud800"}, "prompt", 400),  # a lone surrogate is not text: the client's mistake
        ({"messages": [{"role": "user", "content": "\udfff"}]}, "messages", 400),
    ],
)
def test_bad_requests_get_openai_errors(served: Served, body: dict, param: str, status: int) -> None:
    route = "/chat/completions" if "messages" in body else "/completions"
    answered, answer = _post(served.openai + route, body)
    assert answered == status, answer
    assert answer["error"]["type"] == "invalid_request_error" and answer["error"]["param"] == param


def test_limits_are_printed_as_written() -> None:
    """Not ``1.04858e+06``: a client reads the number it may send."""
    from ftx_triton.openai_api.params import BadRequest, parse_params

    with pytest.raises(BadRequest) as refused:
        parse_params({"max_tokens": 0}, "completions", None)
    assert "between 1 and 1048576" in str(refused.value)
    with pytest.raises(BadRequest) as refused:
        parse_params({"top_p": 3}, "completions", None)
    assert "between 0 and 1" in str(refused.value) and "e+" not in str(refused.value)


def _ensemble_requests(served: Served) -> int:
    """Requests the raw model has completed (the endpoint reaches it through the ensemble, or straight over
    gRPC on a streaming deployment's token route)."""
    with _OPENER.open(served.http + "/v2/models/fastertransformer/stats", timeout=60) as response:
        return int(json.loads(response.read())["model_stats"][0]["inference_count"])


def test_a_client_that_leaves_stops_its_prompts_being_generated(served: Served) -> None:
    """40 prompts, the client gone after the first answers: the endpoint generates no further prompt
    (the old one went on to the last, for nobody). "Stopped" is judged against the time one prompt takes
    here and now, so a busy machine only makes the test slower."""
    host, port = re.match(r"http://([^:/]+):(\d+)/v1", served.openai).groups()
    began = time.monotonic()
    assert _post(served.openai + "/completions", {"prompt": "Story:", "max_tokens": 8})[0] == 200
    one_prompt_s = time.monotonic() - began
    before = _ensemble_requests(served)
    body = json.dumps({"prompt": [f"Story {i}:" for i in range(40)], "max_tokens": 8}).encode()
    with socket.create_connection((host, int(port)), timeout=60) as client:
        client.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        deadline = time.monotonic() + 120
        while _ensemble_requests(served) == before and time.monotonic() < deadline:
            time.sleep(0.05)
    settled, previous = None, -1
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:  # until no prompt has finished for several prompts' time
        settled = _ensemble_requests(served)
        if settled == previous:
            break
        previous = settled
        time.sleep(max(3.0, 5 * one_prompt_s))
    print(f"ensemble requests: {before} before, {settled} settled (one prompt {one_prompt_s:.2f} s)")
    assert settled is not None and 0 < settled - before < 40, (before, settled)
    assert _post(served.openai + "/completions", {"prompt": "Hi", "max_tokens": 1})[0] == 200


def test_a_chat_template_that_never_ends_blocks_nobody(served: Served, tmp_path: Path) -> None:
    """A hostile template renders in a worker process: /v1/models answers meanwhile, and the chat request
    gets a 500 server_error (the template is the model's, not the client's) once its time is up."""
    import threading

    from ftx_triton.front.server import Front
    from ftx_triton.openai_api.app import make_app

    tokenizer = tmp_path / "tokenizer"
    tokenizer.mkdir()
    from fetch_helpers import ensure_demo_checkpoint

    shutil.copy(ensure_demo_checkpoint(served.home) / "tokenizer.json", tokenizer / "tokenizer.json")
    forever = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
    (tokenizer / "tokenizer_config.json").write_text(json.dumps({"chat_template": forever}))
    front = Front(make_app(served.http, "tiny-gptj", tokenizer), "127.0.0.1", 0)
    front.start()
    try:
        url = f"http://127.0.0.1:{front.port}/v1"
        answers: dict[str, Any] = {}
        chat = threading.Thread(
            target=lambda: answers.update(
                chat=_post(url + "/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})
            )
        )
        chat.start()
        time.sleep(1)
        with _OPENER.open(url + "/models", timeout=60) as response:
            assert response.status == 200
        models_answered_first = chat.is_alive()
        chat.join(300)
        status, answer = answers["chat"]
        assert status == 500 and answer["error"]["type"] == "server_error", answer
        assert "did not finish within" in answer["error"]["message"]
        assert models_answered_first
    finally:
        front.stop()


@pytest.mark.parametrize(
    "data, headers",
    [
        (b"[" * 100_000 + b"]" * 100_000, {"Content-Type": "application/json"}),  # deeper than the parser recurses
        (b'{"prompt": "Hi"}', {"Content-Type": "application/json; charset=foobar"}),  # no such charset
        (b'{"prompt": "Hi"}', {"Content-Type": "application/json", "Content-Encoding": "gzip"}),  # not gzip
        (b'{"prompt": "Hi"}', {"Content-Type": "application/json", "Content-Encoding": "deflate"}),
    ],
    ids=["deep", "charset", "gzip", "deflate"],
)
def test_unreadable_bodies_are_400_not_500(served: Served, data: bytes, headers: dict[str, str]) -> None:
    status, answer = _post(served.openai + "/completions", data, headers=headers)
    assert status == 400 and "not readable JSON" in answer["error"]["message"], answer
    assert _post(served.openai + "/completions", {"prompt": "Hi", "max_tokens": 1})[0] == 200


def test_clients_that_leave_mid_request_leave_no_tracebacks_in_the_log(served: Served) -> None:
    """A body cut short and a stream whose reader hangs up: the endpoint keeps serving and logs no traceback
    per such client (500 of them filled the log with 925 KB of tracebacks)."""
    host, port = re.match(r"http://([^:/]+):(\d+)/v1", served.openai).groups()
    logs = list((served.home / "openai" / "logs").glob("*.log"))
    before = {log: log.stat().st_size for log in logs}

    def request(body: bytes, length: int) -> bytes:
        return (
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % length
        ) + body

    streamed = b'{"prompt": "Hi", "stream": true, "max_tokens": 32}'
    for request_bytes in (request(b'{"prompt": ', 1000), request(streamed, len(streamed))):
        for _ in range(3):
            with socket.create_connection((host, int(port)), timeout=30) as client:
                client.sendall(request_bytes)
                if b"stream" in request_bytes:
                    client.recv(64)  # the stream has started
            time.sleep(0.3)
    assert _post(served.openai + "/completions", {"prompt": "Hi", "max_tokens": 1})[0] == 200
    time.sleep(1)
    assert logs and not [log for log in logs if "Traceback" in log.read_bytes()[before[log] :].decode(errors="replace")]


def test_a_stream_the_model_refuses_is_an_http_error_not_a_200(served: Served) -> None:
    """The refusal comes before the stream starts: 400 with the model's own reason, no event framing."""
    status, answer = _post(served.openai + "/completions", {"prompt": "Hi", "stream": True, "max_tokens": 5000})
    assert status == 400, answer
    message = answer["error"]["message"]
    assert "5000" in message and "data:" not in message and answer["error"]["type"] == "invalid_request_error"


def test_bad_json_and_bad_messages_are_400(served: Served) -> None:
    status, answer = _post(served.openai + "/completions", b"{not json")
    assert status == 400 and "JSON" in answer["error"]["message"]
    status, answer = _post(served.openai + "/chat/completions", {"messages": [{"role": "user"}]})
    assert status == 400 and answer["error"]["param"] == "messages"


def test_ps_shows_the_endpoint_and_stop_ends_it(served: Served) -> None:
    env = {**os.environ, "FTX_HOME": str(served.home)}
    ps = subprocess.run([*FTX, "ps", "--json"], capture_output=True, text=True, timeout=120, env=env)
    rows = [r for r in json.loads(ps.stdout) if r["alive"]]
    assert [(r["name"], r["model"], r["runtime"], r["openai"]) for r in rows] == [
        ("tiny-gptj", "tiny-gptj", "python", served.openai)
    ]
    assert rows[0]["memory_bytes"] > 10_000_000 and rows[0]["uptime_s"] > 0 and rows[0]["device"] == "cpu"


def test_what_a_running_server_uses_is_marked_and_not_removed(served: Served) -> None:
    env = {**os.environ, "FTX_HOME": str(served.home)}
    ls = subprocess.run([*FTX, "ls", "--json"], capture_output=True, text=True, timeout=120, env=env)
    rows = json.loads(ls.stdout)
    used = {r["stage"] for r in rows if r["in_use"]}
    assert used == {"fetch", "convert", "tune", "configure"}
    repo = next(r for r in rows if r["stage"] == "configure" and r["in_use"])
    rm = subprocess.run([*FTX, "rm", repo["key"]], capture_output=True, text=True, timeout=120, env=env)
    assert rm.returncode == 1 and "in use by a running server" in rm.stderr
    assert Path(repo["path"]).is_dir()
    prune = subprocess.run([*FTX, "prune", "--unused"], capture_output=True, text=True, timeout=120, env=env)
    assert prune.returncode == 0 and Path(repo["path"]).is_dir()


# --------------------------------------------------------------------------- ftx bench on the same deployment


def _bench(served: Served, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "FTX_HOME": str(served.home)}
    return subprocess.run(
        [*FTX, "bench", "--concurrency", "1,2", "--requests", "6", "--max-tokens", "4", "--json", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


def _stored(served: Served) -> list[dict]:
    env = {**os.environ, "FTX_HOME": str(served.home)}
    ps = json.loads(subprocess.run([*FTX, "ps", "--json"], capture_output=True, text=True, timeout=120, env=env).stdout)
    from ftx_triton.server.bench import results_path

    return json.loads(results_path(served.home, Path(ps[0]["repository"])).read_text())


def test_bench_builtin_measures_and_stores_beside_the_deployment(served: Served) -> None:
    done = _bench(served, "--tool", "builtin")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["tool"] == "builtin" and "requested with --tool builtin" in done.stderr
    assert [p["concurrency"] for p in result["points"]] == [1, 2]
    for point in result["points"]:
        assert point["requests"] == 6 and point["throughput_rps"] > 0
        assert 0 < point["latency_p50_ms"] <= point["latency_p90_ms"] <= point["latency_p99_ms"]
        assert point["tokens_per_s"] > 0
    assert _stored(served)[-1]["points"] == result["points"]


def test_bench_leaves_the_served_artifact_intact(served: Served) -> None:
    """The results live beside the store: the repository artifact still verifies after `ftx bench`, so the next
    `ftx run` reuses it (it used to find ftx-bench.json inside, call the artifact corrupt and rebuild it)."""
    from ftx_triton.store.artifact_store import ArtifactStore

    assert _bench(served, "--tool", "builtin").returncode == 0
    env = {**os.environ, "FTX_HOME": str(served.home)}
    ps = json.loads(subprocess.run([*FTX, "ps", "--json"], capture_output=True, text=True, timeout=120, env=env).stdout)
    repository = Path(ps[0]["repository"])
    assert not list(repository.glob("*bench*"))
    store = ArtifactStore(served.home)
    assert repository.parent.name == "configure"
    assert store.lookup("configure", repository.name) is not None
    store.close()


def test_bench_builtin_says_why_the_server_refused_its_request(served: Served) -> None:
    done = _bench(served, "--tool", "builtin", "--max-tokens", "4096")  # past the positions
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "error: the server refused the benchmark's request" in done.stderr and "hint:" in done.stderr


def test_bench_with_perf_analyzer(served: Served) -> None:
    from ftx_triton.server.bench import find_perf_analyzer

    if find_perf_analyzer() is None:
        pytest.skip("perf_analyzer is not installed here (scripts/setup.sh --dev installs it)")
    done = _bench(served, "--tool", "perf_analyzer")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["tool"] == "perf_analyzer" and [p["concurrency"] for p in result["points"]] == [1, 2]
    assert all(p["throughput_rps"] > 0 and p["latency_p99_ms"] > 0 for p in result["points"])
    assert _stored(served)[-1]["tool"] == "perf_analyzer"


def _health(url: str) -> tuple[int, str]:
    try:
        with _OPENER.open(url, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_health_means_health_and_the_front_dies_with_its_supervisor(tmp_path: Path, built_demo: Path) -> None:
    """`/health` answered "ok" whatever Triton did, and a detached deployment's endpoint outlived its server as an
    orphan holding its port. A real detached deployment: its tritonserver is stopped (SIGSTOP: a wedged server),
    then killed."""
    import psutil
    from fetch_helpers import seed_demo

    home = tmp_path / "home"
    seed_demo(home, built_demo)
    with detached_run(home, "tiny-gptj") as (run, _env):
        health = Served(home, run.stdout).openai.removesuffix("/v1") + "/health"
        assert _health(health) == (200, "ok")
        (record_file,) = (home / "openai").glob("*.json")
        record = json.loads(record_file.read_text())
        front = psutil.Process(record["pid"])
        supervisor = psutil.Process(record["triton_pid"])
        (triton,) = [p for p in supervisor.children(recursive=True) if p.name() == "tritonserver"]
        triton.suspend()
        status, body = _health(health)
        assert status == 503 and json.loads(body)["status"] == "unavailable", body
        triton.kill()
        front.wait(timeout=30)  # gone with the supervisor, not an orphan of init
        assert not supervisor.is_running()


def _plain(url: str) -> tuple[int, Any]:
    try:
        with _OPENER.open(url, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())  # not JSON: the test fails here


def test_every_endpoint_answer_is_json_even_for_faults_nobody_foresaw(served: Served, tmp_path: Path) -> None:
    """Issue 33: with its FTX_HOME deleted, the endpoint's tokenizer was gone and every completion was
    aiohttp's plain-text 500; no such route and another method were plain text too."""
    from ftx_triton.front.server import Front
    from ftx_triton.openai_api.app import make_app

    status, answer = _plain(served.openai + "/completions")  # GET of a POST route
    assert status == 405 and answer["error"]["type"] == "invalid_request_error", answer
    status, answer = _plain(served.openai.removesuffix("/v1") + "/v2/nothing")
    assert status == 404 and "Not Found" in answer["error"]["message"], answer
    front = Front(make_app(served.http, "tiny-gptj", tmp_path / "deleted" / "preprocessing" / "1"), "127.0.0.1", 0)
    front.start()
    try:
        status, answer = _post(f"http://127.0.0.1:{front.port}/v1/completions", {"prompt": "Hi", "max_tokens": 2})
        assert status == 500 and answer["error"]["type"] == "server_error", answer
        assert "tokenizer" in answer["error"]["message"], answer
    finally:
        front.stop()


def test_generate_on_a_streaming_deployment_is_a_400_naming_generate_stream(served: Served) -> None:
    """Issue 33: tritonserver ran the request, then answered 200 with a body that was only an error."""
    status, answer = _post(served.http + "/v2/models/text/generate", {"text_input": "Once", "max_tokens": 2})
    assert status == 400 and "/v2/models/text/generate_stream" in answer["error"], answer
    status, text = _post(
        served.http + "/v2/models/text/generate_stream",
        {"text_input": "Once", "max_tokens": 2, "stream": True},
        raw=True,
    )
    assert status == 200 and "text_output" in text, text


@pytest.mark.parametrize(
    "field",
    [{"temperature": "NaN"}, {"temperature": "Infinity"}, {"max_tokens": "2"}, {"text_input": 5}],
    ids=["nan-string", "infinity-string", "int-as-string", "number-as-text"],
)
def test_a_value_of_the_wrong_json_type_is_the_clients_400(served: Served, field: dict[str, Any]) -> None:
    """Issue 33 (and round 3's type mistakes): JSON has no NaN, so clients send "NaN" for an FP32 input, which
    tritonserver called its own fault (500 "Unable to parse 'data'")."""
    body = {"text_input": "Once", "max_tokens": 2, "stream": True, **field}
    status, answer = _post(served.http + "/v2/models/text/generate_stream", body)
    assert status == 400 and "Unable to parse" in answer["error"] and "wrong JSON type" in answer["error"], answer


# --------------------------------------------------------------------------- the token route (issue 38)


def _executions(served: Served, model: str) -> int:
    with _OPENER.open(f"{served.http}/v2/models/{model}/stats", timeout=60) as response:
        return int(json.loads(response.read())["model_stats"][0]["execution_count"])


def _settled_executions(served: Served, model: str) -> int:
    """The execution count once it stops moving: Triton counts a decoupled model's execution when ``execute``
    returns, which can come after the client has read the final response (a loaded machine showed one more)."""
    import time

    last = _executions(served, model)
    for _ in range(50):
        time.sleep(0.2)
        now = _executions(served, model)
        if now == last:
            return now
        last = now
    return last


def _repository(served: Served) -> Path:
    env = {**os.environ, "FTX_HOME": str(served.home)}
    ps = subprocess.run([*FTX, "ps", "--json"], capture_output=True, text=True, timeout=120, env=env)
    return Path(json.loads(ps.stdout)[0]["repository"])


def test_streams_read_ids_from_the_model_and_run_no_python_model_per_token(served: Served) -> None:
    """A streamed completion and `ftx generate --stream` read the fastertransformer model's ids over gRPC and
    detokenize in their own process: postprocessing runs not once for them, and the text is the ensemble's."""
    expected = _triton_text(served, "Once upon a time", 12)
    # settled: the ensemble request above may be counted after its answer was read (CI on a loaded machine: one more)
    before = _settled_executions(served, "postprocessing"), _settled_executions(served, "fastertransformer")
    status, text = _post(
        served.openai + "/completions", {"prompt": "Once upon a time", "max_tokens": 12, "stream": True}, raw=True
    )
    assert status == 200
    chunks = [json.loads(e) for e in _events(text)[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == expected
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    env = {**os.environ, "FTX_HOME": str(served.home)}
    cli = subprocess.run(
        [*FTX, "generate", "Once upon a time", "--max-tokens", "12", "--stream"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.strip() == ("Once upon a time" + expected).strip()
    after = _settled_executions(served, "postprocessing"), _settled_executions(served, "fastertransformer")
    assert after[0] == before[0], "no postprocessing call for a stream on the token route"
    assert after[1] >= before[1] + 2


def test_a_slow_reader_gets_the_whole_text_in_fewer_pieces(served: Served) -> None:
    """The reader keeps only the newest response while the consumer is busy: nothing is lost, since each
    response holds the whole output so far, and the stream never waits for the slow consumer."""
    import asyncio

    from ftx_triton.client.token_stream import AsyncTokenClient, TokenRoute, stream_texts

    route = TokenRoute.open(_repository(served))
    assert route is not None and route.decoupled
    expected = _triton_text(served, "Once upon a time", 24)

    async def read(delay: float) -> list[str]:
        client = AsyncTokenClient(served.grpc)
        try:
            pieces = []
            async for piece in stream_texts(client, route, {"prompt": "Once upon a time", "max_tokens": 24}):
                pieces.append(piece)
                await asyncio.sleep(delay)
            return pieces
        finally:
            await client.close()

    slow = asyncio.run(read(0.5))
    assert "".join(slow) == expected
    assert len(slow) < 24


def test_segmented_generation_gives_the_unsegmented_greedy_text(served: Served) -> None:
    """FTX_SEGMENT_TOKENS=k: the front asks for k tokens at a time, re-sending the prompt and the text so far;
    greedy, the text is the one request's, whatever k (the tiny tokenizer re-encodes its text to the same ids),
    and the model ran one request per segment."""
    import asyncio

    from ftx_triton.client.token_stream import AsyncTokenClient, TokenRoute
    from ftx_triton.openai_api.token_generation import TokenGeneration

    route = TokenRoute.open(_repository(served))
    assert route is not None
    prompt, wanted = "Once upon a time", 20
    expected = _triton_text(served, prompt, wanted)

    async def generate(segment: int) -> tuple[str, int, str]:
        client = AsyncTokenClient(served.grpc)
        try:
            generation = TokenGeneration(client, route, prompt, {"max_tokens": wanted}, [], segment=segment)
            return await generation.awhole(), generation.tokens, generation.finish_reason
        finally:
            await client.close()

    whole = asyncio.run(generate(0))
    assert whole[0] == expected
    for segment in (1, 6):
        before = _settled_executions(served, "fastertransformer")
        assert asyncio.run(generate(segment)) == whole, segment
        # one request per segment: ceil(tokens / k) of them, and one more when the model ended exactly at a
        # segment's boundary (only an empty next segment tells that it ended)
        tokens = whole[1]
        least = -(-tokens // segment)
        most = least if tokens == wanted else tokens // segment + 1
        assert least <= _settled_executions(served, "fastertransformer") - before <= most, (segment, tokens)


# --------------------------------------------------------------------------- #36 with the official client


def _client(served: Served) -> Any:
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=served.openai, api_key="none", max_retries=0, timeout=300)


def _text_model_answer(served: Served, prompt: str, max_tokens: int, **extra: Any) -> Any:
    """The text model's own answer (ids and log probabilities) for the same request."""
    from ftx_triton.client.generate import generate_answer

    return generate_answer(served.http, "text", prompt, max_tokens=max_tokens, **extra)


def test_openai_client_gets_log_probs_streamed_and_not(served: Served) -> None:
    """logprobs 0: each chosen token's log probability in OpenAI's shape, the same numbers as the text model's
    (FasterTransformer's output_log_probs), streamed or not; usage counts the generated ids (#33: it used to
    re-encode the text, 10 tokens for max_tokens 8)."""
    client = _client(served)
    prompt = "Once upon a time"
    answer = client.completions.create(model="tiny-gptj", prompt=prompt, max_tokens=8, logprobs=0)
    reference = _text_model_answer(served, prompt, 8)
    choice = answer.choices[0]
    assert choice.text == reference.text
    assert len(choice.logprobs.token_logprobs) == len(reference.token_ids) == answer.usage.completion_tokens
    assert np.allclose(choice.logprobs.token_logprobs, reference.log_probs, atol=1e-6)
    assert "".join(choice.logprobs.tokens) == choice.text
    assert choice.logprobs.text_offset[0] == len(prompt)
    chunks = list(
        client.completions.create(
            model="tiny-gptj",
            prompt=prompt,
            max_tokens=8,
            logprobs=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    streamed = [v for c in chunks if c.choices and c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs]
    assert np.allclose(streamed, reference.log_probs, atol=1e-6)
    assert chunks[-1].usage.completion_tokens == len(reference.token_ids) and chunks[-1].choices == []
    chat = client.chat.completions.create(
        model="tiny-gptj", messages=[{"role": "user", "content": prompt}], max_tokens=5, logprobs=True
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens and all(
        c.logprob <= 0 and c.top_logprobs == [] for c in content
    )
    assert "".join(c.token for c in content) == chat.choices[0].message.content
    stream = client.chat.completions.create(
        model="tiny-gptj", messages=[{"role": "user", "content": prompt}], max_tokens=5, logprobs=True, stream=True
    )
    values = [
        c.logprob
        for chunk in stream
        if chunk.choices and chunk.choices[0].logprobs
        for c in chunk.choices[0].logprobs.content
    ]
    assert np.allclose(values, [c.logprob for c in content], atol=1e-6)


def test_usage_counts_the_generated_ids_not_a_re_encoding_of_the_text(served: Served) -> None:
    """#33 (low): re-encoding the text miscounted (10 for max_tokens 8); the count is the model's own ids.
    Sampled generations (random tokens seldom re-encode to themselves), at least one of whose texts
    re-encodes to another count, so the test can tell the two apart."""
    from fetch_helpers import ensure_demo_checkpoint
    from ftx_triton.repository.textproc import load_codec

    client = _client(served)
    codec = load_codec(ensure_demo_checkpoint(served.home))
    differs = []
    for seed in range(12):
        answer = client.completions.create(
            model="tiny-gptj", prompt="Once upon a time", max_tokens=8, temperature=2.0, seed=seed
        )
        ids = _text_model_answer(served, "Once upon a time", 8, temperature=2.0, options={"seed": seed}).token_ids
        assert answer.usage.completion_tokens == len(ids), seed
        differs.append(len(codec.encode(answer.choices[0].text, prompt=False)) != len(ids))
        if any(differs):
            break
    assert any(differs), "no generation here tells a re-encoding from the model's count"


def test_openai_client_seed_n_logit_bias_and_stop(served: Served) -> None:
    client = _client(served)
    prompt = "Once upon a time"

    def sample(**extra: Any) -> Any:
        return client.completions.create(model="tiny-gptj", prompt=prompt, max_tokens=8, temperature=1.0, **extra)

    first, again = sample(seed=3), sample(seed=3)
    assert first.choices[0].text == again.choices[0].text
    assert len({sample(seed=s).choices[0].text for s in (1, 2, 4, 5)}) > 1
    three = sample(seed=10, n=3)
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert [c.text for c in three.choices] == [sample(seed=10 + i).choices[0].text for i in range(3)]
    streamed = list(
        client.completions.create(
            model="tiny-gptj", prompt=prompt, max_tokens=8, temperature=1.0, seed=10, n=3, stream=True
        )
    )
    for i in range(3):
        text = "".join(c.choices[0].text for c in streamed if c.choices and c.choices[0].index == i)
        assert text == three.choices[i].text
    best = sample(seed=10, n=1, best_of=3, logprobs=0)
    scored = sample(seed=10, n=3, logprobs=0)
    means = [float(np.mean(c.logprobs.token_logprobs)) for c in scored.choices]
    assert best.choices[0].text == scored.choices[int(np.argmax(means))].text
    greedy = _text_model_answer(served, prompt, 8)
    banned = sorted(set(greedy.token_ids[:2]))
    biased = client.completions.create(
        model="tiny-gptj", prompt=prompt, max_tokens=8, logit_bias={str(t): -100 for t in banned}
    )
    ids = _text_model_answer(served, prompt, 8, options={"bad_token_ids": banned}).token_ids
    assert not set(ids) & set(banned)
    assert biased.choices[0].text == _text_model_answer(served, prompt, 8, options={"bad_token_ids": banned}).text
    assert biased.choices[0].text != greedy.text


def test_openai_client_sees_refusals_as_bad_request_errors(served: Served) -> None:
    openai = pytest.importorskip("openai")
    client = _client(served)
    for extra, param in (
        ({"logprobs": 3}, "logprobs"),
        ({"frequency_penalty": 1.0}, "frequency_penalty"),
        ({"logit_bias": {"5": 10}}, "logit_bias"),
        ({"extra_body": {"mystery": True}}, "mystery"),
    ):
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model="tiny-gptj", prompt="Hi", max_tokens=2, **extra)
        assert refused.value.body["param"] == param and refused.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model="tiny-gptj", prompt="Hi", logprobs=2)
    assert "computes only the chosen token's log probability" in refused.value.body["message"]


def test_embeddings_on_a_decoder_only_deployment_is_a_400_saying_it_has_no_encoder(served: Served) -> None:
    status, answer = _post(served.openai + "/embeddings", {"input": "Hello"})
    assert status == 400, answer
    assert answer["error"]["code"] == "embeddings_unsupported" and "no encoder" in answer["error"]["message"]
