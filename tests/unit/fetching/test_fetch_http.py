"""ftx_triton.fetching.http (resume, retry, checksum, locking) and ftx_triton.fetching.refs for URLs and paths.

Real HTTP on 127.0.0.1 through fetch_helpers.LocalServer.
"""

from __future__ import annotations

import io
import multiprocessing
import re
import sys
import threading
from pathlib import Path

import pytest
from fetch_helpers import LocalServer, download_in_process, payload, sha256
from ftx_triton.errors import SourceError
from ftx_triton.fetching import http as fetch_http
from ftx_triton.fetching.http import download, part_path
from ftx_triton.fetching.local_keys import local_fingerprint
from ftx_triton.fetching.refs import parse_ref, resolve_revision
from ftx_triton.plan.artifacts import SourceRef
from structlog.testing import capture_logs

DATA = payload(3 * 1024 * 1024 + 12_345)
CUT = 1_000_003


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setattr(fetch_http, "BACKOFF_BASE_S", 0.01)
    with LocalServer() as srv:
        yield srv


def events(logs: list[dict], name: str) -> list[dict]:
    return [e for e in logs if e["event"] == name]


def leftovers(dest: Path) -> list[str]:
    """Files next to dest other than the lock file."""
    return sorted(p.name for p in dest.parent.iterdir() if not p.name.endswith(".lock"))


# --- resume -------------------------------------------------------------------------------


def test_interrupted_download_resumes_with_range(server: LocalServer, tmp_path: Path) -> None:
    server.serve_bytes("/ckpt.tar.zstd", DATA, script=["cut"], cut_at=CUT)
    dest = tmp_path / "ckpt.tar.zstd"
    with capture_logs() as logs:
        assert download(server.url("/ckpt.tar.zstd"), dest, sha256=sha256(DATA), progress=False) == dest
    gets = server.seen("GET")
    assert len(gets) == 2
    assert "Range" not in gets[0].headers
    assert gets[1].headers["Range"] == f"bytes={CUT}-"
    assert gets[1].headers["If-Range"] == '"v1"'
    assert sha256(dest.read_bytes()) == sha256(DATA)
    assert leftovers(dest) == ["ckpt.tar.zstd"]
    assert events(logs, "download.resumed")[0]["offset"] == CUT


def test_next_run_resumes_what_a_killed_run_left(server: LocalServer, tmp_path: Path) -> None:
    server.serve_bytes("/w.bin", DATA)
    dest = tmp_path / "w.bin"
    part_path(dest).write_bytes(DATA[:CUT])  # what a killed process leaves behind
    download(server.url("/w.bin"), dest, sha256=sha256(DATA), progress=False)
    assert server.seen("GET")[0].headers["Range"] == f"bytes={CUT}-"
    assert dest.read_bytes() == DATA and leftovers(dest) == ["w.bin"]


def test_server_ignoring_range_restarts_from_zero(server: LocalServer, tmp_path: Path) -> None:
    server.serve_bytes("/w.bin", DATA, script=["cut"], cut_at=CUT, ranges=False)
    dest = tmp_path / "w.bin"
    with capture_logs() as logs:
        download(server.url("/w.bin"), dest, sha256=sha256(DATA), progress=False)
    assert server.seen("GET")[1].headers["Range"] == f"bytes={CUT}-"  # asked, got 200
    assert events(logs, "download.restarted")
    assert dest.read_bytes() == DATA


def test_file_changed_upstream_is_not_spliced(server: LocalServer, tmp_path: Path) -> None:
    route = server.serve_bytes("/w.bin", DATA, script=["cut", "503"], cut_at=CUT)
    dest = tmp_path / "w.bin"
    with pytest.raises(SourceError):  # cut, then 503: this run gives up
        download(server.url("/w.bin"), dest, retries=0, progress=False)
    assert part_path(dest).stat().st_size == CUT
    route.data, route.etag = payload(len(DATA), seed=7), '"v2"'
    download(server.url("/w.bin"), dest, progress=False)
    assert server.seen("GET")[-1].headers["If-Range"] == '"v1"'
    assert dest.read_bytes() == route.data


def test_stalled_transfer_times_out_and_resumes(server: LocalServer, tmp_path: Path) -> None:
    server.serve_bytes("/w.bin", DATA, script=["stall"], stall_s=1.5)
    dest = tmp_path / "w.bin"
    with capture_logs() as logs:
        download(server.url("/w.bin"), dest, timeout_s=0.3, progress=False)
    assert dest.read_bytes() == DATA
    assert "stalled" in events(logs, "download.retrying")[0]["error"]
    assert server.seen("GET")[1].headers["Range"].startswith("bytes=")


# --- retries and errors -------------------------------------------------------------------


