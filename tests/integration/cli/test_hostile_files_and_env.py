"""Hostile files, downloads and environment at the command line (issue 27, the third adversarial pass):
special files where ftx reads or writes a small text file, an ``HF_ENDPOINT`` that is no URL, a download
that never ends. Each case failed before its fix (a replaced FIFO or link, a hang, a traceback, a full
disk); the CLI runs in-process on a real FTX_HOME, downloads come from a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import contextlib
import http.server
import os
import shutil
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_helpers import assert_clean_failure


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_ftx_lock_never_replaces_a_special_file_or_a_link(ftx_cli, tmp_path: Path, kind: str) -> None:
    """The rename of the new file replaced whatever was there: as root, ``-o /dev/null`` made /dev/null a
    text file (a FIFO and a link stand in for devices here)."""
    target = tmp_path / "out.toml"
    if kind == "fifo":
        _fifo(target)
    else:
        (tmp_path / "real.toml").write_text("# mine\n")
        target.symlink_to(tmp_path / "real.toml")
    result = ftx_cli("lock", "tiny-gptj", "-o", str(target))
    assert_clean_failure(result, "is not a regular file")
    if kind == "fifo":
        assert stat.S_ISFIFO(os.lstat(target).st_mode)
    else:
        assert target.is_symlink() and (tmp_path / "real.toml").read_text() == "# mine\n"
    assert not list(tmp_path.glob(".out.toml.tmp-*"))


def test_ftx_lock_into_a_missing_directory_is_a_clean_error(ftx_cli, tmp_path: Path) -> None:
    result = ftx_cli("lock", "tiny-gptj", "-o", str(tmp_path / "no" / "such" / "ftx.toml"))
    assert_clean_failure(result, "cannot write", "No such file or directory")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("option", ["--lock", "--hosts"])
def test_a_deployment_or_hosts_file_that_is_a_pipe_is_refused_not_waited_on(
    ftx_cli, tmp_path: Path, option: str
) -> None:
    """A named pipe blocked ftx forever; /dev/zero (the same path through the code) grew its memory forever."""
    pipe = _fifo(tmp_path / "file")
    args = ["run", "--lock", str(pipe)] if option == "--lock" else ["run", "tiny-gptj", "--hosts", str(pipe)]
    result = ftx_cli(*args, "--dry-run")
    assert_clean_failure(result, "named pipe")


def test_an_oversized_deployment_file_is_refused_unread(
    ftx_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ftx_triton.cli.manifest import MAX_MANIFEST_BYTES

    (tmp_path / "ftx.toml").write_text('[model]\nsource = "tiny-gptj"\n# ' + "x" * MAX_MANIFEST_BYTES + "\n")
    monkeypatch.chdir(tmp_path)
    assert_clean_failure(ftx_cli("run", "--dry-run"), "larger than")


@pytest.mark.parametrize("endpoint", ["file:///etc", "ftp://mirror.example", "http://", "http://[::1"])
def test_an_hf_endpoint_that_is_no_http_url_is_a_clean_error(
    ftx_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, endpoint: str
) -> None:
    """huggingface_hub failed on it with a traceback (requests' InvalidSchema) before any check of ftx's."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    result = ftx_cli("pull", "hf://a/b", "--no-resource-check", env={"HF_ENDPOINT": endpoint})
    assert_clean_failure(result, "HF_ENDPOINT", "is not an http(s) URL")


class _Endless(http.server.BaseHTTPRequestHandler):
    """A server that sends zeros without a Content-Length until the client goes."""

    def log_message(self, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.end_headers()

    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        with contextlib.suppress(OSError):
            while True:
                self.wfile.write(b"\0" * 65536)


@pytest.fixture
def endless_url() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Endless)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/model.tar.gz"
    server.shutdown()
    server.server_close()


@pytest.mark.timeout(300)
def test_a_download_of_no_declared_size_stops_before_the_disk_is_full(
    ftx_cli, tmp_path: Path, endless_url: str
) -> None:
    """An endless body filled FTX_HOME's disk, and the partial file was kept "to resume", so the disk
    stayed full. Now it stops while the extraction reserve is still free and removes what it wrote.
    A real 96 MiB tmpfs."""
    from ftx_triton.fetching.archive import FREE_SPACE_RESERVE
    from mounts import tmpfs

    with tmpfs(tmp_path / "home", size="96m") as home:
        result = ftx_cli("pull", endless_url, "--no-resource-check", env={"FTX_HOME": str(home)})
        assert_clean_failure(result, "no space left", "declared no size", "removed")
        assert not list(home.rglob("*.part"))
        assert shutil.disk_usage(home).free >= FREE_SPACE_RESERVE


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ('docker_host = "tcp://builder.example:2375"', "Docker daemon of another machine"),
        ('docker_host = "ssh://user@gpu.example"', "Docker daemon of another machine"),
        ('hosts = "hosts.txt"', "on the machines it lists"),
    ],
)
def test_a_committed_ftx_toml_cannot_send_the_model_to_other_machines(
    ftx_cli, tiny_gptj_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, line: str, says: str
) -> None:
    """A stranger's ftx.toml chose where the model and every request go: a remote Docker daemon, or MPI
    ranks over ssh on the machines of its hosts file. Like a wider --host, only the command line may."""
    (tmp_path / "hosts.txt").write_text("localhost gpus=1\n")
    manifest = tmp_path / "ftx.toml"
    manifest.write_text(f'[model]\nsource = "{tiny_gptj_dir}"\n[settings]\nruntime = "python"\n{line}\n')
    monkeypatch.chdir(tmp_path)
    assert_clean_failure(ftx_cli("run", "--dry-run"), says, "on the command line to mean it")
    if "docker_host" in line:
        manifest.write_text(manifest.read_text().replace(line, 'docker_host = "unix:///var/run/docker.sock"'))
        result = ftx_cli("run", "--dry-run")
        assert result.exit_code == 0, result.stderr  # this machine's daemon stays a setting like any other


