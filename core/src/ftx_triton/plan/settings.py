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
import enum
import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, ClassVar

from ftx_triton.conversion.dtype_names import WEIGHT_DTYPE_NAMES
from ftx_triton.plan.options import META_KEY, OptionSection, S, normalise, option

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


class Auto(enum.Enum):
    """``auto``: a choice the plan makes (``--tp auto``: the chosen runtime's layout), never a number in disguise."""

    AUTO = "auto"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


AUTO = Auto.AUTO

DEFAULT_BATCH_DELAY_US = 20_000
"""``--batch-delay-us``'s default. At 0, Triton's dynamic batcher sends a closed loop's first request alone to
the idle instance and the other c - 1 together once it ends; each group's clients then send again while the other
group generates, so a lone request and c - 1 take turns for good (FasterTransformer generates a whole batch per
execution). Holding a batch's first request this long gathers clients that send within it into one batch
(docs/benchmarks.md, issue 38: the batcher delay against the 1 / c - 1 split)."""

DEFAULT_TEXT_BATCH_DELAY_US = 0
"""``--text-batch-delay-us``'s default: none. At 0 the ``preprocessing`` model tokenizes a burst's first request alone
and the rest after it (Triton's batcher hands an instance everything queued), so the ``text`` ensemble's requests
reach the ``fastertransformer`` model spread by those executions. Holding the first request N µs tokenizes a burst
in one execution: on the CPU it merged the first round of 32 clients, but on two H100s the ``text`` path's closed
loop still split at 32 and 64 clients with 10 ms (docs/benchmarks.md, issue 38: where a burst spreads), so a lone
request through the ensemble does not pay it by default."""


def is_auto(value: object) -> bool:
    """Whether ``value`` is :data:`AUTO` (or the word ``auto``, as a file or the command line writes it)."""
    return value is AUTO or (isinstance(value, str) and value.strip().lower() == "auto")


@dataclass(frozen=True)
class SourceSettings(OptionSection):
    """fetch: which checkpoint."""

    title: ClassVar[str] = "Source"
    source: str | None = option(
        None, help="Checkpoint to use instead of the preset's: a path, hf://org/name[@rev] or a URL."
    )
    revision: str | None = option(None, help="Branch, tag or commit of a Hugging Face source.")
    sha256: str | None = option(None, help="Expected sha256 of a downloaded archive or file (checked before use).")
    family: str | None = option(None, help="Model family (see `ftx models`); detected from config.json when omitted.")
    adapter: str | None = option(
        None,
        help="A PEFT LoRA adapter to merge into the weights before conversion: a folder (adapter_config.json "
        "and adapter_model.safetensors) or hf://org/name[@rev]; the merged checkpoint is cached under the base's "
        "and the adapter's content.",
    )


TP_AUTO_HELP = (
    "Tensor-parallel GPUs, or auto (the default): on the FasterTransformer runtimes, the smallest tp x pp "
    "whose weights and KV cache (for --tune-batch sequences of the model's full context) fit the GPUs "
    "here, more instances on the GPUs left (a --pp or --instances given is kept); tp 1 on the python "
    "runtime. --dry-run says what and why."
)


@dataclass(frozen=True)
class ConvertSettings(OptionSection):
    """convert: the FasterTransformer files."""

    title: ClassVar[str] = "Conversion"
    tp: int | Auto = option(AUTO, help=TP_AUTO_HELP, kind=int, low=1, high=64, auto=True, show_default=True)
    """:data:`AUTO` (the default, as ``ftx run``'s) becomes the chosen runtime's ``layout`` once the plan knows the
    model."""
    weight_dtype: str = option(
        "auto",
        help="Data type of the converted weight files; auto = the source's own (config.json's "
        "torch_dtype, else the weight files'), so an fp16 checkpoint is not doubled to fp32, except that "
        "`ftx run` on a FasterTransformer runtime converts to the compute type (an fp32 checkpoint served in "
        "fp16 gets fp16 files).",
        choices=("auto", *WEIGHT_DTYPE_NAMES),
        show_default=True,
    )
    """``auto`` (the default, as ``ftx run``'s) becomes the source's dtype once the pipeline has read the source."""

    @property
    def planned_tp(self) -> int:
        """tp as the plan resolved it (every stage runs after the plan: never auto there)."""
        if isinstance(self.tp, Auto):
            raise RuntimeError("tp is still auto: only a resolved plan's settings have a number")
        return self.tp

    @property
    def known_tp(self) -> int | None:
        """tp when it is a number, None while it is auto (what a runtime's cheap availability check sees)."""
        return None if isinstance(self.tp, Auto) else self.tp


