"""The OpenAI endpoint of a deployment that does not stream (issue 38): its requests go to the
``fastertransformer`` model as token ids over gRPC, tokenized and detokenized in the endpoint (the token
route), so they reach the model's dynamic batcher as their clients send them instead of through the one
``preprocessing`` instance of the ``text`` ensemble; the answers are the ensemble's. Real tritonserver,
python runtime, the built-in tiny-gptj deployed with ``--no-streaming --max-queue-size 1``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from python_runtime_support import SERVER_MARKS, detached_run, own_ports, post_json

pytestmark = SERVER_MARKS

FTX = [str(Path(sys.executable).parent / "ftx")]
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
PROMPT = "Once upon a time"


class Served:
    def __init__(self, home: Path, stdout: str) -> None:
        self.home = home
        self.openai = re.search(r"OpenAI\s+(http://\S+/v1)", stdout).group(1)
        self.http = re.search(r"HTTP\s+(http://\S+)", stdout).group(1)
        env = {**os.environ, "FTX_HOME": str(home)}
        ps = subprocess.run([*FTX, "ps", "--json"], capture_output=True, text=True, timeout=120, env=env)
        self.repository = Path(json.loads(ps.stdout)[0]["repository"])


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, built_demo: Path) -> Iterator[Served]:
    from fetch_helpers import seed_demo

    home = tmp_path_factory.mktemp("whole-route-home")
    seed_demo(home, built_demo)
    with detached_run(home, "tiny-gptj", "--no-streaming", "--max-queue-size", "1", *own_ports()) as (run, _env):
        yield Served(home, run.stdout)


def _answer(served: Served, route: str, body: dict[str, Any]) -> dict[str, Any]:
    status, _headers, text = post_json(served.openai + route, body)
    assert status == 200, text
    return json.loads(text)


def _executions(served: Served, model: str) -> int:
    with _OPENER.open(f"{served.http}/v2/models/{model}/stats", timeout=60) as response:
        return int(json.loads(response.read())["model_stats"][0]["execution_count"])


def _ensemble(served: Served, prompt: str, max_tokens: int, **extra: Any) -> Any:
    """The ``text`` ensemble's answer to the same request (text, ids, log probabilities)."""
    from ftx_triton.client.generate import generate_answer

    return generate_answer(served.http, "text", prompt, max_tokens=max_tokens, **extra)


def test_answers_are_the_ensembles_and_no_text_model_runs(served: Served) -> None:
    """Greedy and sampled text, echo, stop strings, max_tokens, log probabilities, n with seeds, best_of, logit_bias,
    chat and a one-chunk stream: each the ensemble's answer, while preprocessing and postprocessing run not once."""
    from ftx_triton.openai_api.chat import chat_template, render
    from ftx_triton.repository.textproc import load_codec

    greedy = _ensemble(served, PROMPT, 8)
    greedy_prompt_ids = load_codec(served.repository / "preprocessing" / "1").encode(PROMPT, prompt=True)
    long = _ensemble(served, PROMPT, 12)
    cut_at = long.text.split()[2]
    sampled = [_ensemble(served, PROMPT, 8, temperature=1.0, options={"seed": 10 + i}) for i in range(3)]
    seeded = [a.text for a in sampled[:2]]
    best_text = max(sampled, key=lambda a: float(np.mean(a.log_probs))).text
    banned = sorted(set(greedy.token_ids[:2]))
    biased = _ensemble(served, PROMPT, 8, options={"bad_token_ids": banned})
    messages = [{"role": "user", "content": PROMPT}]
    template, specials = chat_template(served.repository / "preprocessing" / "1")
    chat_reference = _ensemble(served, render(messages, template, specials), 6)
    before = {m: _executions(served, m) for m in ("preprocessing", "postprocessing", "fastertransformer")}

    answer = _answer(served, "/completions", {"prompt": PROMPT, "max_tokens": 8, "logprobs": 0})
    choice = answer["choices"][0]
    assert choice["text"] == greedy.text and choice["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == len(greedy.token_ids) == 8
    assert np.allclose(choice["logprobs"]["token_logprobs"], greedy.log_probs, atol=1e-6)
    assert "".join(choice["logprobs"]["tokens"]) == choice["text"]
    assert choice["logprobs"]["text_offset"][0] == len(PROMPT)
    echoed = _answer(served, "/completions", {"prompt": PROMPT, "max_tokens": 8, "echo": True})
    assert echoed["choices"][0]["text"] == PROMPT + greedy.text
    stopped = _answer(served, "/completions", {"prompt": PROMPT, "max_tokens": 12, "stop": [cut_at, "z" * 500]})
    assert stopped["choices"][0]["text"] == long.text[: long.text.find(cut_at)]
    assert stopped["choices"][0]["finish_reason"] == "stop"
    two = _answer(served, "/completions", {"prompt": PROMPT, "max_tokens": 8, "temperature": 1.0, "seed": 10, "n": 2})
    assert [c["text"] for c in two["choices"]] == seeded
    best = {"prompt": PROMPT, "max_tokens": 8, "temperature": 1.0, "seed": 10, "n": 1, "best_of": 3}
    assert [c["text"] for c in _answer(served, "/completions", best)["choices"]] == [best_text]
    bias = {str(t): -100 for t in banned}
    assert (
        _answer(served, "/completions", {"prompt": PROMPT, "max_tokens": 8, "logit_bias": bias})["choices"][0]["text"]
        == biased.text
        != greedy.text
    )
    chat = _answer(served, "/chat/completions", {"messages": messages, "max_tokens": 6})
    assert chat["choices"][0]["message"]["content"] == chat_reference.text
    assert chat["usage"]["completion_tokens"] == len(chat_reference.token_ids)
    status, headers, text = post_json(
        served.openai + "/completions", {"prompt": PROMPT, "max_tokens": 8, "stream": True}
    )
    assert status == 200 and headers["X-Ftx-Stream"] == "whole" and headers["X-Ftx-Route"] == "tokens"
    events = [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e)["choices"][0] for e in events[:-1]]
    assert "".join(c["text"] for c in chunks) == greedy.text and chunks[-1]["finish_reason"] == "length"
    # the whole answer's events went out as one response (headers and body in one write), not a chunk each
    assert headers["Content-Length"] == str(len(text.encode())) and "Transfer-Encoding" not in headers
    streamed_usage = {"stream": True, "stream_options": {"include_usage": True}}
    status, _headers, text = post_json(
        served.openai + "/completions", {"prompt": PROMPT, "max_tokens": 8, **streamed_usage}
    )
    usage = json.loads([line for line in text.splitlines() if line.startswith("data: {")][-1][len("data: ") :])["usage"]
    whole = _answer(served, "/completions", {"prompt": PROMPT, "max_tokens": 8})["usage"]
    # the prompt's tokens as the route tokenized it to send it (not encoded again)
    assert usage["prompt_tokens"] == whole["prompt_tokens"] == len(greedy_prompt_ids) and usage == whole

    after = {m: _executions(served, m) for m in before}
    assert after["preprocessing"] == before["preprocessing"], "the endpoint tokenizes in its own process"
    assert after["postprocessing"] == before["postprocessing"], "the endpoint detokenizes in its own process"
    assert after["fastertransformer"] - before["fastertransformer"] >= 7