def test_transient_5xx_is_retried_with_backoff(server: LocalServer, tmp_path: Path) -> None:
    server.serve_bytes("/w.bin", DATA, script=["503", "503"])
    with capture_logs() as logs:
        download(server.url("/w.bin"), tmp_path / "w.bin", progress=False)
    assert len(server.seen("GET")) == 3
    assert [e["delay_s"] for e in events(logs, "download.retrying")] == [0.01, 0.02]


def test_gives_up_after_retries(server: LocalServer, tmp_path: Path) -> None:
    server.serve_bytes("/w.bin", DATA, status=503)
    with pytest.raises(SourceError, match="after 3 attempts: HTTP 503") as err:
        download(server.url("/w.bin"), tmp_path / "w.bin", retries=2, progress=False)
    assert "next run resumes" in err.value.hint
    assert len(server.seen("GET")) == 3
    assert not (tmp_path / "w.bin").exists()


def test_not_found_is_not_retried(server: LocalServer, tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="not found") as err:
        download(server.url("/missing.tar.gz"), tmp_path / "m.tar.gz", progress=False)
    assert err.value.hint
    assert len(server.seen("GET")) == 1


def test_query_string_is_redacted_from_logs_and_errors(server: LocalServer, tmp_path: Path) -> None:
    with capture_logs() as logs, pytest.raises(SourceError) as err:
        download(server.url("/missing?X-Amz-Signature=s3cr3t"), tmp_path / "m", progress=False)
    assert "s3cr3t" not in str(err.value) + err.value.hint + repr(logs)


# --- integrity ----------------------------------------------------------------------------


def test_checksum_mismatch_leaves_nothing(server: LocalServer, tmp_path: Path) -> None:
    server.serve_bytes("/w.bin", DATA)
    dest = tmp_path / "w.bin"
    with pytest.raises(SourceError, match="checksum mismatch") as err:
        download(server.url("/w.bin"), dest, sha256="0" * 64, progress=False)
    assert "nothing was kept" in err.value.hint
    assert leftovers(dest) == []


def test_invalid_checksum_text_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="invalid sha256") as err:
        download("https://example.invalid/x", tmp_path / "x", sha256="abc")
    assert "sha256sum" in err.value.hint


def test_existing_download_is_reused_and_reverified(server: LocalServer, tmp_path: Path) -> None:
    server.serve_bytes("/w.bin", DATA)
    dest = tmp_path / "w.bin"
    download(server.url("/w.bin"), dest, sha256=sha256(DATA), progress=False)
    download(server.url("/w.bin"), dest, sha256=f"sha256:{sha256(DATA).upper()}", progress=False)
    assert len(server.seen("GET")) == 1
    dest.write_bytes(b"tampered")
    download(server.url("/w.bin"), dest, sha256=sha256(DATA), progress=False)
    assert len(server.seen("GET")) == 2 and dest.read_bytes() == DATA


def test_file_url_is_copied_and_verified(tmp_path: Path) -> None:
    src = tmp_path / "src.tar.gz"
    src.write_bytes(DATA)
    dest = tmp_path / "out" / "copy.tar.gz"
    assert download(src.as_uri(), dest, sha256=sha256(DATA), progress=False).read_bytes() == DATA
    with pytest.raises(SourceError, match="not a file"):
        download((tmp_path / "nope").as_uri(), tmp_path / "out" / "nope", progress=False)


def test_unsupported_scheme(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="unsupported URL scheme 'ftp'"):
        download("ftp://host/x.tar", tmp_path / "x.tar")