@dataclass(frozen=True)
class TuneSettings(OptionSection):
    """tune: the GEMM shapes ``gemm_config.in`` is measured for."""

    title: ClassVar[str] = "GEMM tuning"
    tune: bool = option(
        True, help="Auto-tune GEMMs (fastertransformer runtime).", kind=bool, show_default=True, group="Serving"
    )
    tune_batch: int = option(
        8,
        help="Batch size to tune for (the decoder GEMMs run at batch x beam rows).",
        kind=int,
        low=1,
        high=4096,
        show_default=True,
    )
    tune_beam: int = option(1, help="Beam width to tune for.", kind=int, low=1, high=64, show_default=True)
    tune_max_input_len: int = option(
        512,
        help="Longest prompt (tokens) to tune the context GEMMs for.",
        kind=int,
        low=1,
        high=65536,
        show_default=True,
    )


DATA_TYPE_HELP = (
    "Compute type (default: the runtime's own — fp16 on the fastertransformer runtime — else the "
    "weight dtype; the python runtime computes fp16 as fp32 on a CPU; --dry-run shows the choice)."
)


@dataclass(frozen=True)
class RepositorySettings(OptionSection):
    """configure: the Triton model repository."""

    title: ClassVar[str] = "Triton repository"
    pp: int = option(
        1, help="Pipeline-parallel stages.", kind=int, low=1, high=64, show_default=True, group="Conversion"
    )
    data_type: str | None = option(None, help=DATA_TYPE_HELP, choices=WEIGHT_DTYPE_NAMES)
    """Compute type; None until the runtime is chosen (then its default, else the weight dtype)."""
    max_batch_size: int = option(  # ftx_triton.repository.model_config.DEFAULT_MAX_BATCH_SIZE
        128, help="Largest batch Triton sends to the model.", kind=int, low=1, high=4096, show_default=True
    )
    instances: int = option(
        1, help="Model instances (each holds tp x pp GPUs).", kind=int, low=1, high=64, show_default=True
    )
    text_instances: int = option(
        1,
        help="Instances (CPU processes) of the preprocessing and postprocessing models (a streaming "
        "deployment keeps one postprocessing instance: several could send a stream's pieces out of order).",
        kind=int,
        low=1,
        high=64,
        show_default=True,
    )
    text_batching: bool = option(
        True,
        help="Triton's dynamic batcher in front of the preprocessing and postprocessing models: one Python "
        "call per group of queued requests (a streamed answer sends every piece through postprocessing).",
        kind=bool,
        show_default=True,
    )
    text_batch_delay_us: int | None = option(
        None,
        help="The preprocessing model's dynamic batcher holds a batch's first request this many microseconds to "
        "batch more with it, so that requests sent together are tokenized in one call and reach the model "
        "together (its own --batch-delay-us then batches them as one); default: "
        f"{DEFAULT_TEXT_BATCH_DELAY_US} with --text-batching. 0 = tokenize what is queued at once.",
        kind=int,
        low=0,
        high=1_000_000,
    )
    """Triton's ``max_queue_delay_microseconds`` on the ``preprocessing`` model; None: :data:`DEFAULT_TEXT_BATCH_DELAY_US`
    with text batching (none without)."""
    streaming: bool = option(
        False, help="Decoupled model: one response per generated token (gRPC streaming).", kind=bool, show_default=True
    )
    stream_interval: int | Auto = option(
        AUTO,
        help="With --streaming: the model sends the first, every Nth and the last generated token's response (each "
        "holds the whole text so far). auto (the default): N grows with the batch the model generates, "
        "N = ceil(requests in the batch / 4), so the whole batch sends about 4 responses per step (one client "
        "gets every token; config.pbtxt's ftx_stream_auto_responses sets the 4). 1 = every token, as "
        "FasterTransformer's backend does.",
        kind=int,
        low=1,
        high=4096,
        auto=True,
        show_default=True,
    )
    """A streaming model sends the first, every Nth and the last step's response; 1: every step, as upstream; :data:`AUTO`:
    N from the batch of each execution (:mod:`ftx_triton.repository.stream_interval`)."""
    max_queue_size: int = option(
        0,
        help="Admission control: requests the model's queue holds; one more is refused at once (the OpenAI "
        "endpoint answers 429 with Retry-After). 0 = unbounded.",
        kind=int,
        low=0,
        high=1 << 20,
        show_default=True,
    )
    """The fastertransformer model's bounded queue (admission control); 0: unbounded, as Triton's default."""
    queue_timeout_ms: int = option(
        0,
        help="Admission control: a request that waited this long in the model's queue is refused. 0 = no limit.",
        kind=int,
        low=0,
        high=3_600_000,
        show_default=True,
    )
    """How long a request may wait in that queue before it is refused; 0: no limit."""
    batch_delay_us: int | None = option(
        None,
        help="The model's dynamic batcher holds a batch's first request this many microseconds to batch more "
        "with it (Triton's max_queue_delay_microseconds), so that clients sending together generate together "
        f"(default: {DEFAULT_BATCH_DELAY_US} with dynamic batching). 0 = send what is queued as soon as an "
        "instance is free.",
        kind=int,
        low=0,
        high=10_000_000,
    )
    """Triton's ``max_queue_delay_microseconds`` on the fastertransformer model; None: :data:`DEFAULT_BATCH_DELAY_US`
    with dynamic batching (none without)."""
    dynamic_batching: bool = option(
        True, help="Batch requests of different prompt lengths (ragged input_ids).", kind=bool, show_default=True
    )
    embeddings: bool = option(
        False,
        help="An encoder-decoder model also serves its encoder alone as the `encoder` model, for "
        "/v1/embeddings (mean-pooled encoder output). Loads the encoder's weights a second time; on "
        "FasterTransformer at tp x pp = 1.",
        kind=bool,
        show_default=True,
    )
    """Serve the encoder alone beside the model (``/v1/embeddings``)."""
    tokenizer: Path | None = option(
        None, help="Tokenizer files to use instead of the checkpoint's own.", kind=Path, must_exist=True
    )
    custom_all_reduce: bool | None = option(
        None,
        help="FasterTransformer's own all-reduce between the GPUs of one node at tp 2, 4 or 8 with one "
        "pipeline stage (ftx's kernels; GPUs without NVLink or PCIe peer access use NCCL, said in the "
        "server log). Default: on for fp16 at tp 2 and 4, where it was measured faster than NCCL; off elsewhere.",
        kind=bool,
    )
    """FasterTransformer's own all-reduce between the GPUs of one node at tp > 1 (None: ftx's default for
    the compute type and tp, ftx_triton.repository.model_config.CUSTOM_ALL_REDUCE)."""