@pytest.mark.parametrize("where", ["below-a-file", "proc"])
def test_convert_output_that_cannot_be_a_directory_is_refused_first(
    ftx_cli, tiny_gptj_dir: Path, tmp_path: Path, where: str
) -> None:
    """``ftx convert --output`` below a file or on /proc converted the whole model, then failed with a
    FileExistsError / FileNotFoundError traceback."""
    (tmp_path / "file").write_text("mine\n")
    output = {"below-a-file": tmp_path / "file" / "out", "proc": Path("/proc/ftx-test-output")}[where]
    result = ftx_cli("convert", str(tiny_gptj_dir), "--output", str(output))
    assert_clean_failure(result, "--output")
    assert (tmp_path / "file").read_text() == "mine\n"


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--temperature", "nan"),
        ("--temperature", "inf"),
        ("--top-p", "nan"),
        ("--timeout", "nan"),
        ("--timeout", "1e300"),
    ],
)
def test_generate_refuses_numbers_that_are_not_finite(ftx_cli, option: str, value: str) -> None:
    """click's ranges let NaN through: a NaN temperature went to the model, a NaN or huge --timeout was a
    ValueError / OverflowError traceback from the socket."""
    result = ftx_cli("generate", "Hello", "--url", "http://127.0.0.1:9", option, value)
    assert result.exit_code == 2, (result.exit_code, result.stderr, result.exception)
    assert option in result.stderr and ("finite" in result.stderr or "range" in result.stderr), result.stderr


@pytest.mark.parametrize("runtime", ["fastertransformer-docker", "fastertransformer-native"])
@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"\x88\x01\xff binary", "cannot read the hosts file"),
        (b"localhost gpus=99999999999\nlocalhost gpus=99999999999\n", "is not a GPU count of 1 to 64"),
        (b"-oProxyCommand=touch\nlocalhost\n", "is not 'HOST [gpus=N]'"),
        (b"--help\nlocalhost\n", "is not 'HOST [gpus=N]'"),
    ],
)
def test_a_dry_run_reads_the_hosts_file_and_refuses_what_a_run_would(
    ftx_cli, tmp_path: Path, runtime: str, content: bytes, needle: str
) -> None:
    """Binary content, absurd GPU counts and host names mpirun or ssh would take as options were planned
    without a word by the native launcher's dry run (it never read the file)."""
    hosts = tmp_path / "hosts.txt"
    hosts.write_bytes(content)
    result = ftx_cli(
        "run", "tiny-gptj", "--dry-run", "--runtime", runtime, "--tp", "1", "--pp", "2", "--hosts", str(hosts)
    )
    assert_clean_failure(result, needle)
