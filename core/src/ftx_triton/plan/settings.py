"""What a user chose for one run, as frozen per-stage sections.

Each stage reads only its own section (plus the few run-wide choices), and core computes the
stage's cache key from *every* field of that section (:func:`section_fingerprint`): a field added
to a section changes the key by construction, with no list to keep in step. Paths in a section are
keyed by their content, so an edit in place makes a new artifact.

``RunSettings.of(model, tp=2, max_batch_size=32, ...)`` builds the sections from flat option names
(as click passes them); every field name is unique across sections, which is checked at import.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, ClassVar

STAGES = ("fetch", "convert", "tune", "configure", "serve")


UNTUNED_COST = (
    "FasterTransformer will use cuBLAS's default GEMM algorithms instead of the fastest ones "
    "measured on this GPU for these shapes (batch x beam); generation is slower per token by an amount that "
    "depends on the GPU and shapes, outputs are unaffected; tuning runs once and is cached"
)
NO_TUNE_COST = f"--no-tune: {UNTUNED_COST}"


def untuned_reason(settings: RunSettings) -> str:
    """What the tune stage says when it does not tune: the cause (``--no-tune``, or the command's own, e.g.
    ``ftx configure`` writing a repository without tuning) and what it costs."""
    return f"{settings.untuned_because}: {UNTUNED_COST}" if settings.untuned_because else NO_TUNE_COST


@dataclass(frozen=True)
class SourceSettings:
    """fetch: which checkpoint."""

    source: str | None = None
    revision: str | None = None
    sha256: str | None = None
    family: str | None = None


@dataclass(frozen=True)
class ConvertSettings:
    """convert: the FasterTransformer files."""

    tp: int = 1
    weight_dtype: str = "fp32"
    """``auto`` (the CLI's default) becomes the source's dtype once the pipeline has read the source."""


@dataclass(frozen=True)
class TuneSettings:
    """tune: the GEMM shapes ``gemm_config.in`` is measured for."""

    tune: bool = True
    tune_batch: int = 8
    tune_beam: int = 1
    tune_max_input_len: int = 512


@dataclass(frozen=True)
class RepositorySettings:
    """configure: the Triton model repository."""

    pp: int = 1
    data_type: str | None = None
    """Compute type; None until the runtime is chosen (then its default, else the weight dtype)."""
    max_batch_size: int = 128  # ftx_triton.repository.model_config.DEFAULT_MAX_BATCH_SIZE
    instances: int = 1
    text_instances: int = 1
    """Instances of the preprocessing and postprocessing models (CPU processes)."""
    text_batching: bool = True
    """Triton's dynamic batcher in front of the preprocessing and postprocessing models."""
    streaming: bool = False
    dynamic_batching: bool = True
    tokenizer: Path | None = None
    custom_all_reduce: bool | None = None
    """FasterTransformer's own all-reduce between the GPUs of one node at tp > 1 (None: ftx's default for
    the compute type, ftx_triton.repository.model_config.CUSTOM_ALL_REDUCE)."""


@dataclass(frozen=True)
class ServeSettings:
    """serve: where and how the server listens."""

    host: str = "127.0.0.1"
    http_port: int | None = None
    grpc_port: int | None = None
    metrics_port: int | None = None
    detach: bool = False
    device: str = "auto"
    openai: bool = True
    """Start the OpenAI-compatible endpoint beside the server (``ftx run``)."""
    openai_host: str = "127.0.0.1"
    openai_port: int | None = None
    name: str | None = None
    """The deployment's name (``ftx ps``/``ftx stop``); None: from the model, numbered when taken."""


@dataclass(frozen=True)
class LaunchSettings:
    """How a FasterTransformer launcher reaches GPUs: image, GPUs, container and node options."""

    image: str | None = None
    gpus: str | tuple[int, ...] | None = None
    docker_host: str | None = None
    shm_size: str | None = None
    env: tuple[str, ...] | Mapping[str, str] = ()
    hosts: str | None = None
    ssh_port: int | None = None
    ready_timeout: float | None = None


SECTIONS: dict[str, type] = {
    "fetch": SourceSettings,
    "convert": ConvertSettings,
    "tune": TuneSettings,
    "configure": RepositorySettings,
    "serve": ServeSettings,
    "launch": LaunchSettings,
}
"""Section attribute of :class:`RunSettings` -> its class."""


@dataclass(frozen=True)
class RunSettings:
    """Everything a user chose for one run: run-wide choices plus one frozen section per stage."""

    model: str
    until: str = "serve"
    runtime: str = "auto"
    force: frozenset[str] = frozenset()
    dry_run: bool = False
    accept_license: bool = False
    """A non-commercial licence was accepted explicitly (``--accept-license``)."""
    resource_check: bool = True
    """Refuse a build that would not fit the disk or memory (``--no-resource-check`` turns it off)."""
    runtime_origin: str | None = None
    """Where ``runtime`` came from when not from ``--runtime`` (``ftx configure's default``, ``ftx.toml``)."""
    untuned_because: str | None = None
    """Why tuning is off when the user did not pass ``--no-tune`` (``ftx configure`` does not tune)."""
    plugin_options: tuple[tuple[str, Any], ...] = ()
    """Values of the options plugins add to ``ftx run`` (``ftx_add_options``), as sorted (name, value) pairs."""
    fetch: SourceSettings = field(default_factory=SourceSettings)
    convert: ConvertSettings = field(default_factory=ConvertSettings)
    tune: TuneSettings = field(default_factory=TuneSettings)
    configure: RepositorySettings = field(default_factory=RepositorySettings)
    serve: ServeSettings = field(default_factory=ServeSettings)
    launch: LaunchSettings = field(default_factory=LaunchSettings)

    RUN_WIDE: ClassVar[tuple[str, ...]] = (
        "until",
        "runtime",
        "force",
        "dry_run",
        "accept_license",
        "resource_check",
        "runtime_origin",
        "untuned_because",
        "plugin_options",
    )

    @classmethod
    def of(cls, model: str, **flat: Any) -> RunSettings:
        """Settings from flat option names (``tp=2``, ``image="..."``); None means "the default"."""
        return cls(model=model).replace(**flat)

    def replace(self, **flat: Any) -> RunSettings:
        """A copy with the named fields changed, wherever they live; unknown names are an error."""
        run_wide: dict[str, Any] = {}
        per_section: dict[str, dict[str, Any]] = {}
        for name, value in flat.items():
            if value is None and name not in _NULLABLE_OVERRIDES:
                continue
            if name == "plugin_options":
                run_wide[name] = tuple(sorted(dict(value).items()))
            elif name in self.RUN_WIDE:
                run_wide[name] = frozenset(value) if name == "force" else value
            elif name in FIELD_SECTION:
                per_section.setdefault(FIELD_SECTION[name], {})[name] = _normalise(name, value)
            else:
                raise TypeError(f"unknown setting {name!r}")
        sections = {attr: replace(getattr(self, attr), **changes) for attr, changes in per_section.items()}
        return replace(self, **run_wide, **sections)

    def plugin_option(self, name: str, default: object = None) -> object:
        """The value of an option a plugin added to ``ftx run`` (``default`` when it was not given)."""
        return dict(self.plugin_options).get(name, default)

    def section(self, stage: str) -> Any:
        """The settings section of ``stage`` (``fetch`` … ``serve``, or ``launch``)."""
        return getattr(self, stage)

    @property
    def data_type(self) -> str:
        """The compute type: ``--data-type``, else the weight dtype (before a runtime default applies;
        ``auto`` until the source's dtype is known)."""
        return self.configure.data_type or self.convert.weight_dtype


_NULLABLE_OVERRIDES: frozenset[str] = frozenset()
"""Fields whose None is a value, not "keep the default" (none today)."""


def _normalise(name: str, value: Any) -> Any:
    if name == "env" and isinstance(value, list):
        return tuple(value)
    if name == "tokenizer" and value is not None:
        return Path(value)
    return value


def _field_sections() -> dict[str, str]:
    owners: dict[str, str] = {}
    for attr, cls in SECTIONS.items():
        for f in fields(cls):
            if f.name in owners or f.name in RunSettings.RUN_WIDE or f.name == "model":
                raise TypeError(f"setting {f.name!r} is declared twice ({owners.get(f.name)} and {attr})")
            owners[f.name] = attr
    return owners


FIELD_SECTION = _field_sections()
"""Flat option name -> the section attribute holding it."""


def section_fingerprint(section: Any) -> dict[str, Any]:
    """Every field of a section as JSON-able values; paths by content (files hashed)."""
    return {f.name: _key_value(getattr(section, f.name)) for f in fields(section)}


def _key_value(value: Any) -> Any:
    if isinstance(value, Path):
        return path_fingerprint(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return section_fingerprint(value)
    if isinstance(value, Mapping):
        return {str(k): _key_value(v) for k, v in sorted(value.items())}
    if isinstance(value, tuple | list | frozenset | set):
        items = [_key_value(v) for v in value]
        return sorted(items, key=str) if isinstance(value, frozenset | set) else items
    return value


def path_fingerprint(path: Path) -> dict[str, Any]:
    """A path by what it holds: every file's relative name and sha256, not where it lies (a copy keys as the
    original); a missing path keys as missing, by its name."""
    from ftx_triton.io.hashing import sha256_file

    path = Path(path)
    if path.is_file():
        return {"sha256": sha256_file(path)}
    if not path.is_dir():
        return {"path": str(path), "missing": True}
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(f"{file.relative_to(path).as_posix()}\0{sha256_file(file)}\n".encode())
    return {"tree": digest.hexdigest()}


__all__ = [
    "FIELD_SECTION",
    "SECTIONS",
    "STAGES",
    "ConvertSettings",
    "LaunchSettings",
    "RepositorySettings",
    "RunSettings",
    "ServeSettings",
    "SourceSettings",
    "TuneSettings",
    "path_fingerprint",
    "section_fingerprint",
]
