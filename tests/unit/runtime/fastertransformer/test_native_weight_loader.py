"""ftx's pinned weight loader (a C++ file of the native patch set) and the log line it leaves, without a GPU.

The loader's own source (``patch_files/ftx_weight_loader.cc``) is compiled with the host compiler against a FAKE
CUDA runtime (``weight_loader_harness/``: no GPU here), whose copies are deferred until an event after them is
synchronized and then read their source buffer: a staging buffer refilled before its copy was awaited shows up
as wrong bytes. Chunks are 4 KiB here (16 MiB in the build), so small files take several. The backend's log
line it prints is parsed by the same code that reads the server log. The real build is compiled on the GPU
machine (``ftx backend build``); these tests skip where no C++ compiler is found.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
from fake_cuda_build import compile_driver, copy_patch_files
from ftx_triton.runtime.fastertransformer.logscan import LogScanner
from ftx_triton.runtime.fastertransformer.native.weight_load import WeightLoad, log_weight_loads, weight_loads
from structlog.testing import capture_logs

HARNESS = Path(__file__).parent / "weight_loader_harness"
CHUNK = 4096
UTILS = Path("src/fastertransformer/utils")


@dataclass
class Loaded:
    stdout: str
    stderr: str
    device: list[bytes]

    @property
    def load(self) -> WeightLoad:
        (load,) = weight_loads(self.stdout)
        return load


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("loader")
    utils = root / UTILS
    copy_patch_files(utils, "ftx_weight_loader.h", "ftx_weight_loader.cc")
    shutil.copy(HARNESS / "cuda_utils.h", utils / "cuda_utils.h")
    shutil.copy(HARNESS.parent / "ft_standins" / UTILS / "logger.h", utils / "logger.h")
    sources = [str(utils / "ftx_weight_loader.cc"), str(HARNESS / "fake_cuda.cc"), str(HARNESS / "driver.cc")]
    flags = [f"-DFTX_WEIGHT_CHUNK_BYTES={CHUNK}", f"-I{root}"]
    return compile_driver(root / "driver", *flags, *sources, what="the loader")


def load(driver: Path, tmp_path: Path, *specs: str, env: dict[str, str] | None = None) -> Loaded:
    out = tmp_path / "device"
    out.mkdir(exist_ok=True)
    done = subprocess.run(
        [str(driver), str(out), *specs],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k not in ("FTX_FT_LOADER", "FAKE_PIN_FAIL")} | (env or {}),
    )
    assert done.returncode == 0, done.stderr
    return Loaded(done.stdout, done.stderr, [(out / f"{i}.bin").read_bytes() for i in range(len(specs))])


def weight_file(path: Path, size: int) -> Path:
    path.write_bytes(bytes((i * 7 + i // 251) % 256 for i in range(size)))
    return path


def test_a_file_of_several_chunks_lands_whole_through_two_reused_pinned_buffers(driver: Path, tmp_path: Path) -> None:
    """3 full chunks and a tail (each staging buffer refilled while the other's copy may still be in flight), then a
    second file; both byte for byte on the "device", no copy left in flight after each load, the two pinned buffers
    allocated once for both files."""
    big = weight_file(tmp_path / "big.bin", 3 * CHUNK + 2 * 100)  # 100 x 61 fp16 values: 3 chunks and a tail
    small = weight_file(tmp_path / "small.bin", 12)
    loaded = load(driver, tmp_path, f"{big}:100,61:2", f"{small}:3:4")
    assert loaded.device == [big.read_bytes()[: 100 * 61 * 2], small.read_bytes()]
    assert loaded.stdout.count("ready 1") == 2 and loaded.stdout.count("pending 0") == 2
    assert "pinned 2" in loaded.stdout
    assert loaded.stderr == ""
    assert loaded.load.bytes == 100 * 61 * 2 + 12 and loaded.load.files == 2 and loaded.load.loader == "pinned"
    assert (loaded.load.rank, loaded.load.gpu, loaded.load.total_s) == (3, 1, 2.5)


def test_a_file_longer_than_the_weight_loads_its_first_bytes_as_upstream_does(driver: Path, tmp_path: Path) -> None:
    longer = weight_file(tmp_path / "longer.bin", CHUNK + 500)
    loaded = load(driver, tmp_path, f"{longer}:{CHUNK // 2}:2")
    assert loaded.device == [longer.read_bytes()[:CHUNK]]


def test_a_missing_file_is_warned_about_as_upstream_and_ftx_scan_refuses_it(driver: Path, tmp_path: Path) -> None:
    missing = tmp_path / "model.wte.bin"
    loaded = load(driver, tmp_path, f"{missing}:8:2")
    assert loaded.device == [b"\xab" * 16]  # the weight is left as it was
    line = loaded.stderr.rstrip("\n")
    assert line == f"[FT][WARNING] file {missing} cannot be opened, loading model fails! "
    finding = LogScanner().scan(line)
    assert finding is not None and finding.kind == "weight-missing" and str(missing) in finding.message
    assert loaded.load.files == 0 and loaded.load.loader == "no"


def test_a_short_file_is_refused_whole_with_upstreams_warning(driver: Path, tmp_path: Path) -> None:
    """Upstream reads a short file and then refuses it: nothing of it reaches the GPU, and the warning gives the
    file's size and the bytes the weight needs (ftx's scan turns it into an error)."""
    short = weight_file(tmp_path / "short.bin", 3 * CHUNK - 1)
    loaded = load(driver, tmp_path, f"{short}:{3 * CHUNK // 2}:2")
    assert loaded.device == [b"\xab" * (3 * CHUNK)]
    line = loaded.stderr.rstrip("\n")
    assert (
        line == f"[FT][WARNING] file {short} only has {3 * CHUNK - 1}, but request {3 * CHUNK}, loading model fails! "
    )
    finding = LogScanner().scan(line)
    assert finding is not None and finding.kind == "weight-size"


def test_a_stream_that_ends_early_is_warned_about_with_the_bytes_it_gave(driver: Path, tmp_path: Path) -> None:
    """A file that is not a regular one (here a pipe that gives one chunk and a half) is read until it ends; the
    copies made are awaited before the warning."""
    fifo = tmp_path / "pipe.bin"
    os.mkfifo(fifo)
    data = bytes(range(256)) * ((CHUNK + CHUNK // 2) // 256)

    def write() -> None:
        with fifo.open("wb") as pipe:
            pipe.write(data)

    writer = threading.Thread(target=write)
    writer.start()
    loaded = load(driver, tmp_path, f"{fifo}:{2 * CHUNK}:1")
    writer.join(timeout=10)
    assert f"only has {len(data)}, but request {2 * CHUNK}" in loaded.stderr
    assert "pending 0" in loaded.stdout
    assert loaded.device[0][:CHUNK] == data[:CHUNK]  # the whole chunk before the end was copied, as said


def test_zero_and_three_dimensional_shapes_load_nothing_with_upstreams_messages(driver: Path, tmp_path: Path) -> None:
    present = weight_file(tmp_path / "w.bin", 64)
    loaded = load(driver, tmp_path, f"{present}:0:2", f"{present}:2,2,2:2")
    assert f"[FT][WARNING] shape is zero, skip loading weight from file {present} " in loaded.stderr
    assert "[ERROR] shape should have less than two dims" in loaded.stdout
    assert loaded.device[1] == b"\xab" * 16 and loaded.load.files == 0


@pytest.mark.parametrize(
    ("env", "warned"),
    [({"FTX_FT_LOADER": "upstream"}, False), ({"FAKE_PIN_FAIL": "1"}, True)],
    ids=["chosen", "no-pin"],
)
def test_the_upstream_loader_serves_when_chosen_or_when_nothing_can_be_pinned(
    driver: Path, tmp_path: Path, env: dict[str, str], warned: bool
) -> None:
    """Not ready: the caller (loadWeightFromBinFunc) reads as upstream does. A failed pinning is said once per
    thread, and its CUDA error is cleared so FasterTransformer's later checks do not see it."""
    present = weight_file(tmp_path / "w.bin", 64)
    loaded = load(driver, tmp_path, f"{present}:8:2", f"{present}:8:2", env=env)
    assert loaded.stdout.count("ready 0") == 2 and "pinned 0" in loaded.stdout
    assert loaded.stderr.count("cannot pin") == (1 if warned else 0)
    assert loaded.device == [b"\xab" * 16] * 2
    if warned:  # ftx's log scan reports it as a warning: the server still serves
        finding = LogScanner().scan(loaded.stderr.splitlines()[0])
        assert finding is not None and (finding.kind, finding.severity) == ("weight-loader", "warning")
        assert "(out of memory)" in finding.message


