"""The gRPC front: the public gRPC port, with a message size limit tritonserver 2.51 does not have.

tritonserver takes gRPC messages of any size (its receive limit is INT32_MAX, with no option to lower
it): 400 and 800 MB messages, or a gzip message of under 1 MB on the wire that inflates to 600 MB, grew
it by gigabytes it never gave back. So tritonserver's gRPC listens on the loopback, on a port only the
supervisor knows, and this front (a grpcio ``aio`` server) listens where the user asked for gRPC and
relays each call of Triton's service (and the gRPC health check) to it as bytes, never parsed:

* a message over ``max_message_bytes`` is refused by grpcio before the call reaches tritonserver
  (``RESOURCE_EXHAUSTED``); grpcio applies the limit to the *decompressed* message, so a compressed
  message that inflates past it is refused too;
* at most ``max_concurrent_rpcs`` calls run at once
  (more are refused with ``RESOURCE_EXHAUSTED``), a connection without calls closes after
  :data:`IDLE_TIMEOUT_S`, and the port is bound exclusively (grpcio would otherwise share it with
  another process through ``SO_REUSEPORT``);
* calls keep their metadata (the admin key of restricted APIs included), deadline and cancellation;
  tritonserver's errors come back with their code and message; streams (``ModelStreamInfer``) are
  relayed message by message in both directions.

Answers from tritonserver are not limited (they are the server's own).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

# The supervisor forks tritonserver (a preexec_fn) while this front's threads run; with grpcio's fork support on,
# its fork handlers ran in that child ("Other threads are currently calling into gRPC, skipping fork() handlers")
# and tritonserver died with SIGABRT at start, now and then. The child only execs, so the support is turned
# off before grpcio reads it (at import), whatever the environment says.
os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "false"

import grpc  # noqa: E402
from grpc import aio  # noqa: E402

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""The same limit as the HTTP front's body."""
IDLE_TIMEOUT_S = 120.0
"""A connection with no call for this long is closed (the HTTP front's keep-alive timeout)."""
_HEALTH_CHECK = "/grpc.health.v1.Health/Check"
_HOP_BY_HOP = frozenset({"user-agent", "te", "content-type", "host"})


SERVICE = "inference.GRPCInferenceService"
STREAMED = frozenset({"ModelStreamInfer"})
"""The methods of Triton's gRPC service that stream both ways; every other one is one message each way."""
METHODS = (
    "ServerLive",
    "ServerReady",
    "ModelReady",
    "ServerMetadata",
    "ModelMetadata",
    "ModelInfer",
    "ModelStreamInfer",
    "ModelConfig",
    "ModelStatistics",
    "RepositoryIndex",
    "RepositoryModelLoad",
    "RepositoryModelUnload",
    "SystemSharedMemoryStatus",
    "SystemSharedMemoryRegister",
    "SystemSharedMemoryUnregister",
    "CudaSharedMemoryStatus",
    "CudaSharedMemoryRegister",
    "CudaSharedMemoryUnregister",
    "TraceSetting",
    "LogSettings",
)
"""Triton's gRPC service as its ``grpc_service.proto`` declares it (a test holds it to tritonclient's descriptor):
written out, so that the supervisor does not import tritonclient's client, numpy and protobuf (0.15-0.2 s of CPU
while the models load) for its names."""


def service_methods() -> dict[str, bool]:
    """Method path -> True for a stream of both ways, False for one message each way."""
    methods = {f"/{SERVICE}/{name}": name in STREAMED for name in METHODS}
    return {**methods, _HEALTH_CHECK: False}


def _forwarded(metadata: Any) -> tuple[tuple[str, Any], ...]:
    return tuple(
        (key, value) for key, value in (metadata or ()) if not key.startswith((":", "grpc-")) and key not in _HOP_BY_HOP
    )


