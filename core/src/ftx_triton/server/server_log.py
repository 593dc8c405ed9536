"""Reading tritonserver's log: the failure that explains a start or an exit, the models that loaded,
and the tail shown to the user.
"""

from __future__ import annotations

import contextlib
import re
import signal
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

from ftx_triton.server.install import python_version
from ftx_triton.server.supervisor import signal_name

LOG_TAIL_LINES = 30


# Messages every CPU-only start prints; they never explain a failure.
_NOISE = re.compile(
    r"Unable to allocate pinned system memory|CUDA memory pool disabled|CudaDriverHelper has not"
    r"|unable to create stream for ensemble: CUDA driver"
    r"|Failed to initialize NVML|DCGM unable to start|Collecting CPU metrics"
)


def _clean_lines(text: str) -> list[str]:
    """Log lines minus blanks, table borders, the server-options table and CPU-only noise."""
    lines: list[str] = []
    in_options = False
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or re.fullmatch(r"\+[-+]*\+", stripped) or _NOISE.search(line):
            continue
        if stripped.startswith("|"):
            in_options = in_options or stripped.replace(" ", "").startswith("|Option|Value|")
            if not in_options:
                lines.append(re.sub(r" {2,}", " ", stripped))
            continue
        in_options = False
        lines.append(line)
    return lines