def test_each_gpus_line_of_a_server_log_becomes_one_event() -> None:
    """tritonserver's own prefix before the backend's line, other lines between; a line cut short is not read."""
    text = (
        "I1127 02:10:01.000001 77 libfastertransformer.cc:438] Before Loading Weights:\n"
        "I1127 02:10:02.500000 77 libfastertransformer.cc:449] ftx: weights of rank 1 on GPU 1 loaded: 6050000000 "
        "bytes (6.050 GB) from 229 files in 0.812 s (7.45 GB/s, pinned loader); 1.034 s in all\n"
        "after allocation: free: 70.01 GB, total: 79.10 GB, used:  9.09 GB\n"
        "I1127 02:10:02.600000 77 libfastertransformer.cc:449] ftx: weights of rank 0 on GPU 0 loaded: 6050000000 "
        "bytes (6.050 GB) from 229 files in 9.001 s (0.67 GB/s, upstream loader); 9.340 s in all\n"
        "ftx: weights of rank 2 on GPU 2 loaded: 12 bytes (0.000 GB) from 1 files in\n"
    )
    with capture_logs() as logs:
        loads = log_weight_loads(text)
    assert [(w.rank, w.gpu, w.loader, w.seconds, w.gb_per_s, w.total_s) for w in loads] == [
        (1, 1, "pinned", 0.812, 7.45, 1.034),
        (0, 0, "upstream", 9.001, 0.67, 9.34),
    ]
    events = [e for e in logs if e["event"] == "serve.weights_loaded"]
    assert [(e["rank"], e["gb"], e["files"], e["seconds"]) for e in events] == [
        (1, 6.05, 229, 0.812),
        (0, 6.05, 229, 9.001),
    ]
