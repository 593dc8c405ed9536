"""A whole Triton model repository for one family: plan (every check), then write, then verify.

Layout::

    fastertransformer/config.pbtxt, 1/       FT backend (or the python runtime's model)
    preprocessing/config.pbtxt, 1/model.py   text → FT inputs (Python backend), tokenizer files in 1/
    postprocessing/config.pbtxt, 1/model.py  FT outputs → text
    ensemble/config.pbtxt, 1/                fastertransformer_backend's ensemble I/O (INPUT_0 … → OUTPUT_0)
    text/config.pbtxt, 1/                    generate-extension I/O (text_input, max_tokens … → text_output)
    encoder/config.pbtxt, 1/                 with --embeddings: an encoder-decoder model's encoder alone
    ftx-deployment.json                      what this repository was built from

:func:`plan_repository` raises every :class:`~ftx_triton.errors.FtxError` a user can fix before a
single file is written; :func:`write_repository` writes; :func:`verify_repository` parses every
``config.pbtxt`` back through Triton's schema and checks the FT model against the checkpoint's
``config.ini`` and the ensemble's wiring.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from ftx_triton.conversion.family import Family, ModelSpec
from ftx_triton.errors import CheckpointError, ConfigError
from ftx_triton.formats.ftformat import read_ini
from ftx_triton.formats.layout import gpu_dir_name
from ftx_triton.io.jsonfile import MAX_JSON_BYTES
from ftx_triton.io.regular import open_regular
from ftx_triton.plan.settings import DEFAULT_TEXT_BATCH_DELAY_US, Auto
from ftx_triton.repository import textproc
from ftx_triton.repository.ensemble import (
    ENSEMBLE_NAME,
    POSTPROCESSING,
    PREPROCESSING,
    TEXT_MODEL_NAME,
    build_ensemble_config,
    build_text_ensemble_config,
    check_ensemble,
)
from ftx_triton.repository.io import (
    ENCODER_MODEL_NAME,
    POSTPROCESSING_OUTPUTS,
    PREPROCESSING_INPUTS,
    PREPROCESSING_OUTPUTS,
    TensorDecl,
    postprocessing_inputs,
)
from ftx_triton.repository.model_config import (
    DATA_TYPES,
    FT_MODEL_NAME,
    FtModelOptions,
    build_ft_model_config,
    build_python_model_config,
    check_against_checkpoint,
    check_data_type,
    check_embeddings,
    check_ft_config,
    check_ft_options,
    checkpoint_ranks,
    parameter,
    parse_config,
    stream_of,
    write_config,
)
from ftx_triton.terminal.redact import redact_data

if TYPE_CHECKING:
    from ftx_triton.plan.settings import RepositorySettings

log = structlog.get_logger(__name__)

DEPLOYMENT_FILE = "ftx-deployment.json"
DEPLOYMENT_SCHEMA = "ftx_triton.deployment/1"
TEXTPROC_MODULE = "ftx_textproc.py"
MODEL_NAMES = (FT_MODEL_NAME, PREPROCESSING, POSTPROCESSING, ENSEMBLE_NAME, TEXT_MODEL_NAME)
ENSEMBLES = (ENSEMBLE_NAME, TEXT_MODEL_NAME)
_PYTHON_MODELS = Path(__file__).parent / "python_models"

FtWriter = Callable[[Path, FtModelOptions, Family], str]
"""A runtime's ``write_ft_model``: writes ``fastertransformer/`` and returns its backend."""


# --------------------------------------------------------------------------- tokenizer


@dataclass(frozen=True)
class TokenizerPlan:
    """The tokenizer files copied into pre/post-processing and the ids they are checked against."""

    kind: str
    files: Mapping[str, Path]
    origin: Path
    start_id: int
    end_id: int
    pad_id: int
    vocab_size: int

    def settings(self, io_kind: str, streaming: bool, max_positions: int | None = None) -> textproc.TextSettings:
        return textproc.TextSettings(
            io_kind=io_kind,
            tokenizer_kind=self.kind,
            start_id=self.start_id,
            end_id=self.end_id,
            pad_id=self.pad_id,
            streaming=streaming,
            max_prompt_tokens=max_positions,
        )