def _port(help: str) -> Any:  # noqa: A002 - click's word
    return option(None, help=help, kind=int, low=1, high=65535)


@dataclass(frozen=True)
class ServeSettings(OptionSection):
    """serve: where and how the server listens."""

    title: ClassVar[str] = "Serving"
    host: str = option("127.0.0.1", help="Address the server binds to.", show_default=True)
    http_port: int | None = _port("HTTP port (default: Triton's 8000, or a free one when taken).")
    grpc_port: int | None = _port("gRPC port (default: Triton's 8001, or a free one when taken).")
    metrics_port: int | None = _port("Metrics port (default: Triton's 8002, or a free one when taken).")
    detach: bool = option(False, help="Leave the server running (see `ftx ps`, `ftx stop`).", kind=bool, pair=False)
    name: str | None = option(
        None,
        help="The deployment's name in `ftx ps`/`ftx stop` (letters, digits, . _ -; at most 64); "
        "a name a running server has is refused before anything starts (default: from "
        "MODEL, numbered -2, -3 … when taken).",
    )
    """The deployment's name (``ftx ps``/``ftx stop``); None: from the model, numbered when taken."""
    device: str = option("auto", help="Python runtime device.", choices=("auto", "cpu", "cuda"), show_default=True)
    openai: bool = option(
        True,
        help="Also serve an OpenAI-compatible endpoint (/v1/completions, /v1/chat/completions) in "
        "front of the ensemble.",
        kind=bool,
        show_default=True,
    )
    """Start the OpenAI-compatible endpoint beside the server (``ftx run``)."""
    openai_host: str = option("127.0.0.1", help="Address the OpenAI-compatible endpoint binds to.", show_default=True)
    openai_port: int | None = _port("Its port (default: the first free one from 9000).")


