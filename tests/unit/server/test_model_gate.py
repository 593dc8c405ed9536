"""The HTTP front's model gate (issue 38): a request for a busy model waits at the front until the model's answers
are back, then goes with the others; a lone request and a burst pass at once; nothing waits for good."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ftx_triton.errors import ConfigError
from ftx_triton.front.model_gate import WINDOW_ENV, ModelGate, gate_spec, gated_model
from ftx_triton.repository.model_config import parse_config, write_config


async def _call(gate: ModelGate, order: list[str], name: str, hold_s: float) -> None:
    async with gate.passage():
        order.append(f"{name} in")
        await asyncio.sleep(hold_s)
    order.append(f"{name} out")


def test_a_lone_request_and_a_burst_pass_at_once() -> None:
    async def scenario() -> tuple[list[str], int]:
        gate = ModelGate(window_s=0.2)
        order: list[str] = []
        await asyncio.gather(*(_call(gate, order, str(i), 0.05) for i in range(8)))
        await asyncio.sleep(0.3)  # the model is idle again: the next request finds the gate open
        await _call(gate, order, "lone", 0.0)
        return order, gate.held

    order, held = asyncio.run(scenario())
    assert order[:8] == [f"{i} in" for i in range(8)] and held == 0


def test_a_request_for_a_busy_model_waits_for_its_answers_then_goes_with_the_returning_clients() -> None:
    """Client A's request runs; B arrives after the window, while A's is in flight: B waits at the gate until A's
    answer is back and A's next request (sent at once) has joined it, then both go together."""

    async def scenario() -> tuple[list[str], int, int]:
        gate = ModelGate(window_s=0.05)
        order: list[str] = []

        async def client_a() -> None:
            await _call(gate, order, "a1", 0.3)
            await _call(gate, order, "a2", 0.1)

        async def client_b() -> None:
            await asyncio.sleep(0.15)
            await _call(gate, order, "b", 0.1)

        await asyncio.gather(client_a(), client_b())
        return order, gate.held, gate.releases

    order, held, releases = asyncio.run(scenario())
    # b entered only once a1's answer was back, together with a2
    assert order[:2] == ["a1 in", "a1 out"] and set(order[2:4]) == {"a2 in", "b in"}, order
    assert held == 2 and releases == 1


def test_a_client_that_does_not_come_back_delays_the_release_by_the_window_at_most() -> None:
    """Two requests go together and C is held; only one of the two clients sends again: the gate waits for the
    other up to ``window_s``, then releases C with the one that came back."""

    async def scenario() -> tuple[float, int]:
        gate = ModelGate(window_s=0.15)
        loop = asyncio.get_running_loop()
        freed: list[float] = []

        async def returning() -> None:
            await _call(gate, [], "a1", 0.2)
            freed.append(loop.time())
            await _call(gate, [], "a2", 0.0)

        async def late() -> None:
            await asyncio.sleep(0.17)  # after the window: held
            await _call(gate, [], "c", 0.0)

        await asyncio.gather(returning(), _call(gate, [], "b", 0.2), late())
        return loop.time() - freed[0], gate.releases

    waited, releases = asyncio.run(scenario())
    assert 0.1 <= waited < 1.0 and releases == 1


def test_a_held_request_whose_client_leaves_holds_nothing_up() -> None:
    async def scenario() -> tuple[int, int]:
        gate = ModelGate(window_s=0.01)
        busy = asyncio.ensure_future(_call(gate, [], "busy", 0.2))
        await asyncio.sleep(0.05)
        gone = asyncio.ensure_future(_call(gate, [], "gone", 0.0))
        await asyncio.sleep(0.02)
        gone.cancel()
        await asyncio.gather(busy, gone, return_exceptions=True)
        await asyncio.sleep(0.02)
        await asyncio.wait_for(_call(gate, [], "next", 0.0), 1)  # the gate is open again: nothing leaked
        return gate.in_flight, len(gate._waiters)

    assert asyncio.run(scenario()) == (0, 0)