def collect_tokenizer_files(path: Path, family: Family) -> dict[str, Path]:
    """Tokenizer files under their repository names, from a directory or a single file."""
    path = Path(path)
    if path.is_file():
        name = path.name
        if path.suffix == ".model":
            name = textproc.SPIECE_FILE
        elif path.suffix == ".json" and name not in family.tokenizer_files:
            name = "tokenizer.json"
        return {name: path}
    if not path.is_dir():
        return {}
    # exists(), not is_file(): a named pipe or device under a tokenizer's name is refused by name later,
    # not reported as "no tokenizer"
    files = {name: path / name for name in family.tokenizer_files if (path / name).exists()}
    if textproc.SPIECE_FILE not in files:
        models = sorted(p for p in path.glob("*.model") if p.is_file())
        if len(models) == 1:
            files[textproc.SPIECE_FILE] = models[0]
    return files


def plan_tokenizer(path: Path | None, family: Family, spec: ModelSpec, *, explicit: bool = False) -> TokenizerPlan:
    """Find, load and check the tokenizer: its special tokens must have the model's ids."""
    flag = "--tokenizer" if explicit else "the checkpoint"
    hint = "pass --tokenizer PATH: a directory (or file) with tokenizer.json, vocab.json + merges.txt, or spiece.model"
    if path is None:
        raise ConfigError(f"no tokenizer: the source of this {family.name} model is unknown", hint=hint)
    files = collect_tokenizer_files(path, family)
    for src in files.values():
        _check_tokenizer_file(src)
    with tempfile.TemporaryDirectory(prefix="ftx-tokenizer-") as tmp:
        staged = Path(tmp)
        for name, src in files.items():  # linked, not copied: nothing of a checkpoint's size lands in $TMPDIR
            (staged / name).symlink_to(src.resolve())
        kind = _tokenizer_kind(staged, family)
        if kind is None:
            found = ", ".join(sorted(files)) or "no tokenizer files"
            raise ConfigError(f"{flag} at {path} has no tokenizer for {family.name} ({found})", hint=hint)
        try:
            codec = textproc.load_codec(staged, kind)
            names = textproc.special_token_names(staged)
        except textproc.TokenizerLoadError as exc:
            if "is not installed" in str(exc):
                hint = "pip install tokenizers sentencepiece (or ftx-triton[serve]); the serving image needs them too"
            raise ConfigError(f"cannot load the tokenizer from {path}: {exc}", hint=hint) from exc
    names.update(family.special_tokens)
    pad_id = spec.pad_id if spec.pad_id is not None else spec.end_id
    expected = {"eos": spec.end_id, "pad": spec.pad_id}
    if family.triton_io == "decoder":
        expected["bos"] = spec.start_id
    for role, want in expected.items():
        token = names.get(role)
        if token is None or want is None:
            continue
        got = codec.token_id(token)
        if got is None:
            raise ConfigError(
                f"the tokenizer at {path} has no {role} token {token!r}",
                hint="use the model's own tokenizer (--tokenizer)",
            )
        if got != want:
            raise ConfigError(
                f"the tokenizer's {role} token {token!r} has id {got}, but the model uses {want} "
                f"({'end_id' if role == 'eos' else 'start_id' if role == 'bos' else 'pad_id'} from config.json)",
                hint="use the model's own tokenizer, or fix the ids in the checkpoint's config.json",
            )
    vocab = spec.dims.get("V")
    if vocab is not None and codec.vocab_size > int(vocab):
        # Not fatal: byte-level tokenizers list every byte whether or not the text can reach it.
        log.warning(
            "configure.tokenizer_larger_than_model",
            tokenizer=str(path),
            tokenizer_vocab=codec.vocab_size,
            model_vocab=int(vocab),
            note="ids beyond the model's vocabulary would be out of range",
        )
    for value, what in ((spec.start_id, "start_id"), (spec.end_id, "end_id"), (pad_id, "pad_id")):
        if vocab is not None and not 0 <= value < int(vocab):
            raise ConfigError(f"{what} {value} is outside the model's vocabulary of {vocab}")
    return TokenizerPlan(
        kind=kind,
        files=files,
        origin=Path(path),
        start_id=spec.start_id,
        end_id=spec.end_id,
        pad_id=pad_id,
        vocab_size=codec.vocab_size,
    )


