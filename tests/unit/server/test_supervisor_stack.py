"""The stack limit the supervisor gives tritonserver (real rlimits, in a child process so the test's own
limits stay as they are): room for twice the largest body, or a smaller body limit where the hard limit
allows less."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

PROBE = (
    "import resource; from ftx_triton.server.supervisor import make_room_for_bodies; "
    "fits = make_room_for_bodies({body}); print(fits, resource.getrlimit(resource.RLIMIT_STACK)[0])"
)


def _probe(body: int, hard: int | None) -> tuple[int, int]:
    def limit() -> None:
        if hard is not None:
            resource.setrlimit(resource.RLIMIT_STACK, (min(8 << 20, hard), hard))

    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(body=body)],
        preexec_fn=limit,  # noqa: PLW1509 - setrlimit only
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return int(out[0]), int(out[1])


def test_the_soft_limit_is_raised_for_the_bodies_the_front_accepts() -> None:
    from ftx_triton.server.supervisor import stack_for

    _soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
    if hard != resource.RLIM_INFINITY and hard < stack_for(64 << 20):
        pytest.skip("this machine's hard stack limit is below what 64 MiB bodies need")
    fits, soft = _probe(64 << 20, None)
    assert fits == 64 << 20
    assert soft >= stack_for(64 << 20) > 128 << 20


def test_a_lower_hard_limit_shrinks_the_body_limit_to_what_fits() -> None:
    fits, soft = _probe(64 << 20, 24 << 20)
    assert soft == 24 << 20
    assert fits == (8 << 20) // 2  # (24 MiB - 16 MiB margin) / two copies
