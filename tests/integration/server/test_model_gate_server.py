"""The HTTP front's model gate (issue 38) before the real tritonserver: a request for a busy model waits at the
front and goes with the busy batch's returning client, in one batch, instead of alone before it.

The ``fastertransformer`` model is the python runtime's STAND-IN (``ftx_triton.runtime.python.standin``: the
runtime's own request checks and output tensors, a fixed wall time per execution, no CPU; no FasterTransformer
backend or GPU runs here) in a repository ``ftx configure tiny-gptj --runtime python --no-streaming`` wrote, so
the model's dynamic batcher holds a batch 20 ms as a deployment's does. Real tritonserver, real HTTP on 127.0.0.1.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from python_runtime_support import SERVER_MARKS

pytestmark = SERVER_MARKS

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
EXECUTION_MS = 700
"""The stand-in's wall time per execution."""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, built_demo: Path) -> Iterator[tuple[str, str]]:
    """A server on a stand-in repository as ``ftx run`` starts it with ``FTX_FRONT_GATE_US=20000`` (the supervisor's
    front, its gate on): (tritonserver's own HTTP address behind the front, the server's log)."""
    from click.testing import CliRunner
    from fetch_helpers import seed_demo
    from ftx_triton.cli import cli
    from ftx_triton.cli.common import reset_host
    from ftx_triton.front.model_gate import WINDOW_ENV
    from ftx_triton.runtime.python.standin import use_standin
    from ftx_triton.server.tritonserver import TritonServer

    home = tmp_path_factory.mktemp("gate-home")
    seed_demo(home, built_demo)
    repo = tmp_path_factory.mktemp("gate-repo") / "repo"
    reset_host()
    args = ["configure", "tiny-gptj", "--runtime", "python", "--no-streaming", "--output", str(repo)]
    result = CliRunner().invoke(cli, args, env={"FTX_HOME": str(home)})
    assert result.exit_code == 0, result.output
    use_standin(repo, EXECUTION_MS)
    server = TritonServer(repo, home=home, grpc_front=False, name="gate")
    with pytest.MonkeyPatch.context() as env:
        env.setenv(WINDOW_ENV, "20000")
        server.start()
    try:
        _generate(f"http://{server.http_url}")  # through the supervisor's front
        yield f"127.0.0.1:{server._internal_http_port}", server.log_path.read_text()
    finally:
        server.stop()


def _generate(url: str) -> float:
    body = json.dumps({"text_input": "Once upon a time", "max_tokens": 4}).encode()
    request = urllib.request.Request(f"{url}/v2/models/text/generate", body, {"Content-Type": "application/json"})
    with _OPENER.open(request, timeout=120) as response:
        assert response.status == 200 and json.loads(response.read())["text_output"]
    return time.monotonic()


def _executions(http: str) -> dict[int, int]:
    """The ``fastertransformer`` model's executions per batch size so far."""
    with _OPENER.open(f"http://{http}/v2/models/fastertransformer/stats", timeout=30) as response:
        stats = json.loads(response.read())["model_stats"][0]
    return {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats.get("batch_stats", ())}


def _turns(url: str, http: str) -> dict[int, int]:
    """Client A sends, client B sends while A's request generates (after the gate's window), and A sends again as
    soon as its answer is back: the model's executions per batch size for those three requests."""
    before = _executions(http)
    b = threading.Thread(target=lambda: (time.sleep(EXECUTION_MS / 1e3 / 2), _generate(url)))
    b.start()
    _generate(url)
    _generate(url)
    b.join(timeout=120)
    after = _executions(http)
    return {size: n - before.get(size, 0) for size, n in after.items() if n - before.get(size, 0)}


def _front(http: str, gate: object) -> object:
    from ftx_triton.front.server import Front
    from ftx_triton.front.shield import Shield

    upstream = int(http.rsplit(":", 1)[1])
    shield = Shield(upstream, gate=gate, gated_models=("fastertransformer", "text"))  # type: ignore[arg-type]
    front = Front(shield.app(), "127.0.0.1", 0)
    front.start()
    return front


def test_a_request_for_the_busy_model_goes_with_the_returning_client_not_alone(served: tuple[str, Path]) -> None:
    """Without the gate, B waits in the model's queue, goes alone when A's batch ends, and A's next request runs
    alone after it (three executions of one); with it, B waits at the front and goes with A's next request (one
    execution of two)."""
    from ftx_triton.front.model_gate import ModelGate

    http, _log = served
    for gate, expected in ((None, {1: 3}), (ModelGate(window_s=0.25), {1: 1, 2: 1})):
        front = _front(http, gate)
        try:
            assert _turns(f"http://127.0.0.1:{front.port}", http) == expected  # type: ignore[attr-defined]
        finally:
            front.stop()  # type: ignore[attr-defined]


def test_a_lone_client_is_not_held(served: tuple[str, Path]) -> None:
    """A client alone sends back to back: every request passes at once (the model is idle each time)."""
    from ftx_triton.front.model_gate import ModelGate

    http, _log = served
    gate = ModelGate(window_s=0.25)
    front = _front(http, gate)
    try:
        for _ in range(3):
            started = time.monotonic()
            ended = _generate(f"http://127.0.0.1:{front.port}")  # type: ignore[attr-defined]
            assert ended - started < EXECUTION_MS / 1e3 + 0.15
    finally:
        front.stop()  # type: ignore[attr-defined]
    assert gate.held == 0 and gate.in_flight == 0


def test_the_supervisor_gates_a_repository_whose_model_batches_with_a_delay(served: tuple[str, str]) -> None:
    """ftx's own front (the supervisor's) holds requests for the ensembles and the model, as its log says."""
    _http, log = served
    assert (
        "HTTP front holds requests for fastertransformer, ensemble, text while the model is busy (window 20 ms)" in log
    )
