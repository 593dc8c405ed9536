"""GEMM tuning with the native build: ``gpt_gemm`` / ``t5_gemm`` on one serving GPU -> ``gemm_config.in``.

The tool writes ``gemm_config.in`` into its working directory (the tune artifact's directory); the
serving step copies it into tritonserver's working directory, where FasterTransformer reads it.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import structlog

from ftx_triton.errors import ToolError
from ftx_triton.runtime.fastertransformer.native.build import BuiltBackend
from ftx_triton.runtime.fastertransformer.tune import GEMM_FILE

log = structlog.get_logger(__name__)

TOOL_LOG = "gemm-tool.log"


def runtime_environment(
    built: BuiltBackend,
    gpus: Sequence[int],
    extra: Mapping[str, str] | None = None,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """What the backend and its tools need: the build's library folders, Open MPI's prefix, exactly ``gpus``."""
    env = dict(os.environ if base is None else base)
    dirs = [str(built.backend_dir), *map(str, built.lib_dirs)]
    if built.opal_prefix is not None:  # Open MPI's private libraries (libfabric, libpmix …) before any system copy
        dirs += [str(built.opal_prefix / "lib"), str(built.opal_prefix / "lib" / "openmpi")]
    env["LD_LIBRARY_PATH"] = os.pathsep.join([*dirs, *([env["LD_LIBRARY_PATH"]] if env.get("LD_LIBRARY_PATH") else [])])
    if built.opal_prefix is not None:
        env["OPAL_PREFIX"] = str(built.opal_prefix)
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # Open MPI refuses root unless told twice
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    env.update(extra or {})
    return env


def run_gemm_tool(
    built: BuiltBackend,
    tool: str,
    args: Sequence[str],
    dest: Path,
    gpu: int,
    *,
    append: bool = False,
    timeout_s: float = 3600,
) -> Path:
    """Run ``tool`` (``gpt_gemm``/``t5_gemm``) with ``args`` in ``dest`` on ``gpu``; return gemm_config.in."""
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / GEMM_FILE
    if not append:
        target.unlink(missing_ok=True)
    argv = [str(built.tool(tool)), *args, *(["1"] if append else [])]
    env = runtime_environment(built, [gpu])
    try:
        out = subprocess.run(
            argv, cwd=dest, env=env, capture_output=True, text=True, errors="replace", timeout=timeout_s, check=False
        )
    except OSError as exc:
        raise ToolError(
            f"cannot run {tool}: {exc.strerror or exc}", hint="rebuild with `ftx backend build --force`"
        ) from None
    except subprocess.TimeoutExpired:
        raise ToolError(
            f"{tool} ran longer than {timeout_s:.0f} s", hint="lower --tune-batch / --tune-max-input-len"
        ) from None
    text = (out.stdout or "") + (out.stderr or "")
    with (dest / TOOL_LOG).open("a") as fh:
        fh.write(f"# ftx: CUDA_VISIBLE_DEVICES={gpu} {' '.join(argv)}\n{text}\n")
    tail = "\n".join(f"  {line}" for line in text.splitlines()[-12:]) or "  (no output)"
    if out.returncode != 0:
        raise ToolError(f"{tool} exited with code {out.returncode}", hint=f"its last lines:\n{tail}")
    if not target.is_file() or target.stat().st_size == 0:
        raise ToolError(
            f"{tool} finished but wrote no {GEMM_FILE} in {dest}",
            hint=f"a wrong argument count makes it print its usage and exit 0; its last lines:\n{tail}",
        )
    log.info("tune.finished", tool=tool, args=list(args), gpu=gpu, path=str(target))
    return target


__all__ = ["run_gemm_tool", "runtime_environment"]
