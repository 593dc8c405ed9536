"""The front against hostile HTTP (issue 27, "Requests"): real tritonserver behind the shield (the
supervisor's front), plus fronts started in this process on real sockets where a test needs limits of
its own (timeouts, the connection cap). Each test fails on the stdlib front this replaced."""

from __future__ import annotations

import gzip
import json
import socket
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator
from importlib.util import find_spec

import pytest
from triton_helpers import add_repository, infer_http

pytestmark = pytest.mark.skipif(find_spec("pytriton") is None, reason="nvidia-pytriton is not installed")

_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_INFER = "/v2/models/add_one/infer"


def _nested(depth: int, prefix: bytes = b"") -> bytes:
    return (
        b'{"inputs":[{"name":"input_ids","shape":[1,1],"datatype":"INT32",'
        + prefix
        + b'"data":'
        + b"[" * depth
        + b"]" * depth
        + b"}]}"
    )


def _post(url: str, body: bytes, headers: dict[str, str] | None = None, path: str = _INFER) -> tuple[int, str]:
    request = urllib.request.Request(f"http://{url}{path}", data=body, method="POST", headers=headers or {})
    try:
        with _DIRECT.open(request, timeout=120) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from ftx_triton.server.tritonserver import TritonServer

    root = tmp_path_factory.mktemp("front")
    repo = add_repository(root / "repo")
    with TritonServer(
        repo, home=root / "home", model_control="explicit", load_models=["add_one"], max_body_bytes=8 * 1024 * 1024
    ) as running:
        yield running


def _alive(server: object) -> None:
    assert server.running  # type: ignore[attr-defined]
    assert infer_http(server.http_url, "add_one").tolist() == [[2, 3, 4], [5, 6, 7]]  # type: ignore[attr-defined]


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_nested_json_in_a_compressed_body_is_refused(server: object, encoding: str) -> None:
    body = _nested(300_000)
    packed = gzip.compress(body) if encoding == "gzip" else zlib.compress(body)
    status, text = _post(server.http_url, packed, {"Content-Encoding": encoding})  # type: ignore[attr-defined]
    assert status == 400 and "nested deeper" in text, text
    _alive(server)


def test_nested_json_that_is_not_utf8_is_refused(server: object) -> None:
    status, text = _post(server.http_url, _nested(300_000, b'"x":"\xff\xfe",'))  # type: ignore[attr-defined]
    assert status == 400 and "nested deeper" in text, text
    _alive(server)


def test_brackets_inside_strings_do_not_count_and_valid_requests_pass(server: object) -> None:
    from ftx_triton.front.shield import json_depth

    assert json_depth(b'{"a": "[[[[[[[[", "b": [1, [2]]}') == 3
    assert json_depth(b'["\\"[[[[", [[]]]') == 3
    assert json_depth(b"[" * 100) == 100  # unclosed brackets count: a parser recurses before it fails
    body = json.dumps(
        {
            "inputs": [{"name": "input_ids", "shape": [2, 3], "datatype": "INT32", "data": [1, 2, 3, 4, 5, 6]}],
            "id": "[" * 5000,
        }
    ).encode()
    status, text = _post(server.http_url, gzip.compress(body), {"Content-Encoding": "gzip"})  # type: ignore[attr-defined]
    assert status == 200 and json.loads(text)["outputs"][0]["data"] == [2, 3, 4, 5, 6, 7], text


def test_a_decompression_bomb_is_refused_by_its_decoded_size(server: object) -> None:
    bomb = gzip.compress(b" " * (64 * 1024 * 1024))  # 64 MB of spaces in about 64 KB
    assert len(bomb) < 200_000
    status, text = _post(server.http_url, bomb, {"Content-Encoding": "gzip"})  # type: ignore[attr-defined]
    assert status == 413 and "decoded" in text and "8388608" in text, text
    _alive(server)


