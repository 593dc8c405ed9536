"""The supervisor forks tritonserver while the gRPC front's threads run: grpcio's fork handlers must stay out of
that child (with them on, tritonserver now and then died with SIGABRT at start under load)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

_CHILDREN_WHILE_THE_FRONT_RUNS = textwrap.dedent(
    """
    import socket, subprocess
    from ftx_triton.front.grpc_front import GrpcFront
    probe = socket.socket(); probe.bind(("127.0.0.1", 0)); port = probe.getsockname()[1]; probe.close()
    front = GrpcFront("127.0.0.1", port, 1, max_message_bytes=1 << 20)
    front.start()
    try:
        codes = {subprocess.Popen(["true"], preexec_fn=lambda: None).wait() for _ in range(20)}
    finally:
        front.stop()
    print(sorted(codes))
    """
)


def test_children_forked_beside_the_grpc_front_run_without_grpcs_fork_handlers() -> None:
    env = {"GRPC_ENABLE_FORK_SUPPORT": "true", "PATH": "/usr/bin:/bin"}  # a stranger's environment asks for them
    done = subprocess.run(
        [sys.executable, "-c", _CHILDREN_WHILE_THE_FRONT_RUNS], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[0]", done.stdout
    assert "fork() handlers" not in done.stderr, done.stderr