class _Relay(grpc.GenericRpcHandler):
    """Relays each known method to tritonserver's own gRPC port."""

    def __init__(self, channel: aio.Channel) -> None:
        self.channel = channel
        self.handlers: dict[str, grpc.RpcMethodHandler] = {
            method: grpc.stream_stream_rpc_method_handler(self._stream(method))
            if streamed
            else grpc.unary_unary_rpc_method_handler(self._unary(method))
            for method, streamed in service_methods().items()
        }

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return self.handlers.get(handler_call_details.method)

    def _unary(self, method: str) -> Callable[[bytes, aio.ServicerContext], Any]:
        call_upstream = self.channel.unary_unary(method)

        async def relay(request: bytes, context: aio.ServicerContext) -> bytes:
            call = call_upstream(
                request, metadata=_forwarded(context.invocation_metadata()), timeout=context.time_remaining()
            )
            try:
                return await call
            except aio.AioRpcError as exc:
                await context.abort(exc.code(), exc.details() or "", _forwarded(exc.trailing_metadata()))
                raise  # abort raises; this keeps the type checker informed

        return relay

    def _stream(self, method: str) -> Callable[[AsyncIterator[bytes], aio.ServicerContext], AsyncIterator[bytes]]:
        call_upstream = self.channel.stream_stream(method)

        async def relay(requests: AsyncIterator[bytes], context: aio.ServicerContext) -> AsyncIterator[bytes]:
            call = call_upstream(
                requests, metadata=_forwarded(context.invocation_metadata()), timeout=context.time_remaining()
            )
            try:
                async for response in call:
                    yield response
            except aio.AioRpcError as exc:
                await context.abort(exc.code(), exc.details() or "", _forwarded(exc.trailing_metadata()))
            finally:
                call.cancel()  # the client left or the stream ended: nothing more to relay

        return relay


class GrpcFront:
    """One gRPC listener on ``host:port`` relaying to tritonserver's gRPC on ``127.0.0.1:upstream_port``."""

    def __init__(
        self,
        host: str,
        port: int,
        upstream_port: int,
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_concurrent_rpcs: int = 512,
    ) -> None:
        self.host, self.port, self.upstream_port = host, port, upstream_port
        self.max_message_bytes = max_message_bytes
        self.max_concurrent_rpcs = max_concurrent_rpcs
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._bound = threading.Event()
        self._error: BaseException | None = None

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def start(self) -> None:
        """Bind and serve in a daemon thread of its own; OSError when the port cannot be bound."""
        self._thread = threading.Thread(target=asyncio.run, args=(self._serve(),), name="ftx-grpc-front", daemon=True)
        self._thread.start()
        self._bound.wait(30)
        if self._error is not None:
            raise OSError(f"cannot listen on {self.address}: {self._error}")

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        channel = aio.insecure_channel(
            f"127.0.0.1:{self.upstream_port}",
            options=[("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)],
        )
        server = aio.server(
            handlers=[_Relay(channel)],
            maximum_concurrent_rpcs=self.max_concurrent_rpcs,
            options=[
                ("grpc.max_receive_message_length", self.max_message_bytes),
                ("grpc.max_send_message_length", -1),
                ("grpc.max_connection_idle_ms", int(IDLE_TIMEOUT_S * 1000)),
                ("grpc.so_reuseport", 0),
            ],
        )
        try:
            server.add_insecure_port(self.address)
            await server.start()
        except Exception as exc:  # noqa: BLE001 - grpcio says a taken port with a RuntimeError
            self._error = exc
            self._bound.set()
            await channel.close()
            return
        self._bound.set()
        try:
            await self._stopped.wait()
        finally:
            await server.stop(grace=1.0)
            await channel.close()

    def stop(self) -> None:
        """End serving (from any thread)."""
        loop, stopped = self._loop, self._stopped
        if loop is not None and stopped is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stopped.set)
        if self._thread is not None and threading.current_thread() is not self._thread:
            self._thread.join(10)


__all__ = ["DEFAULT_MAX_MESSAGE_BYTES", "GrpcFront", "service_methods"]
