"""Frozen records passed between stages and hooks.

Each stage writes into a directory the core gives it; these records describe what is there.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

R = TypeVar("R")


@dataclass(frozen=True)
class SourceRef:
    """Where a checkpoint comes from, before it is fetched.

    ``kind`` is one of ``local``, ``hf``, ``url``. ``uri`` is the canonical text
    (``/abs/path``, ``hf://org/name``, ``https://…``); ``revision`` is a branch, tag or
    commit for ``hf`` (None = the default branch); ``sha256`` an expected archive checksum.
    ``preset`` names the preset the reference came from, if any.
    """

    kind: str
    uri: str
    revision: str | None = None
    sha256: str | None = None
    preset: str | None = None

    @property
    def display(self) -> str:
        return f"{self.uri}@{self.revision}" if self.revision else self.uri


@dataclass(frozen=True)
class Source:
    """A fetched checkpoint: a directory holding config.json and weights (or a slim checkpoint).

    ``revision`` is the resolved commit (hf) or a content fingerprint (local, url).
    """

    ref: SourceRef
    path: Path
    revision: str
    origin: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Checkpoint:
    """A converted FasterTransformer checkpoint: ``path`` is the ``<tp>-gpu`` directory."""

    path: Path
    tensor_parallel: int
    weight_dtype: str
    family: str
    non_finite: tuple[str, ...] = ()
    """FT tensors holding NaN or Inf values (said at every run that serves it)."""


@dataclass(frozen=True)
class GemmConfig:
    """The result of GEMM tuning: ``path`` to ``gemm_config.in``, or None when untuned."""

    path: Path | None
    tuned: bool
    reason: str = ""


@dataclass(frozen=True)
class ModelRepository:
    """A Triton model repository ready to serve; ``runtime`` names the runtime it was written for."""

    path: Path
    runtime: str
    models: tuple[str, ...]
    family: str


class ServedDeployment(Protocol):
    """What a runtime's ``serve`` hands back besides the URLs: the running deployment, to watch and stop.

    The python and native runtimes' :class:`~ftx_triton.server.tritonserver.TritonServer` and the Docker launcher's
    container both offer it, and so must a third-party runtime's handle.
    """

    @property
    def name(self) -> str:
        """The deployment's name (``ftx ps`` and ``ftx stop`` use it for servers ftx records)."""

    @property
    def log_path(self) -> Path | None:
        """Its full log, or None when the runtime keeps none."""

    @property
    def metrics_url(self) -> str | None:
        """Prometheus metrics, when served."""

    @property
    def pid(self) -> int | None:
        """The local process that leads it, when it is one (a container has none here)."""

    @property
    def stop_hint(self) -> str | None:
        """How to stop it once ftx has detached, when that is not ``ftx stop NAME`` (ftx records it: None)."""

    def stop(self) -> None:
        """Stop it and release what it holds; idempotent."""

    def wait(self, timeout: float | None = None) -> int:
        """Block until it exits and return its exit code; ``subprocess.TimeoutExpired`` after ``timeout``."""

    def detach(self) -> object:
        """Leave it running after ftx exits (recorded for ``ftx ps`` when ``stop_hint`` is None)."""

    def exit_report(self) -> str:
        """Why it stopped by itself: the cause and the log's last lines."""


@dataclass(frozen=True)
class Endpoint:
    """A running server: its URLs and the deployment that serves them."""

    http_url: str
    grpc_url: str
    model: str = "text"  # the repository's generate-extension model
    handle: ServedDeployment | None = None
    streams: bool | None = None
    """Whether the ``fastertransformer`` model is decoupled, as the server said; None: not asked."""


# --------------------------------------------------------------------------- stage results on disk


def to_record(value: Any, base: Path) -> dict[str, Any]:
    """A stage result as JSON-able data, paths inside ``base`` stored relative to it.

    The store keeps this in the artifact's provenance, and :func:`from_record` rebuilds the same
    typed value on a cache hit, so a result is never re-derived from path conventions.
    """
    out: dict[str, Any] = {}
    for f in dataclasses.fields(value):
        item = getattr(value, f.name)
        if f.name == "handle":
            continue
        if isinstance(item, Path):
            item = _relative(item, base)
        elif dataclasses.is_dataclass(item):
            item = to_record(item, base)
        elif isinstance(item, Mapping):
            item = dict(item)
        elif isinstance(item, tuple):
            item = list(item)
        out[f.name] = item
    return out


def from_record(cls: type[R], data: Mapping[str, Any], base: Path) -> R:
    """The inverse of :func:`to_record` for the record class ``cls``."""
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in data:
            continue
        item = data[f.name]
        hint = hints[f.name]
        if item is not None and Path in _members(hint):
            item = Path(item) if Path(item).is_absolute() else base / item
        elif isinstance(hint, type) and dataclasses.is_dataclass(hint):
            item = from_record(hint, item, base)
        elif item is not None and tuple in _members(hint):
            item = tuple(item)
        kwargs[f.name] = item
    return cls(**kwargs)


def _members(hint: Any) -> tuple[Any, ...]:
    args = typing.get_args(hint)
    origin = typing.get_origin(hint)
    if args and origin is not tuple:
        return tuple(typing.get_origin(a) or a for a in args)
    return (origin or hint,)


def _relative(path: Path, base: Path) -> str:
    try:
        return path.relative_to(base).as_posix()
    except ValueError:
        return str(path)
