"""Test helpers for fetching: a local HTTP server that records requests, archive builders.

The server is a ``ThreadingHTTPServer`` on 127.0.0.1 in a daemon thread; use it as a context
manager (the ``server`` fixtures do) so it always stops. Routes are exact paths (query
ignored) mapped to handlers; :class:`BytesRoute` serves a file with optional Range support,
a connection cut, transient 503s and a per-chunk delay.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import zstandard

Handler = Callable[[BaseHTTPRequestHandler], None]


@dataclass(frozen=True)
class Seen:
    """One request as the server saw it."""

    method: str
    path: str
    headers: Message  # case-insensitive .get / [] / in


class LocalServer:
    """An HTTP server on 127.0.0.1 with exact-path routes; records every request."""

    def __init__(self) -> None:
        self.routes: dict[str, Handler] = {}
        self.fallback: Handler | None = None
        self.requests: list[Seen] = []
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def url(self, path: str) -> str:
        return self.base_url + path

    def route(self, path: str, handler: Handler) -> None:
        self.routes[path] = handler

    def serve_bytes(self, path: str, data: bytes, **options: object) -> BytesRoute:
        route = BytesRoute(data, **options)  # type: ignore[arg-type]
        self.route(path, route)
        return route

    def seen(self, method: str | None = None, path: str | None = None) -> list[Seen]:
        with self._lock:
            return [r for r in self.requests if (method in (None, r.method)) and (path in (None, r.path))]

    def __enter__(self) -> LocalServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def _dispatch(self, handler: BaseHTTPRequestHandler) -> None:
        path = unquote(urlsplit(handler.path).path)
        with self._lock:
            self.requests.append(Seen(handler.command, path, handler.headers))
        target = self.routes.get(path) or self.fallback
        if target is None:
            send_status(handler, 404)
            return
        target(handler)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class _Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                server._dispatch(self)

            do_HEAD = do_GET  # noqa: N815

            def log_message(self, *args: object) -> None:
                pass

        return _Handler


def send_status(handler: BaseHTTPRequestHandler, status: int, headers: dict[str, str] | None = None) -> None:
    """An empty response with ``status`` and ``headers``."""
    handler.send_response(status)
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.send_header("Content-Length", "0")
    handler.end_headers()


def send_body(
    handler: BaseHTTPRequestHandler, body: bytes, headers: dict[str, str] | None = None, status: int = 200
) -> None:
    """A full response (no body for HEAD)."""
    handler.send_response(status)
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    if handler.command != "HEAD":
        handler.wfile.write(body)


@dataclass
class BytesRoute:
    """Serve ``data`` with Range/If-Range support (unless ``ranges`` is False).

    ``script`` says what the n-th GET does: ``"cut"`` closes the connection after ``cut_at``
    bytes of the file, ``"stall"`` sends half the body then sleeps ``stall_s``, ``"503"``
    fails; GETs past the script (and ``"ok"``) are served normally. ``chunk_delay_s`` slows
    every 64 KiB chunk; ``status`` answers every request with that status.
    """

    data: bytes
    etag: str | None = '"v1"'
    ranges: bool = True
    script: list[str] = field(default_factory=list)
    cut_at: int = 0
    stall_s: float = 0.0
    chunk_delay_s: float = 0.0
    status: int | None = None
    gets: int = field(default=0, init=False)

    def __call__(self, h: BaseHTTPRequestHandler) -> None:
        action = "ok"
        if h.command == "GET":
            self.gets += 1
            action = self.script[self.gets - 1] if self.gets <= len(self.script) else "ok"
        if self.status is not None or action == "503":
            send_status(h, self.status or 503)
            return
        start = self._range_start(h)
        headers = {"Accept-Ranges": "bytes" if self.ranges else "none", **({"ETag": self.etag} if self.etag else {})}
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(self.data) - 1}/{len(self.data)}"
        h.send_response(206 if start else 200)
        for name, value in headers.items():
            h.send_header(name, value)
        h.send_header("Content-Length", str(len(self.data) - start))
        h.end_headers()
        if h.command == "GET":
            self._write_body(h, self.data[start:], action, start)

    def _range_start(self, h: BaseHTTPRequestHandler) -> int:
        header = h.headers.get("Range")
        if not (self.ranges and header and header.startswith("bytes=")):
            return 0
        if_range = h.headers.get("If-Range")
        if if_range and if_range != self.etag:
            return 0
        return int(header[len("bytes=") :].split("-")[0])

    def _write_body(self, h: BaseHTTPRequestHandler, body: bytes, action: str, start: int) -> None:
        if action == "cut":
            h.wfile.write(body[: self.cut_at - start])
            h.close_connection = True
            return
        if action == "stall":
            h.wfile.write(body[: len(body) // 2])
            h.wfile.flush()
            time.sleep(self.stall_s)
            return
        for offset in range(0, len(body), 64 * 1024):
            h.wfile.write(body[offset : offset + 64 * 1024])
            if self.chunk_delay_s:
                time.sleep(self.chunk_delay_s)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def payload(size: int, seed: int = 0) -> bytes:
    """Deterministic incompressible-ish bytes."""
    out = bytearray()
    counter = 0
    while len(out) < size:
        out += hashlib.sha256(f"{seed}:{counter}".encode()).digest()
        counter += 1
    return bytes(out[:size])


# --- archives -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One archive member: a file (``data``), a directory, a symlink or hard link (``link``),
    or a fifo/char device (``kind``)."""

    name: str
    data: bytes = b""
    kind: str = "file"  # file | dir | symlink | hardlink | fifo | chrdev
    link: str = ""


