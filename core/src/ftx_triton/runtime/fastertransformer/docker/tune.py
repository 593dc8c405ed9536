"""GEMM tuning inside the FasterTransformer image (the Docker launcher): ``gpt_gemm`` / ``t5_gemm`` -> ``gemm_config.in``.

The tool writes ``gemm_config.in`` into its **current working directory**; FasterTransformer later
reads it from tritonserver's working directory. ftx runs the tool in a container on one of the
serving GPUs (same model of GPU), with the artifact directory mounted as its working directory,
as the calling user so the store stays the user's. The result is keyed by GPU model, image id and
the tool's arguments (``default_plugins.tune.tune_key_inputs``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from ftx_triton.conversion.family import Family, ModelSpec
from ftx_triton.errors import ToolError
from ftx_triton.plan.settings import RunSettings
from ftx_triton.runtime.fastertransformer.docker import GEMM_BIN_DIR, LABEL_PREFIX
from ftx_triton.runtime.fastertransformer.docker.client import docker_errors, explain
from ftx_triton.runtime.fastertransformer.docker.spec import ContainerSpec, Mount
from ftx_triton.runtime.fastertransformer.tune import GEMM_FILE, gemm_arguments

log = structlog.get_logger(__name__)


def gemm_tool_path(family: Family) -> str:
    return f"{GEMM_BIN_DIR}/{family.gemm_tool}"


def gemm_command(family: Family, spec: ModelSpec, settings: RunSettings) -> list[str]:
    return [gemm_tool_path(family), *gemm_arguments(family, spec, settings)]


def _current_user() -> str | None:
    if not hasattr(os, "getuid"):
        return None
    return f"{os.getuid()}:{os.getgid()}"


def tune_spec(
    *,
    image: str,
    command: Sequence[str],
    work_dir: Path,
    gpu: int | str,
    user: str | None = None,
    environment: dict[str, str] | None = None,
) -> ContainerSpec:
    """The tuning container: one GPU, the work directory mounted read-write at its own path as cwd, no
    network (the tool needs none), run as the calling user so the files it writes stay the user's."""
    work = str(Path(work_dir).resolve())
    return ContainerSpec(
        image=image,
        command=tuple(command),
        gpus=(str(gpu),),
        environment=dict(environment or {}),
        mounts=(Mount(work, work, False),),
        working_dir=work,
        network_mode="none",
        init=True,
        user=user if user is not None else _current_user(),
        labels={f"{LABEL_PREFIX}.role": "tune"},
    )


@dataclass(frozen=True)
class TuneResult:
    path: Path
    output: str
    exit_code: int


def run_tune(
    client: Any, spec: ContainerSpec, *, say: Callable[[str], None] | None = None, prefix: str = "gemm"
) -> TuneResult:
    """Run the tuning container to the end; ``gemm_config.in`` must appear in its working directory."""
    say = say or (lambda text: print(text, file=sys.stderr, flush=True))
    assert spec.working_dir is not None
    target = Path(spec.working_dir) / GEMM_FILE
    target.unlink(missing_ok=True)
    try:
        container = client.containers.create(**spec.create_kwargs())
    except docker_errors() as exc:
        raise explain(exc, "creating the GEMM tuning container") from None
    lines: list[str] = []
    try:
        try:
            container.start()
        except docker_errors() as exc:
            raise explain(exc, "starting the GEMM tuning container") from None
        buf = b""
        for chunk in container.logs(stream=True, follow=True):
            buf += chunk
            while b"\n" in buf:
                raw, buf = buf.split(b"\n", 1)
                line = raw.decode(errors="replace").rstrip("\r")
                lines.append(line)
                say(f"[{prefix}] {line}")
        if buf:
            lines.append(buf.decode(errors="replace"))
        code = int(container.wait().get("StatusCode", -1))
    finally:
        try:
            container.remove(force=True)
        except docker_errors():
            pass
    output = "\n".join(lines)
    tool = Path(spec.command[0]).name if spec.command else "the GEMM tool"
    tail = "\n".join(f"  {line}" for line in lines[-12:]) or "  (no output)"
    if code != 0:
        raise ToolError(f"{tool} exited with code {code}", hint=f"its last lines:\n{tail}")
    if not target.is_file() or target.stat().st_size == 0:
        raise ToolError(
            f"{tool} finished but wrote no {GEMM_FILE} in {spec.working_dir}",
            hint=f"a wrong argument count makes it print its usage and exit 0; its last lines:\n{tail}",
        )
    log.info("tune.finished", tool=tool, args=list(spec.command[1:]), path=str(target))
    return TuneResult(target, output, code)