def test_refusals_are_the_ensembles_400s(served: Served) -> None:
    """A request the model refuses (over its output limit) and one the preprocessing code refuses (a prompt
    longer than the context) are the client's 400, in the ensemble's words."""
    for body in ({"prompt": PROMPT, "max_tokens": 5000}, {"prompt": "word " * 300, "max_tokens": 4}):
        status, _headers, text = post_json(served.openai + "/completions", body)
        error = json.loads(text)["error"]
        assert status == 400 and error["type"] == "invalid_request_error", text
        generate = {"text_input": body["prompt"], "max_tokens": body["max_tokens"]}
        refused, _headers, ensemble = post_json(served.http + "/v2/models/text/generate", generate)
        reason = error["message"].removeprefix("the model refused the request: ")
        assert refused == 400 and reason in json.loads(ensemble)["error"], (reason, ensemble)


def test_a_full_queue_is_a_fast_429_with_retry_after(served: Served) -> None:
    """Six long requests at once against a queue of one: the model takes what its queue holds, the rest are
    refused at once (OpenAI's 429 rate_limit_exceeded with Retry-After), never a 500."""
    results: list[tuple[int, dict[str, str], str]] = []

    def send() -> None:
        results.append(post_json(served.openai + "/completions", {"prompt": PROMPT, "max_tokens": 200}))

    threads = [threading.Thread(target=send) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    statuses = sorted(status for status, _headers, _text in results)
    assert len(results) == 6 and set(statuses) <= {200, 429} and 200 in statuses and 429 in statuses, results
    for status, headers, text in results:
        if status == 429:
            assert json.loads(text)["error"]["code"] == "rate_limit_exceeded" and int(headers["Retry-After"]) >= 1


def test_triton_out_of_reach_over_grpc_is_a_502(served: Served) -> None:
    """The token route's gRPC address answering nothing: a JSON 502 naming the address, not a hang or a 500."""
    from ftx_triton.front.server import Front
    from ftx_triton.openai_api.app import make_app
    from ftx_triton.server.ports import loopback_port

    dead = f"127.0.0.1:{loopback_port()}"
    app = make_app(served.http, "tiny-gptj", served.repository / "preprocessing" / "1", triton_grpc=dead)
    front = Front(app, "127.0.0.1", 0)
    front.start()
    try:
        status, _headers, text = post_json(
            f"http://127.0.0.1:{front.port}/v1/completions", {"prompt": "Hi", "max_tokens": 2}
        )
    finally:
        front.stop()
    error = json.loads(text)["error"]
    assert status == 502 and error["type"] == "server_error" and dead in error["message"], text
