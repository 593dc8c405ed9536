"""server_log.exit_cause on what a crashed native server's log holds."""

from __future__ import annotations

from ftx_triton.server.server_log import exit_cause

# The tail of a real server log (four GPUs, tp 4, streaming, 2026-11-27): one rank's NCCL call failed, FasterTransformer
# ended the process, and tritonserver's signal handler printed the crash of another rank's thread.
NCCL_CRASH = (
    "[FT][INFO] ftx: decoding step captured in a CUDA graph (366 nodes), replayed at each step\n"
    "Failed, NCCL error /src/FasterTransformer/src/fastertransformer/utils/nccl_utils.cc:64 "
    "'unhandled cuda error (run with NCCL_DEBUG=INFO for details)'\n"
    "Signal (11) received.\n"
    " 0# 0x000055B076D3752D in /opt/tritonserver/bin/tritonserver\n"
    " 8# cublasLtMatmul in /usr/local/cuda-13.0/lib64/libcublasLt.so.13\n"
)


def test_a_failed_nccl_call_is_named_before_the_crash_it_causes() -> None:
    cause = exit_cause(NCCL_CRASH)
    assert cause is not None
    assert cause.startswith(
        "FasterTransformer's NCCL call failed: unhandled cuda error (run with NCCL_DEBUG=INFO for details) "
        "(/src/FasterTransformer/src/fastertransformer/utils/nccl_utils.cc:64)"
    ), cause
    assert "tritonserver crashed with SIGSEGV" in cause


def test_a_stop_that_was_asked_for_has_no_cause() -> None:
    assert exit_cause("Signal (15) received.\n") is None