# --- progress -----------------------------------------------------------------------------


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_shows_bytes_rate_and_eta_on_a_terminal_only(
    server: LocalServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    server.serve_bytes("/w.bin", DATA)
    download(server.url("/w.bin"), tmp_path / "quiet.bin", sha256=sha256(DATA))
    assert capsys.readouterr().err == ""
    terminal = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    download(server.url("/w.bin"), tmp_path / "w.bin", sha256=sha256(DATA))
    shown = terminal.getvalue()
    assert "w.bin" in shown and "3.2/3.2 MB" in shown and "verifying sha256" in shown
    assert re.search(r"\d+(\.\d+)? [kMG]?B/s", shown) and re.search(r"\d:\d\d:\d\d", shown)


# --- concurrency --------------------------------------------------------------------------


def test_concurrent_threads_download_once(server: LocalServer, tmp_path: Path) -> None:
    server.serve_bytes("/w.bin", DATA, chunk_delay_s=0.005)
    dest = tmp_path / "w.bin"
    barrier = threading.Barrier(4)
    results: list[bytes] = []

    def fetch() -> None:
        barrier.wait()
        results.append(download(server.url("/w.bin"), dest, progress=False).read_bytes())

    threads = [threading.Thread(target=fetch) for _ in range(4)]
    with capture_logs() as logs:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    assert results == [DATA] * 4
    assert len(server.seen("GET")) == 1
    assert events(logs, "download.waiting") and len(events(logs, "download.cached")) == 3


def test_concurrent_processes_download_once(server: LocalServer, tmp_path: Path) -> None:
    server.serve_bytes("/w.bin", DATA, chunk_delay_s=0.01)
    dest = tmp_path / "w.bin"
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        paths = pool.starmap(download_in_process, [(server.url("/w.bin"), str(dest))] * 2)
    assert paths == [str(dest)] * 2 and dest.read_bytes() == DATA
    assert len(server.seen("GET")) == 1


# --- refs: URLs and local paths -----------------------------------------------------------

PRESETS = {
    "gptj": SourceRef(kind="hf", uri="hf://EleutherAI/gpt-j-6b"),
    "gptj-slim": SourceRef(kind="url", uri="https://example.org/step_383500_slim.tar.zstd", sha256="a" * 64),
}


def test_parse_urls_paths_and_presets(tmp_path: Path) -> None:
    archive = tmp_path / "ckpt.tar.zstd"
    archive.write_bytes(b"x")
    assert parse_ref("https://h/x.tar.zstd") == SourceRef(kind="url", uri="https://h/x.tar.zstd")
    assert parse_ref(str(tmp_path)) == SourceRef(kind="local", uri=str(tmp_path.resolve()))
    assert parse_ref(tmp_path.as_uri()) == SourceRef(kind="local", uri=str(tmp_path.resolve()))
    assert parse_ref(str(archive)) == SourceRef(kind="url", uri=archive.resolve().as_uri())
    slim = parse_ref("gptj-slim", presets=PRESETS)
    assert (slim.kind, slim.sha256, slim.preset) == ("url", "a" * 64, "gptj-slim")
    assert parse_ref("gptj", presets=PRESETS, revision="v1").revision == "v1"


@pytest.mark.parametrize(
    ("text", "kwargs", "message", "hint"),
    [
        ("nonsense", {"presets": PRESETS}, "unknown model source", "gptj, gptj-slim"),
        ("EleutherAI/gpt-j-6b", {}, "unknown model source", "hf://EleutherAI/gpt-j-6b"),
        ("", {}, "empty", "hf://ORG/NAME"),
        ("https://h/x.tar", {"revision": "main"}, "only applies to hf://", "--sha256"),
        ("gptj-slim", {"presets": PRESETS, "revision": "main"}, "no revisions", "--revision"),
        ("https://", {}, "no host", "https://HOST"),
        # issue 27: these downloaded (or crashed) before being refused; now refused before any download
        ("https://h/models/..", {}, "names no file", ".tar.zstd"),
        ("https://h/models/.", {}, "names no file", ".tar.zstd"),
        ("https://h/models/%2e%2e", {}, "names no file", ".tar.zstd"),
        ("https://h/models/", {}, "names no file", ".tar.zstd"),
        ("https://h/" + "a" * 300 + ".tar.gz", {}, "longer than a file name may be", ".tar.zstd"),
        ("https://h/weights.bin", {}, "does not name an archive", ".tar.zstd"),
        # issue 27: ids the Hub's own validator refuses passed ftx's check
        ("hf://a/..", {}, "invalid Hugging Face repository", "hf://ORG/NAME"),
        ("hf://./.", {}, "invalid Hugging Face repository", "hf://ORG/NAME"),
        ("hf://a/b.", {}, "invalid Hugging Face repository", "hf://ORG/NAME"),
        ("hf://a/" + "b" * 97, {}, "invalid Hugging Face repository", "hf://ORG/NAME"),
    ],
)
def test_parse_errors_say_what_to_do(text: str, kwargs: dict, message: str, hint: str) -> None:
    with pytest.raises(SourceError, match=message) as err:
        parse_ref(text, **kwargs)
    assert hint in err.value.hint


def test_url_revision_is_checksum_or_stable_key(server: LocalServer, tmp_path: Path) -> None:
    route = server.serve_bytes("/x.tar", DATA)
    url = server.url("/x.tar")
    assert resolve_revision(SourceRef(kind="url", uri=url, sha256="B" * 64)) == "b" * 64
    key = resolve_revision(SourceRef(kind="url", uri=url))
    assert key.startswith("url-") and key == resolve_revision(SourceRef(kind="url", uri=url))
    route.etag = '"v2"'
    assert resolve_revision(SourceRef(kind="url", uri=url)) != key
    assert server.seen("HEAD") and not server.seen("GET")


def test_local_fingerprint_tracks_names_sizes_and_mtimes(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "index").write_text("a")
    before = resolve_revision(SourceRef(kind="local", uri=str(tmp_path)))
    (tmp_path / ".git" / "index").write_text("changed")
    assert local_fingerprint(tmp_path) == before
    (tmp_path / "config.json").write_text('{"n": 1}')
    assert local_fingerprint(tmp_path) != before
    with pytest.raises(SourceError, match="not a directory"):
        local_fingerprint(tmp_path / "config.json")