def _check_tokenizer_file(path: Path) -> None:
    """Refuse a tokenizer file that is no regular file (a named pipe would block the read forever) or is
    larger than any tokenizer (a sparse file of gigabytes), before a byte of it is read."""
    with open_regular(path) as file:
        size = os.fstat(file.fileno()).st_size
    if size > MAX_JSON_BYTES:
        raise ConfigError(
            f"the tokenizer file {path} is {size} bytes, larger than any tokenizer ({MAX_JSON_BYTES} at most)",
            hint="pass --tokenizer with the model's own tokenizer files",
        )


def _tokenizer_kind(directory: Path, family: Family) -> str | None:
    """The family's declared kind when its files are there, else whatever is there."""
    detected = textproc.detect_kind(directory)
    if family.tokenizer_kind == "sentencepiece" and (directory / textproc.SPIECE_FILE).is_file():
        return "sentencepiece"
    return detected


# --------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class RepositoryPlan:
    """Everything needed to write a repository, already checked."""

    family: Family
    ft: FtModelOptions
    runtime: str
    tokenizer: TokenizerPlan
    deployment: Mapping[str, Any] = field(default_factory=dict)

    @property
    def io_kind(self) -> str:
        return self.family.triton_io


def check_checkpoint(family: Family, checkpoint_dir: Path, *, tp: int, weight_dtype: str) -> dict[str, dict[str, str]]:
    """The converted ``<tp>-gpu`` directory must hold ``tp`` ranks, the model type's sections, the dtype."""
    ini_path = checkpoint_dir / "config.ini"
    if not ini_path.is_file():
        raise CheckpointError(
            f"{checkpoint_dir} has no config.ini", hint="convert the checkpoint again (--force convert)"
        )
    ini = read_ini(ini_path)
    if checkpoint_dir.name != gpu_dir_name(tp):
        raise ConfigError(
            f"{checkpoint_dir} was converted for {checkpoint_dir.name}, not for --tp {tp}",
            hint=f"convert with --tp {tp} (ftx converts automatically when it owns the checkpoint)",
        )
    ranks = checkpoint_ranks(checkpoint_dir)
    if ranks and ranks != set(range(tp)):
        raise ConfigError(
            f"{checkpoint_dir} holds weights split for ranks {sorted(ranks)}, not for --tp {tp}",
            hint=f"convert again with --tp {tp}",
        )
    missing = [s for s in family.ini.required_sections() if s not in ini]
    if missing:
        raise ConfigError(
            f"{ini_path} has no [{'], ['.join(missing)}] section, so it is not a "
            f"{family.triton_model_type} checkpoint (sections: {', '.join(ini) or 'none'})",
            hint=f"convert the source with --family {family.name}",
        )
    dtypes = {v["weight_data_type"] for v in ini.values() if "weight_data_type" in v}
    if dtypes != {weight_dtype}:
        raise ConfigError(
            f"{ini_path} says weight_data_type {', '.join(sorted(dtypes)) or 'nothing'}, expected {weight_dtype}",
            hint="convert the checkpoint again (--force convert)",
        )
    prompt = [
        f"[{name}] {key} = {value}"
        for name, values in ini.items()
        for key, value in values.items()
        if key in ("num_tasks", "prompt_learning_type") and value.strip() not in ("", "0")
    ]
    prompt += [f"[{name}]" for name in ini if name.startswith("task_")]
    if prompt:
        raise ConfigError(
            f"{ini_path} declares prompt learning ({'; '.join(prompt)}): FasterTransformer would "
            "look for prompt tables that do not exist",
            hint="convert the checkpoint again with ftx, which writes no prompt-learning keys",
        )
    return ini