def test_an_answer_that_never_comes_holds_a_request_at_most_most_s() -> None:
    async def scenario() -> float:
        gate = ModelGate(window_s=0.01, most_s=0.2)
        stuck = asyncio.ensure_future(_call(gate, [], "stuck", 30.0))
        await asyncio.sleep(0.05)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.wait_for(_call(gate, [], "held", 0.0), 5)
        stuck.cancel()
        return loop.time() - started

    assert 0.15 <= asyncio.run(scenario()) < 2


@pytest.mark.parametrize(
    ("path", "gated"),
    [
        ("/v2/models/text/generate", True),
        ("/v2/models/fastertransformer/infer", True),
        ("/v2/models/text/versions/1/infer", True),
        ("/v2/models/text/generate_stream", False),
        ("/v2/models/preprocessing/infer", False),
        ("/v2/models/text", False),
        ("/v2/models/text/infer/extra", False),
    ],
)
def test_only_answers_in_one_piece_from_the_gated_models_are_gated(path: str, gated: bool) -> None:
    assert gated_model(path, frozenset({"text", "fastertransformer"})) is gated


def _repository(root: Path, *, delay_us: int, instances: int) -> Path:
    from tritonclient.grpc import model_config_pb2 as mc

    ft = mc.ModelConfig(name="fastertransformer", backend="python", max_batch_size=8)
    ft.instance_group.add(count=instances, kind=mc.ModelInstanceGroup.KIND_CPU)
    ft.dynamic_batching.max_queue_delay_microseconds = delay_us
    write_config(ft, root / "fastertransformer")
    ensemble = mc.ModelConfig(name="text", platform="ensemble", max_batch_size=8)
    ensemble.ensemble_scheduling.step.add(model_name="preprocessing", model_version=-1)
    ensemble.ensemble_scheduling.step.add(model_name="fastertransformer", model_version=-1)
    write_config(ensemble, root / "text")
    write_config(mc.ModelConfig(name="preprocessing", backend="python"), root / "preprocessing")
    return root


def test_the_gate_is_for_one_batched_instance_with_a_delay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(WINDOW_ENV, raising=False)
    assert gate_spec(_repository(tmp_path / "default", delay_us=20000, instances=1)) is None  # opt-in
    monkeypatch.setenv(WINDOW_ENV, "20000")
    repo = _repository(tmp_path / "one", delay_us=20000, instances=1)
    assert gate_spec(repo) == {"models": ["fastertransformer", "text"], "window_s": 0.02}
    assert (
        gate_spec(_repository(tmp_path / "two", delay_us=20000, instances=2)) is None
    )  # an idle instance could run it
    assert gate_spec(_repository(tmp_path / "zero", delay_us=0, instances=1)) is None  # "send what is queued at once"
    config = parse_config(repo / "fastertransformer" / "config.pbtxt")
    config.ClearField("dynamic_batching")
    write_config(config, repo / "fastertransformer")
    assert gate_spec(repo) is None
    assert gate_spec(tmp_path) is None  # no fastertransformer model


def test_the_environment_sets_the_window_and_zero_leaves_the_gate_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = _repository(tmp_path, delay_us=20000, instances=1)
    monkeypatch.setenv(WINDOW_ENV, "5000")
    assert gate_spec(repo) == {"models": ["fastertransformer", "text"], "window_s": 0.005}
    monkeypatch.setenv(WINDOW_ENV, "0")
    assert gate_spec(repo) is None
    monkeypatch.setenv(WINDOW_ENV, "soon")
    with pytest.raises(ConfigError, match=WINDOW_ENV):
        gate_spec(repo)


def test_the_gate_off_reads_no_config_and_imports_no_config_parser(tmp_path: Path) -> None:
    """Off (the default), a server's start decides it without protobuf's parser (tritonclient's gRPC package with
    numpy: 0.2 CPU-s of ftx's serve stage, beside the models' load)."""
    repo = _repository(tmp_path, delay_us=20000, instances=1)
    code = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from ftx_triton.front.model_gate import gate_spec\n"
        f"spec = gate_spec(Path({str(repo)!r}))\n"
        "print(json.dumps([spec, 'ftx_triton.repository.model_config' in sys.modules, 'numpy' in sys.modules]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != WINDOW_ENV}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == [None, False, False]
