"""A real Docker daemon for the docker tests, and the stand-in images they run.

``docker_client`` (session) uses a daemon that is already reachable (``DOCKER_HOST`` or the
default socket); otherwise it starts ``dockerd`` — its own data-root,
exec-root, pidfile and socket under a temporary directory, ``--bridge=none``, ``--iptables=false``,
overlay2 storage (vfs where the filesystem cannot hold overlay2) — and stops it at the end (SIGTERM,
unmount the netns nsfs left under exec-root, remove the directory; a killed test run's dockerd gets
SIGTERM through PR_SET_PDEATHSIG and its directory is swept by the next run). Tests are skipped only
when neither a daemon nor ``dockerd`` exists (or dockerd is there but the tests are not root).

No image can be pulled here, and the real Triton + FasterTransformer image and GPUs cannot run on
the test machine. ``standin_image`` is therefore a STAND-IN: a ``docker import``-ed busybox root
filesystem (Debian's busybox-static) with shell scripts at the real paths — ``mpirun``,
``/opt/tritonserver/bin/tritonserver`` and the GEMM tools — that print FasterTransformer-like log
lines (plus lines a test plants through ``FTX_STANDIN_PLANT``) and serve ``/v2/health/ready`` and
``/v2/models/<name>/ready`` with busybox httpd on the ``--http-port`` given. Everything ftx does
around them (container creation, mounts, working directory, ulimits, shm, IPC, command line,
readiness, log scanning, stop and removal, image builds) is the real code path against a real
daemon.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

STANDIN_TAG = "ftx-test/standin-ft:1"
BUSYBOX = "/bin/busybox"
TEST_IMAGE_PREFIX = "ftx-test/"

MPIRUN = r"""#!/bin/sh
# STAND-IN for Open MPI's mpirun (ftx docker tests only): checks the flags ftx passes, then runs the
# program once (one process per node, as FasterTransformer wants).
n=""; root=no; hostfile=""
while [ $# -gt 0 ]; do
  case "$1" in
    -n|-np) n="$2"; shift 2 ;;
    --allow-run-as-root) root=yes; shift ;;
    --hostfile|--map-by|-x) [ "$1" = --hostfile ] && hostfile="$2"; shift 2 ;;
    --mca) shift 3 ;;
    *) break ;;
  esac
done
echo "standin-mpirun: -n $n allow-run-as-root=$root hostfile=${hostfile:-none}"
if [ "$(id -u)" = 0 ] && [ "$root" = no ]; then
  echo "mpirun has detected an attempt to run as root."; exit 1
fi
exec "$@"
"""

TRITONSERVER = r"""#!/bin/sh
# STAND-IN for tritonserver with the FasterTransformer backend (ftx docker tests only; the real image
# and GPUs cannot run here). It reports what the container gave it, prints the lines the real backend
# prints for a missing checkpoint or gemm_config.in, prints planted lines ($FTX_STANDIN_PLANT), and
# serves /v2/health/ready and /v2/models/<name>/ready|config with busybox httpd.
repo=""; http=8000; addr=0.0.0.0
for arg in "$@"; do
  case "$arg" in
    --model-repository=*) repo="${arg#*=}" ;;
    --http-port=*) http="${arg#*=}" ;;
    --http-address=*) addr="${arg#*=}" ;;
  esac
done
echo "standin-tritonserver: argv $*"
echo "standin-tritonserver: cwd $(pwd)"
echo "standin-tritonserver: uid $(id -u)"
echo "standin-tritonserver: CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}"
echo "standin-tritonserver: ulimit-l $(ulimit -l) ulimit-s $(ulimit -s)"
echo "standin-tritonserver: ipc $(readlink /proc/self/ns/ipc)"
echo "standin-tritonserver: shm-kb $(df -k /dev/shm | awk 'NR==2{print $2}')"
if [ ! -d "$repo" ]; then echo "E standin-tritonserver: model repository $repo not found"; exit 1; fi
if touch "$repo/.standin-probe" 2>/dev/null; then rm -f "$repo/.standin-probe"; echo "standin-tritonserver: repository writable"
else echo "standin-tritonserver: repository read-only"; fi
www=/tmp/standin-www; mkdir -p "$www/v2/health" "$www/v2/models"
for cfg in "$repo"/*/config.pbtxt; do
  [ -f "$cfg" ] || continue
  model=$(basename "$(dirname "$cfg")")
  ckpt=$(awk '/key: "model_checkpoint_path"/{f=1}
              f && /string_value/{sub(/.*string_value: "/,""); sub(/".*/,""); print; exit}' "$cfg")
  if [ -n "$ckpt" ]; then
    if [ -r "$ckpt/config.ini" ]; then echo "standin-tritonserver: read $ckpt/config.ini"
    else echo "[ERROR] Can't load '$ckpt/config.ini'"; fi
    if touch "$ckpt/.standin-probe" 2>/dev/null; then rm -f "$ckpt/.standin-probe"; echo "standin-tritonserver: checkpoint writable"
    else echo "standin-tritonserver: checkpoint read-only"; fi
    [ -r "$ckpt/model.wte.bin" ] || echo "[FT][WARNING] file $ckpt/model.wte.bin cannot be opened, loading model fails! "
    if [ -f gemm_config.in ]; then echo "standin-tritonserver: gemm_config.in found ($(head -c 40 gemm_config.in | tr '\n' ' '))"
    else echo "[WARNING] gemm_config.in is not found; using default GEMM algo"; fi
  fi
  mkdir -p "$www/v2/models/$model"; echo ready > "$www/v2/models/$model/ready"; cp "$cfg" "$www/v2/models/$model/config"
  echo "I0101 00:00:00.000000 1 model_lifecycle.cc:693] successfully loaded '$model' version 1"