@pytest.mark.parametrize("encoding", ["br", "compress", "gzip, gzip", "x-anything"])
def test_unknown_content_encodings_are_refused(server: object, encoding: str) -> None:
    status, text = _post(server.http_url, b'{"inputs": []}', {"Content-Encoding": encoding})  # type: ignore[attr-defined]
    assert status == 415 and "Content-Encoding" in text, text


def test_malformed_json_is_the_clients_400_not_tritons_500(server: object) -> None:
    status, text = _post(server.http_url, b'{"inputs": [{"name": "input_ids", ')  # type: ignore[attr-defined]
    assert status == 400 and "not valid JSON" in text, text


def _raw(url: str, data: bytes, *, wait_s: float = 60) -> bytes:
    """Send ``data`` on a new connection (left open) and return what comes back until the server closes
    or ``wait_s`` passes."""
    host, port = url.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=wait_s) as sock:
        sock.sendall(data)
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except TimeoutError:
            pass
        return answer


@pytest.mark.parametrize("size", [b"-1", b"-0x10", b"0x10", b"zz", b"1" * 40])
def test_a_malformed_chunk_size_is_refused_at_once(server: object, size: bytes) -> None:
    """Answered while the connection is still open: the old front read a negative size to the end."""
    head = (
        b"POST " + _INFER.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + size + b"\r\n" + b"[" * 1000
    )
    answer = _raw(server.http_url, head, wait_s=30)  # type: ignore[attr-defined]
    assert answer[:12] in (b"HTTP/1.1 400", b"HTTP/1.0 400") and b"hunk size" in answer, answer[:200]
    _alive(server)


def test_a_body_within_the_limit_does_not_overflow_tritonservers_stack(server: object) -> None:
    """tritonserver 2.51 copies a body onto its HTTP thread's stack: under the usual 8 MiB stack a 4.2 MB
    body killed it with SIGSEGV. The supervisor gives it a stack for the front's 8 MiB limit."""
    body = json.dumps({"inputs": [], "padding": "x" * (7 * 1024 * 1024)}).encode()
    status, text = _post(server.http_url, body, path="/v2/models/no_such_model/infer")  # type: ignore[attr-defined]
    assert status == 404 and "unknown model" in text, text[:300]
    _alive(server)


def test_objects_with_thousands_of_members_are_refused(server: object) -> None:
    """tritonserver looks members up one by one: 20 000 keys in ``parameters`` took it 3 s of a core,
    50 000 took 35 s (quadratic); the shield refuses the request instead."""
    for body in (
        {"inputs": [], "parameters": {f"p{i}": 1 for i in range(20_000)}},
        {"inputs": [{"name": "input_ids", "shape": [1, 1], "datatype": "INT32", "data": [1]}] * 5000},
    ):
        began = time.monotonic()
        status, text = _post(server.http_url, json.dumps(body).encode())  # type: ignore[attr-defined]
        assert status == 400 and ("members" in text or "JSON objects" in text), text[:300]
        assert time.monotonic() - began < 60
    _alive(server)


@pytest.mark.parametrize(
    "body",
    [
        b'{"inputs": [], "parameters": {"x": NaN}}',
        b'{"inputs": [], "parameters": {"x": -Infinity}}',
        b'{"inputs": [], "parameters": {"x": 1e400}}',
        b'{"inputs": [], "id": "\\ud800"}',
        b'{"inputs": [], "\\udfff": 1}',
        '{"inputs": [], "id": "x"}'.encode("utf-16"),
        '{"inputs": [], "id": "x"}'.encode("utf-32"),
    ],
    ids=["nan", "infinity", "overflow", "lone-surrogate", "surrogate-key", "utf16", "utf32"],
)
def test_json_only_pythons_parser_takes_is_the_clients_400(server: object, body: bytes) -> None:
    """Python's parser takes these, tritonserver's does not and called them its own fault (500)."""
    status, text = _post(server.http_url, body)  # type: ignore[attr-defined]
    assert status == 400 and ("not valid JSON" in text or "surrogate" in text), (status, text[:300])