def log_tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` meaningful lines of a tritonserver log."""
    return "\n".join(_clean_lines(text)[-lines:])


def _unescape(message: str) -> str:
    return message.replace("\\n", "\n").replace('\\"', '"').strip().rstrip('"').strip()


def _compact_reason(reason: str) -> str:
    """'Internal: RuntimeError: boom\\n\\nAt:\\n  model.py(2): initialize' in one line."""
    lines = [line.strip() for line in _unescape(reason).splitlines() if line.strip()]
    if not lines:
        return "unknown reason"
    head, frames = lines[0], [line for line in lines[1:] if line != "At:"]
    text = head + (f" (at {frames[-1]})" if frames else "")
    return text if len(text) <= 600 else text[:597] + "..."


_FAILED_MODEL = re.compile(r"failed to load '([^']+)' version \d+: (.*)$")
_POLL_FAILED = re.compile(r"Poll failed for model directory '([^']+)': (.*)$")
MISSING_LIB = re.compile(r"error while loading shared libraries: (\S+?): cannot open shared object file")
PORT_IN_USE = re.compile(r"Socket '([^']+)' already in use")
SERVICE_FAILED = re.compile(r"failed to start (\w+) service: (.*)$")
LOADING = re.compile(r'"loading: ([^:"]+):\d+"')
STUB_LAUNCH = re.compile(r"^bash: (?:line \d+: )?(.*)$", re.MULTILINE)
_CRASH = re.compile(r"Signal \((\d+)\) received")
_NCCL_FAILED = re.compile(r"^Failed, NCCL error (\S+) '([^'\n]*)'", re.MULTILINE)
"""FasterTransformer's NCCL check, which ends the process after this line (a crash signal may follow it)."""
_SUPERVISOR = re.compile(r"^ftx-supervisor: (.*)$", re.MULTILINE)
_MPI_RANK_SIGNALED = re.compile(
    r"(?:mpirun|prterun|prte) noticed that process rank (\d+) with PID \d+ on node (\S+) exited on\s+signal (\d+)"
)
"""Open MPI's report (4.x says mpirun, 5.x prterun) of a rank that died of a signal; it then ends the others."""
_MPI_RANK_FAILED = re.compile(r"Process name:\s+\[\[\d+,\d+\],(\d+)\]\s+Exit code:\s+(\d+)")
"""Open MPI's report of the first rank that exited non-zero."""
LOADED = re.compile(r"successfully loaded '([^']+)'")
_GLOG_CLOCK = re.compile(r"^[IWEF]\d{4} (\d\d):(\d\d):(\d\d(?:\.\d+)?) ")


def log_clock(line: str) -> float | None:
    """The seconds since midnight a tritonserver log line was written at (``I1126 16:43:18.461937 …``), or None."""
    match = _GLOG_CLOCK.match(line)
    if match is None:
        return None
    hours, minutes, seconds = match.groups()
    return int(hours) * 3600 + int(minutes) * 60 + float(seconds)


def failed_models(text: str) -> dict[str, str]:
    """Model name to a one-line reason, for each model the log says failed to load."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        match = _FAILED_MODEL.search(line) or _POLL_FAILED.search(line)
        if match and match.group(1) not in found:
            found[match.group(1)] = _compact_reason(match.group(2))
    return found


@dataclass(frozen=True)
class Diagnosis:
    """The likely cause of a failed start and what to do about it."""

    cause: str
    hint: str
    port_in_use: bool = False


def diagnose(text: str, *, log_path: Path | None = None) -> Diagnosis | None:
    """Recognise why tritonserver did not start from its log text, or None if nothing is known."""
    see_log = f"full log: {log_path}" if log_path else "see the server log"
    if match := MISSING_LIB.search(text):
        lib = match.group(1)
        if lib.startswith("libpython"):
            ver = python_version()
            return Diagnosis(
                f"the Python-backend stub cannot start: {lib} is missing",
                f"install the shared libpython for Python {ver} (Debian: apt-get install "
                f"libpython{ver}) or use a Python built with --enable-shared",
            )
        return Diagnosis(
            f"the Python-backend stub cannot start: shared library {lib} not found",
            "LD_LIBRARY_PATH must list <site-packages>/nvidia_pytriton.libs (ftx sets it); "
            "reinstall nvidia-pytriton if that directory is incomplete",
        )
    if match := STUB_LAUNCH.search(text):
        return Diagnosis(
            f"the Python-backend stub could not be launched: bash: {match.group(1)}",
            "tritonserver starts stubs through `bash -c`; a path it cannot split right (a space, "
            "a `$`) breaks the command: use an FTX_HOME and repository path of plain characters; " + see_log,
        )
    if match := PORT_IN_USE.search(text):
        return Diagnosis(
            f"port in use: {match.group(1)}",
            "choose other ports, or let ftx pick free ones; `ftx ps` lists servers ftx left running",
            port_in_use=True,
        )
    failed = failed_models(text)
    if failed:
        cause = "; ".join(f"model '{name}' failed to load: {reason}" for name, reason in failed.items())
        if "_recursion_count" in text:
            libdir = sysconfig.get_config_var("LIBDIR")
            return Diagnosis(
                cause + " — the stub runs a different libpython than this interpreter",
                f"put {libdir} first in LD_LIBRARY_PATH, or make the venv from the system python3",
            )
        if "ModuleNotFoundError" in cause:
            return Diagnosis(
                cause,
                f"install the missing module into the environment of {sys.executable} "
                "(the stub runs the python3 first on PATH)",
            )
        names = ", ".join(failed)
        return Diagnosis(cause, f"fix the model ({names}) in the repository; {see_log}")
    if match := SERVICE_FAILED.search(text):
        return Diagnosis(
            f"tritonserver could not start its {match.group(1)} service: {_unescape(match.group(2))}", see_log
        )
    if match := re.search(r"error: creating server: (.*)", text):
        return Diagnosis(f"tritonserver could not be created: {match.group(1).strip()}", see_log)
    return None


def exit_cause(text: str) -> str | None:
    """Why a running tritonserver stopped, from its log: a failed NCCL call of FasterTransformer's, a crash
    signal, an MPI rank's end, or the supervisor's report of a dead stub or of how tritonserver ended."""
    causes = [
        f"FasterTransformer's NCCL call failed: {reason} ({where})" for where, reason in _NCCL_FAILED.findall(text)[:1]
    ]
    crashes = [int(n) for n in _CRASH.findall(text) if int(n) not in (signal.SIGTERM, signal.SIGINT)]
    if crashes:  # tritonserver also says "Signal (15) received." when it is asked to stop
        causes.append(f"tritonserver crashed with {signal_name(-crashes[0])}")
    for rank, node, number in _MPI_RANK_SIGNALED.findall(text)[:1]:
        causes.append(f"MPI rank {rank} on {node} died of {signal_name(-int(number))}; mpirun ended the other ranks")
    for rank, code in _MPI_RANK_FAILED.findall(text)[:1]:
        causes.append(f"MPI rank {rank} exited with code {code}; mpirun ended the other ranks")
    causes += [r for r in _SUPERVISOR.findall(text) if "died" in r or "exited by itself" in r]
    return "; ".join(causes) if causes else None


def last_exit_cause(path: Path, tail_bytes: int = 1 << 16) -> str | None:
    """:func:`exit_cause` of the last start recorded in the log at ``path`` (its tail; None if unreadable)."""
    try:
        with path.open("rb") as fh:
            fh.seek(max(0, fh.seek(0, 2) - tail_bytes))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return None
    return exit_cause(text.rsplit("\n# ftx: ", 1)[-1])


def python_backend_models(repository: Path) -> list[str]:
    """Models of a repository that run on the Python backend (each needs a stub process)."""
    found = []
    for config in Path(repository).glob("*/config.pbtxt"):
        with contextlib.suppress(OSError):
            if re.search(r'^\s*backend:\s*"python"', config.read_text(), re.MULTILINE):
                found.append(config.parent.name)
    return sorted(found)


class LogWatch:
    """Reads lines appended to a log file since a given offset."""

    def __init__(self, path: Path, offset: int) -> None:
        self.path, self.offset, self._partial = path, offset, ""

    def new_lines(self) -> list[str]:
        try:
            with self.path.open("rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return []
        self.offset += len(data)
        text = self._partial + data.decode("utf-8", "replace")
        *lines, self._partial = text.split("\n")
        return lines

    def wait(self, timeout_s: float, step_s: float = 0.01) -> bool:
        """Sleep until the file holds more than has been read (True), at most ``timeout_s`` (False): a line is
        seen within ``step_s`` of being written, for one ``stat`` per step instead of a poll's work."""
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(OSError):
                if self.path.stat().st_size > self.offset:
                    return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(step_s, left))


def read_from(path: Path, offset: int) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