SECTIONS: dict[str, type] = {
    "fetch": SourceSettings,
    "convert": ConvertSettings,
    "tune": TuneSettings,
    "configure": RepositorySettings,
    "serve": ServeSettings,
}
"""Section attribute of :class:`RunSettings` -> its class."""


@dataclass(frozen=True)
class RunWideSettings(OptionSection):
    """The run-wide choices, declared once: ``ftx run``'s (and ``ftx lock``'s ``--runtime``) options are generated
    from these fields and :class:`RunSettings` takes its defaults from them."""

    title: ClassVar[str] = "Stages and runtime"
    until: str = option("serve", help="Stop after this stage.", choices=STAGES, show_default=True)
    runtime: str = option(
        "auto",
        help="auto, fastertransformer (its Docker or native launcher, on GPUs), python (embedded "
        "tritonserver, CPU or one GPU), or any runtime a plugin registers (see `ftx plugins`).",
        show_default=True,
    )
    force: frozenset[str] = option(
        frozenset(), help="Redo this stage even if cached (repeatable).", choices=STAGES, multiple=True
    )
    dry_run: bool = option(False, help="Print what would run, run nothing.", kind=bool, pair=False)
    accept_license: bool = option(
        False,
        help="Accept a non-commercial model licence (e.g. KoGPT's CC-BY-NC-ND-4.0); without it such a "
        "model is not fetched.",
        kind=bool,
        pair=False,
        envvar=("FTX_ACCEPT_LICENSE",),
        group="Safety",
    )
    resource_check: bool = option(
        True,
        help="Refuse to download, convert or serve what would not fit this machine's free disk "
        "(FTX_HOME) or memory (estimated from the model's parameter count and dtypes).",
        kind=bool,
        show_default=True,
        group="Safety",
    )


_RUN_WIDE = RunWideSettings()


@dataclass(frozen=True)
class RunSettings:
    """Everything a user chose for one run: run-wide choices plus one frozen section per stage."""

    model: str
    until: str = _RUN_WIDE.until
    runtime: str = _RUN_WIDE.runtime
    force: frozenset[str] = _RUN_WIDE.force
    dry_run: bool = _RUN_WIDE.dry_run
    accept_license: bool = _RUN_WIDE.accept_license
    """A non-commercial licence was accepted explicitly (``--accept-license``)."""
    resource_check: bool = _RUN_WIDE.resource_check
    """Refuse a build that would not fit the disk or memory (``--no-resource-check`` turns it off)."""
    runtime_origin: str | None = None
    """Where ``runtime`` came from when not from ``--runtime`` (``ftx configure's default``, ``ftx.toml``)."""
    untuned_because: str | None = None
    """Why tuning is off when the user did not pass ``--no-tune`` (``ftx configure`` does not tune)."""
    plugin_options: tuple[tuple[str, Any], ...] = ()
    """Values of the options runtimes and plugins add to ``ftx run`` (``Runtime.option_sections``,
    ``ftx_add_options``), as sorted (name, value) pairs; :meth:`options` reads a section of them back."""
    fetch: SourceSettings = field(default_factory=SourceSettings)
    convert: ConvertSettings = field(default_factory=ConvertSettings)
    tune: TuneSettings = field(default_factory=TuneSettings)
    configure: RepositorySettings = field(default_factory=RepositorySettings)
    serve: ServeSettings = field(default_factory=ServeSettings)

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
        declared: dict[str, Any] = {}
        for name, value in flat.items():
            if value is None and name not in _NULLABLE_OVERRIDES:
                continue
            if name == "plugin_options":
                declared.update(value)
            elif name in self.RUN_WIDE:
                run_wide[name] = frozenset(value) if name == "force" else value
            elif name in FIELD_SECTION:
                per_section.setdefault(FIELD_SECTION[name], {})[name] = _normalise(name, value)
            elif name in OptionSection.registry:  # an option a runtime's section declares (--image, --hosts)
                declared[name] = normalise(value)
            else:
                raise TypeError(f"unknown setting {name!r}")
        if declared:
            run_wide["plugin_options"] = tuple(sorted({**dict(self.plugin_options), **declared}.items()))
        sections = {attr: replace(getattr(self, attr), **changes) for attr, changes in per_section.items()}
        return replace(self, **run_wide, **sections)

    def plugin_option(self, name: str, default: object = None) -> object:
        """The value of an option a plugin added to ``ftx run`` (``default`` when it was not given)."""
        return dict(self.plugin_options).get(name, default)

    def options(self, section: type[S]) -> S:
        """The values of an option section a runtime declared (``Runtime.option_sections``), typed: what was
        given on the command line, in ``ftx.toml`` or to :meth:`of`, the section's defaults for the rest."""
        return section.from_values(dict(self.plugin_options))

    def section(self, stage: str) -> Any:
        """The settings section of ``stage`` (``fetch`` … ``serve``)."""
        return getattr(self, stage)

    @property
    def data_type(self) -> str:
        """The compute type: ``--data-type``, else the weight dtype (before a runtime default applies;
        ``auto`` until the source's dtype is known)."""
        return self.configure.data_type or self.convert.weight_dtype