def plan_repository(
    family: Family,
    spec: ModelSpec,
    ft: FtModelOptions,
    *,
    runtime: str,
    tokenizer: Path | None,
    tokenizer_explicit: bool = False,
    weight_dtype: str,
    deployment: Mapping[str, Any] | None = None,
) -> RepositoryPlan:
    """Check everything a repository depends on; raise an FtxError before anything is written."""
    if ft.model_type != family.triton_model_type or ft.io_kind != family.triton_io:
        raise ConfigError(
            f"options say model_type {ft.model_type} ({ft.io_kind}) but family {family.name} is "
            f"{family.triton_model_type} ({family.triton_io})"
        )
    check_data_type(family, ft.data_type)
    check_ft_options(ft)
    check_embeddings(ft, family.name)
    check_checkpoint(family, Path(ft.checkpoint_path), tp=ft.tp, weight_dtype=weight_dtype)
    tok = plan_tokenizer(tokenizer, family, spec, explicit=tokenizer_explicit)
    return RepositoryPlan(family=family, ft=ft, runtime=runtime, tokenizer=tok, deployment=dict(deployment or {}))


# --------------------------------------------------------------------------- write


def write_backend_ft_model(
    model_dir: Path, options: FtModelOptions, family: Family, *, stream_offset: bool = False
) -> str:
    """``fastertransformer/`` on the FasterTransformer backend (what every FT launcher serves); ``stream_offset``:
    the backend is ftx's patched build, which answers the stream offset when streaming."""
    write_config(build_ft_model_config(options, stream_offset=stream_offset), model_dir)
    return options.backend


def write_ft_model(plan: RepositoryPlan, dest: Path, writer: FtWriter) -> str:
    """``fastertransformer/``, written by the runtime's ``writer``; returns the backend it runs on."""
    model_dir = dest / FT_MODEL_NAME
    model_dir.mkdir(parents=True, exist_ok=True)
    return writer(model_dir, plan.ft, plan.family) or parse_config(model_dir / "config.pbtxt").backend


def text_instances(role: str, *, streaming: bool, count: int) -> int:
    """Instances of ``role``: ``count`` (``--text-instances``), but one postprocessing instance in a streaming
    deployment. Triton hands each streamed response to postprocessing as its own request and forwards the
    answers as they finish: with several instances a later piece can overtake an earlier one (measured: 2
    of 256 streams reordered at 64 clients with 4 instances, none with 1)."""
    if role == POSTPROCESSING and streaming:
        return 1
    return count


def describe_text_models(repo: RepositorySettings) -> str:
    """The text models (and the stream) as a dry run shows them: ``preprocessing x2, postprocessing x1, batched``
    (with ``(preprocessing holds a batch 2 ms)`` when its batcher waits), then ``, streaming (a response every 4
    tokens and the last)`` for a streaming deployment."""
    pre, post = (
        text_instances(role, streaming=repo.streaming, count=repo.text_instances)
        for role in (PREPROCESSING, POSTPROCESSING)
    )
    stream = f", streaming ({stream_of(True, repo.stream_interval).describe()})" if repo.streaming else ""
    delay = DEFAULT_TEXT_BATCH_DELAY_US if repo.text_batch_delay_us is None else repo.text_batch_delay_us
    batched = ""
    if repo.text_batching:
        batched = f", batched (preprocessing holds a batch {delay / 1000:g} ms)" if delay else ", batched"
    return f"preprocessing x{pre}, postprocessing x{post}" + batched + stream


def write_text_model(dest: Path, role: str, plan: RepositoryPlan) -> None:
    """``preprocessing/`` or ``postprocessing/``: config, model.py, textproc copy, tokenizer files."""
    io_kind = plan.io_kind
    settings = plan.tokenizer.settings(io_kind, plan.ft.streaming, plan.ft.max_positions)
    params = {"role": role, **settings.as_parameters(), "tokenizer_files": ",".join(sorted(plan.tokenizer.files))}
    inputs: tuple[TensorDecl, ...]
    outputs: tuple[TensorDecl, ...]
    if role == PREPROCESSING:
        inputs, outputs = PREPROCESSING_INPUTS, PREPROCESSING_OUTPUTS
    else:
        inputs, outputs = postprocessing_inputs(io_kind, dict(plan.ft.output_dtypes)), POSTPROCESSING_OUTPUTS
    config = build_python_model_config(
        role,
        inputs,
        outputs,
        max_batch_size=plan.ft.max_batch_size,
        parameters=params,
        instances=text_instances(role, streaming=plan.ft.streaming, count=plan.ft.text_instances),
        batching=plan.ft.text_batching,
        delay_us=plan.ft.text_batch_delay if role == PREPROCESSING else 0,
    )
    model_dir = dest / role
    write_config(config, model_dir)
    version = model_dir / "1"
    shutil.copyfile(_PYTHON_MODELS / "text_model.py", version / "model.py")
    shutil.copyfile(Path(textproc.__file__), version / TEXTPROC_MODULE)
    for name, src in plan.tokenizer.files.items():
        shutil.copyfile(src, version / name)