def test_every_answer_names_only_ftx_as_the_server(server: object) -> None:
    """aiohttp's default ``Server`` header gave its own and Python's versions away."""
    url = server.http_url  # type: ignore[attr-defined]
    answers = [
        _raw(url, b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),  # forwarded
        _raw(url, b"POST /v2 HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n\r\n[["),  # refused
        _raw(url, b"GET /v2 HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", wait_s=30),  # aiohttp's parser
    ]
    for answer in answers:
        head = answer.split(b"\r\n\r\n", 1)[0].lower()
        assert head.startswith(b"http/1."), answer[:200]
        assert b"\r\nserver: ftx" in head and b"aiohttp" not in head and b"python" not in head, head


def test_admin_apis_from_this_machine_still_work(server: object) -> None:
    status, text = _post(server.http_url, b'{"log_verbose_level": 0}', path="/v2/logging")  # type: ignore[attr-defined]
    assert status == 200 and '"log_verbose_level":0' in text, text


def test_loopback_addresses() -> None:
    from ftx_triton.front.addresses import is_loopback

    assert all(map(is_loopback, ["127.0.0.1", "127.3.2.1", "::1", "[::1]", "::ffff:127.0.0.1", "localhost"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "10.0.0.1", "::ffff:10.0.0.1", "", None, "example.com"]))


# --------------------------------------------------------------------------- fronts with limits of their own


@pytest.fixture
def front(server: object) -> Iterator[object]:
    """A front in this process with short timeouts and a cap of 4 connections, before the real server."""
    from ftx_triton.front.server import Front, Limits
    from ftx_triton.front.shield import Shield

    upstream = int(server.http_url.rsplit(":", 1)[1])  # type: ignore[attr-defined]
    made = Front(
        Shield(upstream).app(),
        "127.0.0.1",
        0,
        Limits(header_timeout_s=1.0, body_timeout_s=1.0, idle_timeout_s=2.0, max_connections=4),
    )
    made.start()
    yield made
    made.stop()


def test_half_sent_headers_are_cut_off(front: object) -> None:
    url = f"127.0.0.1:{front.port}"  # type: ignore[attr-defined]
    host, port = url.split(":")
    began = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(b"POST " + _INFER.encode() + b" HTTP/1.1\r\nHost: x\r\n")
        closed = False
        for _ in range(100):  # one header byte every 0.2 s: never done
            try:
                sock.sendall(b"X")
                if sock.recv(1, socket.MSG_DONTWAIT) == b"":
                    closed = True
                    break
            except BlockingIOError:
                pass
            except OSError:
                closed = True
                break
            time.sleep(0.2)
    assert closed and time.monotonic() - began < 20
    assert front.slow_closed >= 1  # type: ignore[attr-defined]


def test_a_half_sent_body_is_answered_408(front: object) -> None:
    head = b"POST " + _INFER.encode() + b' HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"inputs"'
    answer = _raw(f"127.0.0.1:{front.port}", head, wait_s=60)  # type: ignore[attr-defined]
    assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive" in answer, answer[:300]