done
if [ -n "$FTX_STANDIN_PLANT" ]; then printf '%s\n' "$FTX_STANDIN_PLANT"; fi
if [ -n "$FTX_STANDIN_EXIT" ]; then exit "$FTX_STANDIN_EXIT"; fi
if [ -n "$FTX_STANDIN_DELAY" ]; then sleep "$FTX_STANDIN_DELAY"; fi
echo ok > "$www/v2/health/ready"; echo ok > "$www/v2/health/live"
echo "I0101 00:00:00.000000 1 http_server.cc:3477] Started HTTPService at $addr:$http"
exec httpd -f -p "$addr:$http" -h "$www"
"""

GEMM = r"""#!/bin/sh
# STAND-IN for FasterTransformer's GEMM tool (ftx docker tests only): like the real one it prints its
# usage and exits 0 on a wrong argument count, and otherwise writes gemm_config.in in its cwd.
if [ $# -lt 8 ]; then echo "[ERROR] Usage: $(basename "$0") batch_size beam_width max_input_len ..."; exit 0; fi
echo "standin-gemm: $(basename "$0") $* (uid $(id -u), cwd $(pwd), CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset})"
{ echo "batch_size, seq_len, head_num, size_per_head dataType ### batchCount, n, m, k, algoId, customOption, tile,\
 numSplitsK, swizzle, reductionScheme, workspaceSize, stages, exec_time"
  echo "standin $(basename "$0") $*"; } > gemm_config.in
"""

CMAKE = r"""#!/bin/sh
# STAND-IN for cmake (ftx image-build test only): records its arguments.
printf '%s\n' "$@" > /workspace/cmake-args.txt
echo "-- standin cmake: $*"
"""


# --------------------------------------------------------------------------- the daemon


def _mounts_under(root: Path) -> list[str]:
    out = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            mount_point = line.split()[4].replace("\\040", " ")
            if mount_point == str(root) or mount_point.startswith(str(root) + "/"):
                out.append(mount_point)
    return sorted(out, key=len, reverse=True)


def _die_with_parent() -> None:
    """In the child: get SIGTERM if the test process dies (a killed pytest must not leave dockerd running)."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def sweep_stale(prefix: str = "ftx-dockerd-") -> None:
    """Remove daemon directories of earlier, killed test runs (their dockerd is gone)."""
    for root in Path(tempfile.gettempdir()).glob(f"{prefix}*"):
        pidfile = root / "dockerd.pid"
        try:
            pid = int(pidfile.read_text().strip())
            os.kill(pid, 0)
            if Path(f"/proc/{pid}/cmdline").read_bytes().find(str(root).encode()) >= 0:
                continue  # still running (another test session)
        except (OSError, ValueError):
            pass
        for mount_point in _mounts_under(root):
            subprocess.run(["umount", "-l", mount_point], check=False, capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


class LocalDockerd:
    """A dockerd owned by the tests, under one temporary directory."""

    def __init__(self, storage_driver: str = "overlay2") -> None:
        self.storage_driver = storage_driver
        self.root = Path(tempfile.mkdtemp(prefix="ftx-dockerd-"))
        self.socket = self.root / "docker.sock"
        self.base_url = f"unix://{self.socket}"
        self.log_path = self.root / "dockerd.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60.0) -> None:
        argv = [
            shutil.which("dockerd") or "dockerd",
            f"--host={self.base_url}",
            f"--data-root={self.root / 'data'}",
            f"--exec-root={self.root / 'exec'}",
            f"--pidfile={self.root / 'dockerd.pid'}",
            f"--storage-driver={self.storage_driver}",
            "--iptables=false",
            "--ip6tables=false",
            "--bridge=none",
            "--ip-masq=false",
        ]
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        import docker

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            if self.socket.exists():
                try:
                    docker.DockerClient(base_url=self.base_url, timeout=10).ping()
                    return
                except Exception:
                    pass
            time.sleep(0.1)
        tail = self.log_path.read_text(errors="replace")[-3000:]
        self.stop()
        raise RuntimeError(f"dockerd did not start (exit {self.proc.returncode if self.proc else '?'}):\n{tail}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        for mount_point in _mounts_under(self.root):  # the netns nsfs dockerd leaves behind
            subprocess.run(["umount", "-l", mount_point], check=False, capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)


_STATE: dict[str, Any] = {"refs": 0, "client": None, "daemon": None, "own": False}


def _reachable() -> Any:
    import docker

    try:
        client = docker.from_env(timeout=10)
        client.ping()
        return client
    except Exception:
        return None


def acquire() -> Any:
    """The shared client (starting dockerd on first use)."""
    if _STATE["refs"] == 0:
        client = _reachable()
        if client is None:
            sweep_stale()
            # overlay2 builds ~8x faster than vfs; vfs works on any backing filesystem
            drivers = (
                [os.environ["FTX_TEST_DOCKER_STORAGE"]]
                if os.environ.get("FTX_TEST_DOCKER_STORAGE")
                else ["overlay2", "vfs"]
            )
            for number, driver in enumerate(drivers):
                daemon = LocalDockerd(driver)
                try:
                    daemon.start()
                    break
                except RuntimeError:
                    if number == len(drivers) - 1:
                        raise
            import docker

            client = docker.DockerClient(base_url=daemon.base_url, timeout=300)
            _STATE.update(daemon=daemon, own=True)
        _STATE["client"] = client
    _STATE["refs"] += 1
    return _STATE["client"]


def release() -> None:
    """Drop one user; the last one stops the daemon (or removes the test images from a foreign one)."""
    _STATE["refs"] -= 1
    if _STATE["refs"] > 0:
        return
    client, daemon = _STATE["client"], _STATE["daemon"]
    if daemon is not None:
        client.close()
        daemon.stop()
    elif client is not None:
        for image in client.images.list():
            if any(tag.startswith(TEST_IMAGE_PREFIX) for tag in image.tags):
                for tag in image.tags:
                    client.images.remove(tag, force=True)
        client.close()
    _STATE.update(client=None, daemon=None, own=False)


def base_url(client: Any) -> str:
    return str(client.api.base_url).replace("http+docker://localhost", "unix:///var/run/docker.sock")


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    """A DockerClient for a real daemon (started here if needed); skips only if dockerd is not installed."""
    pytest.importorskip("docker")
    if _STATE["refs"] == 0 and _reachable() is None and shutil.which("dockerd") is None:
        pytest.skip("no Docker daemon is reachable and dockerd is not installed (apt-get install docker.io)")
    if _STATE["refs"] == 0 and _reachable() is None and os.geteuid() != 0:
        pytest.skip("dockerd is installed but starting it needs root, and no daemon is reachable")
    client = acquire()
    try:
        yield client
    finally:
        release()


@pytest.fixture
def docker_env(docker_client: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """DOCKER_HOST pointing at the test daemon, for code that connects by itself (the CLI)."""
    if _STATE["daemon"] is not None:
        monkeypatch.setenv("DOCKER_HOST", _STATE["daemon"].base_url)
    return docker_client


# --------------------------------------------------------------------------- the stand-in image


def _add(
    tar: tarfile.TarFile,
    name: str,
    data: bytes | None = None,
    mode: int = 0o755,
    link: str | None = None,
    directory: bool = False,
) -> None:
    info = tarfile.TarInfo(name)
    info.mtime = int(time.time())
    if directory:
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(info)
    elif link is not None:
        info.type, info.linkname = tarfile.SYMTYPE, link
        tar.addfile(info)
    else:
        data = data or b""
        info.size, info.mode = len(data), mode
        tar.addfile(info, io.BytesIO(data))


def standin_rootfs() -> bytes:
    """A root filesystem tar: static busybox + applets, and the stand-in scripts at the real paths."""
    if not Path(BUSYBOX).is_file():
        pytest.fail(
            f"{BUSYBOX} is missing: the docker tests build their stand-in image from Debian's "
            "busybox-static (apt-get install busybox-static)"
        )
    if b"ld-linux" in Path(BUSYBOX).read_bytes()[:4096]:
        pytest.fail(
            f"{BUSYBOX} is dynamically linked (Debian's 'busybox' package); the stand-in image needs the "
            "static one: apt-get install busybox-static"
        )
    applets = subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True, check=True).stdout.split()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d in (
            "bin",
            "etc",
            "tmp",
            "root",
            "dev",
            "proc",
            "sys",
            "usr",
            "usr/local",
            "usr/local/bin",
            "usr/sbin",
            "opt",
            "opt/tritonserver",
            "opt/tritonserver/bin",
            "workspace",
            "workspace/build",
            "workspace/build/fastertransformer_backend",
            "workspace/build/fastertransformer_backend/build",
            "workspace/build/fastertransformer_backend/build/bin",
            "var",
            "var/run",
        ):
            _add(tar, d, directory=True)
        _add(tar, "bin/busybox", Path(BUSYBOX).read_bytes())
        for applet in applets:
            if applet != "busybox":
                _add(tar, f"bin/{applet}", link="busybox")
        _add(tar, "etc/passwd", b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n", 0o644)
        _add(tar, "etc/group", b"root:x:0:\nnogroup:x:65534:\n", 0o644)
        _add(tar, "usr/local/bin/mpirun", MPIRUN.encode())
        _add(tar, "usr/local/bin/cmake", CMAKE.encode())
        _add(tar, "opt/tritonserver/bin/tritonserver", TRITONSERVER.encode())
        for tool in ("gpt_gemm", "t5_gemm"):
            _add(tar, f"workspace/build/fastertransformer_backend/build/bin/{tool}", GEMM.encode())
    return buf.getvalue()


@pytest.fixture(scope="session")
def standin_image(docker_client: Any) -> str:
    """The stand-in "FasterTransformer image" (see the module docstring), imported once per session."""
    repository, tag = STANDIN_TAG.rsplit(":", 1)
    docker_client.api.import_image_from_data(
        standin_rootfs(),
        repository=repository,
        tag=tag,
        changes=[
            "ENV PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "WORKDIR /workspace",
            "ENV NCCL_LAUNCH_MODE=GROUP",
            "LABEL org.ftx.test=standin",
        ],
    )
    return STANDIN_TAG


def make_repository(
    root: Path, *, tp: int = 1, pp: int = 1, data_type: str = "fp32", weights: bool = True
) -> tuple[Path, Path]:
    """A model repository (real config.pbtxt from ftx's builder) and a stand-in ``<tp>-gpu`` checkpoint."""
    from ftx_triton.repository.model_config import FT_MODEL_NAME, FtModelOptions, build_ft_model_config, write_config

    ckpt = root / "convert" / f"{tp}-gpu"
    ckpt.mkdir(parents=True)
    (ckpt / "config.ini").write_text("[gptj]\nhead_num = 4\nweight_data_type = fp32\n")
    if weights:
        (ckpt / "model.wte.bin").write_bytes(b"\0" * 64)
    repo = root / "repository"
    write_config(
        build_ft_model_config(
            FtModelOptions(
                model_type="GPT-J", io_kind="decoder", checkpoint_path=ckpt, tp=tp, pp=pp, data_type=data_type
            )
        ),
        repo / FT_MODEL_NAME,
    )
    return repo, ckpt


def permitted_ulimits(ulimits: dict[str, int]) -> dict[str, int]:
    """``ulimits`` clamped to this sandbox's hard limits: without CAP_SYS_RESOURCE (as on the test machine)
    dockerd cannot raise memlock to unlimited, so the tests ask for the most that is allowed."""
    import resource

    names = {"memlock": resource.RLIMIT_MEMLOCK, "stack": resource.RLIMIT_STACK}
    out = {}
    for name, value in ulimits.items():
        hard = resource.getrlimit(names[name])[1] if name in names else resource.RLIM_INFINITY
        if hard != resource.RLIM_INFINITY and (value == -1 or value > hard) and not can_raise(names[name]):
            value = hard
        out[name] = value
    return out


def can_raise(limit: int) -> bool:
    """Whether this process may raise ``limit``'s hard value to unlimited (CAP_SYS_RESOURCE)."""

    script = f"import resource; resource.setrlimit({limit}, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))"
    return subprocess.run([sys.executable, "-c", script], capture_output=True, check=False).returncode == 0


def http_get(url: str, timeout_s: float = 5.0) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout_s) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except (urllib.error.URLError, OSError):
        return 0, ""