def repository_models(plan: RepositoryPlan) -> tuple[str, ...]:
    """The models ``plan``'s repository holds: every repository's, and the encoder with ``--embeddings``."""
    return MODEL_NAMES + ((ENCODER_MODEL_NAME,) if plan.ft.embeddings else ())


def write_repository(
    plan: RepositoryPlan,
    dest: Path,
    ft_writer: FtWriter = write_backend_ft_model,
    encoder_writer: FtWriter | None = None,
) -> tuple[str, ...]:
    """Write every model and ``ftx-deployment.json`` into ``dest``; verify; return the model names.

    ``ft_writer`` and ``encoder_writer`` are the serving runtime's contribution (the ``fastertransformer``
    model, and the ``encoder`` model that ``--embeddings`` adds)."""
    dest.mkdir(parents=True, exist_ok=True)
    backend = write_ft_model(plan, dest, ft_writer)
    if plan.ft.embeddings:
        if encoder_writer is None:
            raise ConfigError("this runtime does not serve an encoder alone", hint="leave --embeddings out")
        encoder_writer(dest / ENCODER_MODEL_NAME, plan.ft, plan.family)
    write_text_model(dest, PREPROCESSING, plan)
    write_text_model(dest, POSTPROCESSING, plan)
    ft_outputs = {o.name for o in parse_config(dest / FT_MODEL_NAME / "config.pbtxt").output}
    write_config(
        build_ensemble_config(
            plan.io_kind, max_batch_size=plan.ft.max_batch_size, output_dtypes=dict(plan.ft.output_dtypes)
        ),
        dest / ENSEMBLE_NAME,
    )
    write_config(
        build_text_ensemble_config(
            plan.io_kind, max_batch_size=plan.ft.max_batch_size, streaming=plan.ft.streaming, ft_outputs=ft_outputs
        ),
        dest / TEXT_MODEL_NAME,
    )
    for name in ENSEMBLES:
        (dest / name / "1" / ".ftx-keep").write_text("Triton needs this version directory to exist.\n")
    record = redact_data(deployment_record(plan, backend))
    (dest / DEPLOYMENT_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    verify_repository(dest)
    return repository_models(plan)


def deployment_record(plan: RepositoryPlan, backend: str) -> dict[str, Any]:
    ft = plan.ft
    tok = plan.tokenizer
    record: dict[str, Any] = {
        "schema": DEPLOYMENT_SCHEMA,
        "family": plan.family.name,
        "model_type": ft.model_type,
        "io_kind": plan.io_kind,
        "ini_sections": list(plan.family.ini.required_sections()),
        "data_types": list(ft.data_types),
        "runtime": plan.runtime,
        "backend": backend,
        "tp": ft.tp,
        "pp": ft.pp,
        "data_type": ft.data_type,
        "max_batch_size": ft.max_batch_size,
        "instances": ft.instances,
        "text_instances": ft.text_instances,
        "text_batching": ft.text_batching,
        "text_batch_delay_us": ft.text_batch_delay,
        "streaming": ft.streaming,
        "stream_interval": str(ft.stream_interval) if isinstance(ft.stream_interval, Auto) else ft.stream_interval,
        "max_queue_size": ft.max_queue_size,
        "queue_timeout_ms": ft.queue_timeout_ms,
        "batch_delay_us": ft.batch_delay,
        "dynamic_batching": ft.dynamic_batching,
        "custom_all_reduce": ft.custom_all_reduce_on,
        "checkpoint": str(ft.checkpoint_path),
        "tokenizer": {
            "kind": tok.kind,
            "files": sorted(tok.files),
            "from": str(tok.origin),
            "start_id": tok.start_id,
            "end_id": tok.end_id,
            "pad_id": tok.pad_id,
            "vocab_size": tok.vocab_size,
        },
        "embeddings": ft.embeddings,
        "models": list(repository_models(plan)),
        "endpoints": {
            "generate": f"/v2/models/{TEXT_MODEL_NAME}/generate",
            "generate_stream": f"/v2/models/{TEXT_MODEL_NAME}/generate_stream",
            "fastertransformer": f"/v2/models/{FT_MODEL_NAME}/infer",
            "ensemble": f"/v2/models/{ENSEMBLE_NAME}/infer",
            **({"encoder": f"/v2/models/{ENCODER_MODEL_NAME}/infer"} if ft.embeddings else {}),
        },
    }
    record.update(plan.deployment)
    return record


# --------------------------------------------------------------------------- verify


def verify_repository(repository: Path) -> tuple[str, ...]:
    """Parse every config.pbtxt back and check the repository; raise ConfigError listing the problems."""
    problems: list[str] = []
    models = []
    for config_path in sorted(repository.glob("*/config.pbtxt")):
        try:
            config = parse_config(config_path)
        except ConfigError as exc:
            problems.append(exc.message)
            continue
        models.append(config_path.parent.name)
        if config.name and config.name != config_path.parent.name:
            problems.append(f"{config_path}: name {config.name!r} differs from its directory")
        if not (config_path.parent / "1").is_dir():
            problems.append(f"{config_path.parent}/1/ is missing")
    for name in _recorded(repository, "models") or MODEL_NAMES:
        if name not in models and not any(name in p for p in problems):
            problems.append(f"model {name} is missing")
    ft_path = repository / FT_MODEL_NAME / "config.pbtxt"
    if ft_path.is_file() and not problems:
        ft = parse_config(ft_path)
        if ft.backend == "fastertransformer":
            problems += check_ft_config(ft, ft_path)
            checkpoint = Path(parameter(ft, "model_checkpoint_path") or "")
            if not (checkpoint / "config.ini").is_file():
                problems.append(f"{ft_path}: model_checkpoint_path {checkpoint} holds no config.ini")
            else:
                ini = read_ini(checkpoint / "config.ini")
                problems += [
                    f"{ft_path}: {p}"
                    for p in check_against_checkpoint(
                        ft,
                        ini,
                        checkpoint,
                        sections=_recorded(repository, "ini_sections") or (),
                        data_types=_recorded(repository, "data_types") or DATA_TYPES,
                    )
                ]
                model_type = _recorded(repository, "model_type")
                if model_type and parameter(ft, "model_type") != model_type:
                    problems.append(
                        f"{ft_path}: model_type {parameter(ft, 'model_type')} but {DEPLOYMENT_FILE} says {model_type}"
                    )
                recorded = _recorded(repository, "weight_dtype")
                found = {v["weight_data_type"] for v in ini.values() if "weight_data_type" in v}
                if recorded and found != {recorded}:
                    problems.append(
                        f"{DEPLOYMENT_FILE} says weight_dtype {recorded} but {checkpoint}/config.ini "
                        f"says {', '.join(sorted(found)) or 'nothing'}"
                    )
    for name in ENSEMBLES:
        if (repository / name / "config.pbtxt").is_file() and not problems:
            problems += check_ensemble(repository, name)
    for role in (PREPROCESSING, POSTPROCESSING):
        version = repository / role / "1"
        if not problems and version.is_dir():
            params = {k: v.string_value for k, v in parse_config(repository / role / "config.pbtxt").parameters.items()}
            for needed in ("model.py", TEXTPROC_MODULE):
                if not (version / needed).is_file():
                    problems.append(f"{version / needed} is missing")
            try:
                textproc.load_codec(version, params.get("tokenizer_kind", "auto"))
            except textproc.TokenizerLoadError as exc:
                problems.append(f"{role}: {exc}")
    if problems:
        raise ConfigError(
            f"the model repository {repository} is not valid:\n  " + "\n  ".join(problems),
            hint="this is a bug in ftx or a plugin; please report it with the repository attached",
        )
    return tuple(models)


def _recorded(repository: Path, key: str) -> Any:
    try:
        return json.loads((repository / DEPLOYMENT_FILE).read_text()).get(key)
    except (OSError, ValueError):
        return None