def test_an_idle_connection_is_closed_and_the_cap_refuses_the_fifth(front: object) -> None:
    port = front.port  # type: ignore[attr-defined]
    held = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(4)]
    try:
        deadline = time.monotonic() + 30
        while front.open_connections < 4 and time.monotonic() < deadline:  # type: ignore[attr-defined]
            time.sleep(0.05)
        answer = _raw(f"127.0.0.1:{port}", b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n", wait_s=30)
        assert answer.startswith(b"HTTP/1.1 503") and b"limit of 4 connections" in answer, answer[:300]
        for sock in held:  # the header timeout closes each of them
            assert sock.recv(1) == b""
    finally:
        for sock in held:
            sock.close()
    status, _text = _post(f"127.0.0.1:{port}", b"", path="/v2/repository/index")
    assert status == 200


@pytest.fixture
def remote_view(server: object) -> Iterator[object]:
    """A front whose every client counts as one on another machine: a stand-in for a remote client,
    which a loopback-only test cannot have."""
    from ftx_triton.front.server import Front
    from ftx_triton.front.shield import Shield

    upstream = int(server.http_url.rsplit(":", 1)[1])  # type: ignore[attr-defined]
    made = Front(Shield(upstream, trusted_peer=lambda _remote: False).app(), "127.0.0.1", 0)
    made.start()
    yield made
    made.stop()


@pytest.mark.parametrize(
    "path",
    [
        "/v2/logging",
        "/v2/trace/setting",
        "/v2/models/add_one/trace/setting",
        "/v2/systemsharedmemory/region/leak/register",
        "/v2/systemsharedmemory/status",
        "/v2/cudasharedmemory/region/leak/register",
        "/v2/repository/models/add_one/unload",
        "/V2/Logging/",
    ],
)
def test_admin_apis_are_refused_to_clients_elsewhere(remote_view: object, path: str) -> None:
    """A client elsewhere (``--host`` wider than loopback) could register any /dev/shm region of the host
    as a tensor, or set log_verbose_level (24 KB of log per request) until the disk is full."""
    url = f"127.0.0.1:{remote_view.port}"  # type: ignore[attr-defined]
    body = b'{"log_verbose_level": 2, "key": "/triton_python_backend_shm_region_x", "offset": 0, "byte_size": 64}'
    status, text = _post(url, body, path=path)
    assert status == 403 and "this machine only" in text, (status, text)


def test_inference_and_reads_still_reach_tritonserver_from_elsewhere(remote_view: object) -> None:
    url = f"127.0.0.1:{remote_view.port}"  # type: ignore[attr-defined]
    assert infer_http(url, "add_one").tolist() == [[2, 3, 4], [5, 6, 7]]
    status, text = _post(url, b"", path="/v2/repository/index")
    assert status == 200 and "add_one" in text, text
    request = urllib.request.Request(f"http://{url}/v2/logging", method="GET")
    with _DIRECT.open(request, timeout=60) as response:
        assert response.status == 200 and b"log_verbose_level" in response.read()


def test_a_wider_address_keeps_grpc_admin_apis_behind_a_key(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tritonserver on an address wider than loopback: its gRPC admin APIs need a key nobody has. The
    server binds 127.0.0.1 here, told it is wider (a loopback-only test binds nothing else)."""
    import tritonclient.grpc as grpcclient
    from ftx_triton.server import tritonserver
    from ftx_triton.server.tritonserver import TritonServer
    from tritonclient.utils import InferenceServerException

    monkeypatch.setattr(tritonserver, "is_loopback", lambda _host: False)
    root = tmp_path_factory.mktemp("wide")
    repo = add_repository(root / "repo")
    with TritonServer(repo, home=root / "home", model_control="explicit", load_models=["add_one"]) as running:
        client = grpcclient.InferenceServerClient(running.grpc_url)
        with pytest.raises(InferenceServerException, match="(?i)restricted|permission|unavailable|key"):
            client.update_log_settings({"log_verbose_level": 2})
        assert client.is_model_ready("add_one")
        status, text = _post(running.http_url, b'{"log_verbose_level": 0}', path="/v2/logging")
        assert status == 200, text  # clients on this machine go through the front


# --------------------------------------------------------------------------- round 4 (issue 33)


def _local_address_elsewhere() -> str | None:
    """An IPv4 address of this machine that is not loopback: a client connecting to it from here has it
    as its own address, so the front sees a client on another machine."""
    import psutil

    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not address.address.startswith("127."):
                return str(address.address)
    return None


@pytest.fixture
def from_elsewhere(server: object) -> Iterator[str]:
    """``host:port`` of a front whose clients are not on the loopback: the real check through this machine's
    non-loopback address where it has one (a wider ``--host``), else a front that counts every client as
    remote (a loopback-only machine has no second address)."""
    from ftx_triton.front.server import Front
    from ftx_triton.front.shield import Shield

    upstream = int(server.http_url.rsplit(":", 1)[1])  # type: ignore[attr-defined]
    address = _local_address_elsewhere()
    shield = Shield(upstream) if address else Shield(upstream, trusted_peer=lambda _remote: False)
    made = Front(shield.app(), address or "127.0.0.1", 0)
    made.start()
    yield f"{address or '127.0.0.1'}:{made.port}"
    made.stop()


_ADMIN_SPELLINGS = [
    "/v2/./logging",
    "/v2/x/../logging",
    "/./v2/logging",
    "/v2/models/add_one/../../logging",
    "/v2/%2e/logging",
    "/v2/%2E%2E/v2/logging",
    "/v2/x/%2e%2e/logging",
    "/v2/x/.%2E/logging",
    "/v2/x/%2E./logging",
    "/v2/x/..%2Flogging",
    "/v2%2flogging",
    "/v2/x/..%5clogging",
    "//v2/logging",
    "/v2//logging",
    "/v2/logging//",
    "/v2/%6Cogging",
    "/v2/log%67ing",
    "/V2/LOGGING",
    "/v2/logging?x=/../",
    "/v2/./systemsharedmemory/region/r/register",
    "/v2/cudasharedmemory/./region/r/register",
    "/v2/%73ystemsharedmemory/region/r/register",
    "/v2/repository/models/add_one/%2e/unload",
    "/v2/trace/x/../setting",
    "http://x/v2/./logging",
]


@pytest.mark.parametrize("path", _ADMIN_SPELLINGS)
def test_no_spelling_of_an_admin_path_passes_the_guard(server: object, from_elsewhere: str, path: str) -> None:
    """Issue 33: the guard checked ``/v2/./logging`` as it came while the forward resolved it to
    ``/v2/logging`` (200 from another machine). Each spelling is refused (403, or 400 for dot segments and
    encoded separators) and tritonserver's settings are unchanged."""
    body = b'{"log_verbose_level": 3, "key": "/triton_python_backend_shm_region_x", "offset": 0, "byte_size": 64}'
    request = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    answer = _raw(from_elsewhere, request, wait_s=30)
    status = answer[9:12]
    assert status in (b"400", b"403"), answer[:300]
    assert b"this machine only" in answer or b"segment" in answer or b"encoded" in answer, answer[:300]
    request = urllib.request.Request(f"http://{server.http_url}/v2/logging", method="GET")  # type: ignore[attr-defined]
    with _DIRECT.open(request, timeout=60) as response:
        assert json.loads(response.read())["log_verbose_level"] == 0


def test_dot_segments_are_refused_for_every_route_and_plain_paths_pass(server: object) -> None:
    """One path policy for all requests: what is forwarded is what was checked, byte for byte."""
    url = server.http_url  # type: ignore[attr-defined]
    answer = _raw(url, b"GET /v2/models/x/../add_one/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400") and b"segment" in answer, answer[:300]
    answer = _raw(url, b"GET /v2/models/add_one/ready?a=%2e%2e HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]  # a query is no path
    _alive(server)


def _head(answer: bytes) -> bytes:
    return answer.split(b"\r\n\r\n", 1)[0].lower()


def test_answers_are_compressed_only_for_clients_that_ask(server: object) -> None:
    """Issue 33: the front asked tritonserver for gzip on every request, so every client got gzip."""
    url = server.http_url  # type: ignore[attr-defined]
    body = json.dumps(
        {"inputs": [{"name": "input_ids", "shape": [2, 3], "datatype": "INT32", "data": [1, 2, 3, 4, 5, 6]}]}
    ).encode()
    infer = f"POST {_INFER} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {len(body)}\r\n".encode()
    plain = _raw(url, infer + b"\r\n" + body)
    assert plain.startswith(b"HTTP/1.1 200") and b"content-encoding" not in _head(plain), _head(plain)
    assert json.loads(plain.split(b"\r\n\r\n", 1)[1])["outputs"][0]["data"] == [2, 3, 4, 5, 6, 7]
    asked = _raw(url, infer + b"Accept-Encoding: gzip\r\n\r\n" + body)
    assert b"content-encoding: gzip" in _head(asked), _head(asked)
    packed = asked.split(b"\r\n\r\n", 1)[1]
    assert json.loads(gzip.decompress(packed))["outputs"][0]["data"] == [2, 3, 4, 5, 6, 7]


def _tritonserver_rss(server: object) -> int:
    import psutil

    supervisor = psutil.Process(server.pid)  # type: ignore[attr-defined]
    triton = next(p for p in supervisor.children() if p.name() == "tritonserver")
    return int(triton.memory_info().rss)


def test_grpc_messages_over_the_limit_are_refused_before_tritonserver(server: object) -> None:
    """Issue 33: tritonserver 2.51 takes gRPC messages of any size (400 and 800 MB, and a gzip message under
    1 MB that inflates to 600 MB, grew it by gigabytes). The gRPC front refuses messages over the server's
    limit (8 MiB here), compressed ones by their decompressed size, and tritonserver never sees them."""
    import numpy as np
    import tritonclient.grpc as grpcclient
    from triton_helpers import infer_grpc
    from tritonclient.utils import InferenceServerException

    url = server.grpc_url  # type: ignore[attr-defined]
    assert infer_grpc(url, "add_one").tolist() == [[2, 3, 4], [5, 6, 7]]
    before = _tritonserver_rss(server)
    with grpcclient.InferenceServerClient(url) as client:
        big = grpcclient.InferInput("input_ids", [1, 9 << 18], "INT32")  # 9 MiB of data
        big.set_data_from_numpy(np.zeros((1, 9 << 18), np.int32))
        with pytest.raises(InferenceServerException, match="RESOURCE_EXHAUSTED.*larger than max"):
            client.infer("add_one", [big], client_timeout=120)
        bomb = grpcclient.InferInput("input_ids", [1, 16 << 20], "INT32")  # 64 MiB of zeros, ~64 KB gzipped
        bomb.set_data_from_numpy(np.zeros((1, 16 << 20), np.int32))
        with pytest.raises(InferenceServerException, match="RESOURCE_EXHAUSTED.*(?i:decompressed)"):
            client.infer("add_one", [bomb], compression_algorithm="gzip", client_timeout=120)
    assert _tritonserver_rss(server) - before < 8 << 20
    assert infer_grpc(url, "add_one").tolist() == [[2, 3, 4], [5, 6, 7]]


@pytest.mark.parametrize("chat", [False, True], ids=["generate", "chat"])
def test_ftx_generate_at_the_grpc_port_says_so(server: object, chat: bool, tmp_path: object) -> None:
    """Issue 33: ``ftx generate --url http://<gRPC port>`` (and ``--chat``) ended in a BadStatusLine traceback
    with HTTP/2 frames printed to the terminal."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    url = f"http://{server.grpc_url}"  # type: ignore[attr-defined]
    args = ["--chat", "--url", url + "/v1"] if chat else ["--url", url, "Once upon a time"]
    done = subprocess.run(
        [str(Path(sys.executable).parent / "ftx"), "generate", *args],
        input="hello\n",
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "FTX_HOME": str(tmp_path)},
        errors="backslashreplace",
    )
    assert done.returncode == 1, done
    assert "does not answer HTTP/1.1" in done.stderr and "gRPC port" in done.stderr and "hint:" in done.stderr, done
    assert "Traceback" not in done.stderr and "\x00" not in done.stderr + done.stdout, done.stderr