_NULLABLE_OVERRIDES: frozenset[str] = frozenset()


def settings_table() -> list[tuple[str, str, str, str]]:
    """Every setting of ``ftx run`` declared in core, one row each: (``ftx.toml`` key, flag, default, the
    :class:`RunSettings` field that holds it). The click options, ``ftx.toml``'s ``[settings]`` and
    :meth:`RunSettings.of` all come from these declarations; docs/architecture.md lists this table."""
    owners: list[tuple[str, type[OptionSection]]] = [
        ("", RunWideSettings),
        *((f"{a}.", c) for a, c in SECTIONS.items()),
    ]
    rows = []
    for prefix, cls in owners:
        for name, default, declared in cls.declarations():
            flag = declared.flag or "--" + name.replace("_", "-")
            if declared.kind is bool and declared.pair:
                flag += f"/--no-{flag[2:]}"
            shown = "(none)" if default is None or default == frozenset() else str(default)
            shown = shown.lower() if isinstance(default, bool) else shown
            rows.append((name, flag, shown, f"{prefix}{name}"))
    return rows


"""Fields whose None is a value, not "keep the default" (none today)."""


def _normalise(name: str, value: Any) -> Any:
    if name in _AUTO_FIELDS and is_auto(value):
        return AUTO
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
_AUTO_FIELDS = frozenset(
    f.name for cls in SECTIONS.values() for f in fields(cls) if getattr(f.metadata.get(META_KEY), "auto", False)
)
"""Settings that take ``auto`` besides a number (``tp``, ``stream_interval``)."""


def section_fingerprint(section: Any) -> dict[str, Any]:
    """Every field of a section as JSON-able values; paths by content (files hashed)."""
    return {f.name: _key_value(getattr(section, f.name)) for f in fields(section)}


def _key_value(value: Any) -> Any:
    if isinstance(value, Auto):
        return value.value
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
    from ftx_triton.io.source_tree import tree_files

    path = Path(path)
    if path.is_file():
        return {"sha256": sha256_file(path)}
    if not path.is_dir():
        return {"path": str(path), "missing": True}
    digest = hashlib.sha256()
    for file in sorted(tree_files(path, skip=frozenset()), key=lambda f: f.rel.parts):  # links followed
        digest.update(os.fsencode(file.rel.as_posix()) + f"\0{sha256_file(file.path)}\n".encode())
    return {"tree": digest.hexdigest()}


__all__ = [
    "AUTO",
    "FIELD_SECTION",
    "SECTIONS",
    "STAGES",
    "RunWideSettings",
    "settings_table",
    "Auto",
    "ConvertSettings",
    "RepositorySettings",
    "RunSettings",
    "ServeSettings",
    "SourceSettings",
    "TuneSettings",
    "is_auto",
    "path_fingerprint",
    "section_fingerprint",
]
