"""The OpenAI endpoint's send gate (issue 38): requests prepared together reach the model together."""

from __future__ import annotations

import asyncio

import pytest
from ftx_triton.client.send_gate import GATHER_ENV, MOST_S, SendGate, send_gate
from ftx_triton.errors import ConfigError


async def _group(gate: SendGate) -> int:
    await gate.wait()
    return gate.releases


def test_a_burst_goes_as_one_group_and_a_later_request_as_the_next() -> None:
    """Requests prepared one after another without a pause are released together; one prepared after the front
    fell quiet goes alone (asyncio fires the gate's timer before the later one's, whatever the machine's load). The
    cap is set out of the way: 64 turns of a loaded loop can outlast its default 20 ms (the next test covers it)."""

    async def scenario() -> tuple[list[int], int]:
        gate = SendGate(quiet_s=0.2, most_s=30.0)
        burst = []
        for _ in range(64):  # each prepared in its own turn of the loop, as the front's handlers are
            burst.append(asyncio.ensure_future(_group(gate)))
            await asyncio.sleep(0)
        groups = await asyncio.gather(*burst)
        await asyncio.sleep(0.5)
        return groups, await _group(gate)

    groups, later = asyncio.run(scenario())
    assert set(groups) == {1} and later == 2


def test_a_front_that_never_falls_quiet_still_sends_at_the_cap() -> None:
    """Requests that keep coming are released at least every ``most_s``: none waits for good."""

    async def scenario() -> list[int]:
        gate = SendGate(quiet_s=0.05, most_s=0.01)
        waiting = []
        for _ in range(10):
            waiting.append(asyncio.ensure_future(_group(gate)))
            await asyncio.sleep(0.005)
        return await asyncio.wait_for(asyncio.gather(*waiting), 5)

    groups = asyncio.run(scenario())
    assert len(set(groups)) >= 2 and groups == sorted(groups)


def test_the_environment_sets_the_quiet_period_and_zero_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(GATHER_ENV, raising=False)
    gate = send_gate()
    assert gate is not None and gate.quiet_s == 0.002
    monkeypatch.setenv(GATHER_ENV, "500")
    assert send_gate().quiet_s == 0.0005  # type: ignore[union-attr]
    monkeypatch.setenv(GATHER_ENV, "0")
    assert send_gate() is None
    for bad in ("-1", "fast", str(int(MOST_S * 1e6) + 1)):
        monkeypatch.setenv(GATHER_ENV, bad)
        with pytest.raises(ConfigError, match=GATHER_ENV):
            send_gate()


def test_an_endpoint_given_a_bad_value_says_so_and_exits(tmp_path) -> None:
    """The endpoint process refuses to start on a bad ``FTX_OPENAI_GATHER_US`` with ``error:``/``hint:`` (what
    ``ftx run`` shows from its log), not a traceback, and binds nothing."""
    import os
    import subprocess
    import sys

    env = {**os.environ, GATHER_ENV: "soon"}
    command = [sys.executable, "-m", "ftx_triton.openai_api", "--triton", "http://127.0.0.1:9", "--model-id", "m"]
    command += ["--tokenizer", str(tmp_path / "preprocessing" / "1"), "--port", "0"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2, done.stderr
    assert f"error: {GATHER_ENV}='soon'" in done.stderr and "hint:" in done.stderr
    assert "Traceback" not in done.stderr