MODEL_TREE = (
    Entry("model", kind="dir"),
    Entry("model/config.json", b'{"model_type": "gptj"}'),
    Entry("model/weights/shard-0.bin", payload(200_000, 1)),
    Entry("model/weights/latest", kind="symlink", link="shard-0.bin"),
)

_TAR_TYPES = {
    "file": tarfile.REGTYPE,
    "dir": tarfile.DIRTYPE,
    "symlink": tarfile.SYMTYPE,
    "hardlink": tarfile.LNKTYPE,
    "fifo": tarfile.FIFOTYPE,
    "chrdev": tarfile.CHRTYPE,
}


def tar_bytes(entries: Iterable[Entry]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            info = tarfile.TarInfo(entry.name)
            info.type = _TAR_TYPES[entry.kind]
            info.mode = 0o755 if entry.kind == "dir" else 0o644
            info.linkname = entry.link
            info.size = len(entry.data) if entry.kind == "file" else 0
            tar.addfile(info, io.BytesIO(entry.data) if entry.kind == "file" else None)
    return buffer.getvalue()


def write_archive(path: Path, entries: Iterable[Entry]) -> Path:
    """Write ``entries`` as the archive format ``path``'s suffix names."""
    entries = list(entries)
    name = path.name
    if name.endswith(".zip"):
        path.write_bytes(zip_bytes(entries))
    elif name.endswith((".tar.zstd", ".tar.zst", ".tzst")):
        path.write_bytes(zstandard.ZstdCompressor(level=3).compress(tar_bytes(entries)))
    elif name.endswith((".tar.gz", ".tgz")):
        import gzip

        path.write_bytes(gzip.compress(tar_bytes(entries)))
    elif name.endswith(".tar"):
        path.write_bytes(tar_bytes(entries))
    else:
        raise ValueError(name)
    return path


def zip_bytes(entries: Iterable[Entry]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for entry in entries:
            if entry.kind == "dir":
                zf.writestr(entry.name.rstrip("/") + "/", b"")
            elif entry.kind == "symlink":
                info = zipfile.ZipInfo(entry.name)
                info.create_system = 3
                info.external_attr = (0o120777) << 16
                zf.writestr(info, entry.link)
            else:
                zf.writestr(entry.name, entry.data)
    return buffer.getvalue()


def tree(root: Path) -> dict[str, bytes | str]:
    """Relative path → bytes (files) or ``-> target`` (symlinks) or ``/`` (dirs)."""
    out: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            out[rel] = f"-> {path.readlink()}"
        elif path.is_dir():
            out[rel] = "/"
        else:
            out[rel] = path.read_bytes()
    return out


def download_in_process(url: str, dest: str) -> str:
    """Target for multiprocessing tests (must be importable)."""
    from ftx_triton.fetching.http import download

    return str(download(url, Path(dest), progress=False))


def checkpoint_entries(src: Path, top: str = "tiny-gptj") -> list[Entry]:
    entries = [Entry(top, kind="dir")]
    entries += [Entry(f"{top}/{p.name}", p.read_bytes()) for p in sorted(src.iterdir()) if p.is_file()]
    return entries


def seed_demo(home: Path, built: Path) -> Path:
    """``home`` with the built-in tiny-gptj in place, as its first use would leave it (a copy of ``built``,
    marker included, so ftx finds it built)."""
    import shutil

    target = demo_dir(home)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(built, target)
    return target


def demo_dir(home: Path) -> Path:
    """Where the built-in tiny-gptj lives in ``home``."""
    from ftx_triton.engine.builtin import builtin_dir

    return builtin_dir(home, "tiny-gptj")


def ensure_demo_checkpoint(home: Path) -> Path:
    """The built-in tiny-gptj of ``home``, built with the gptj plugin's recipe on first use (as `ftx run tiny-gptj`)."""
    from ftx_gptj.tiny import DEMO
    from ftx_triton.engine.builtin import ensure_builtin

    return ensure_builtin(home, "tiny-gptj", DEMO)
