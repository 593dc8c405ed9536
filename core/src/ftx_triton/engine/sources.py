"""What a model name means: presets, built-in models and references resolved to a ``SourceRef``."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from pathlib import Path

import structlog

from ftx_triton.errors import SourceError
from ftx_triton.plan.artifacts import SourceRef
from ftx_triton.plan.settings import RunSettings
from ftx_triton.plugins import PluginHost

log = structlog.get_logger(__name__)

BUILTIN = "builtin:"


class PresetRefs(Mapping[str, SourceRef]):
    """Every preset of every family as a SourceRef, each parsed when it is first looked up (built-in models are
    built on first use): a run names one preset, and checking a Hugging Face name loads huggingface_hub."""

    def __init__(self, host: PluginHost) -> None:
        self._presets = host.presets()
        self._parsed: dict[str, SourceRef] = {}

    def __getitem__(self, name: str) -> SourceRef:
        if name not in self._parsed:
            from ftx_triton.fetching.refs import parse_ref

            _family, preset = self._presets[name]
            if preset.source.startswith(BUILTIN):
                self._parsed[name] = SourceRef("builtin", preset.source, preset=name)
            else:
                base = parse_ref(preset.source, revision=preset.revision)
                self._parsed[name] = SourceRef(
                    base.kind, base.uri, preset.revision or base.revision, preset.sha256, preset=name
                )
        return self._parsed[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._presets)

    def __len__(self) -> int:
        return len(self._presets)


def preset_refs(host: PluginHost) -> PresetRefs:
    """Every preset of every family as a SourceRef (see :class:`PresetRefs`)."""
    return PresetRefs(host)


def resolve_source(settings: RunSettings, host: PluginHost) -> tuple[SourceRef, str | None]:
    """The SourceRef for ``settings.model`` (or ``--source``) and the family a preset implies."""
    from ftx_triton.fetching.refs import parse_ref

    presets = preset_refs(host)
    preset_family = None
    if settings.model in presets:
        family, preset = host.presets()[settings.model]
        preset_family = family.name
        if family.license or preset.license:
            log.info("license.notice", model=settings.model, license=preset.license or family.license)
    text = settings.fetch.source or settings.model
    try:
        ref = parse_ref(text, presets=presets, revision=settings.fetch.revision)
    except SourceError:
        if hidden := host.hidden_family(text):  # a family's preset, its plugin left out by the user
            raise hidden from None
        raise
    if settings.fetch.sha256:
        _check_sha256_applies(ref, text, settings.fetch.sha256)
        ref = dataclasses.replace(ref, sha256=settings.fetch.sha256)
    if ref.kind == "builtin":
        ref = SourceRef("local", str(build_builtin(ref.uri.removeprefix(BUILTIN), host)), preset=ref.preset)
    return ref, preset_family


def _check_sha256_applies(ref: SourceRef, text: str, sha256: str) -> None:
    """--sha256 checks a file that is downloaded or extracted (a URL, a local archive): well-formed, and
    never silently ignored for a source it cannot check."""
    from ftx_triton.fetching.integrity import normalize_sha256

    normalize_sha256(sha256)
    what = {"builtin": "a model built by ftx", "hf": "a Hugging Face repository"}.get(ref.kind)
    if ref.kind == "local" and Path(ref.uri).is_dir():
        what = "a directory"
    if what is not None:
        raise SourceError(
            f"--sha256 checks a downloaded or archived file, and {text!r} is {what}",
            hint="drop --sha256: a Hugging Face source is pinned by --revision COMMIT, a directory "
            "or a built-in model by `ftx lock`",
        )


def build_builtin(name: str, host: PluginHost) -> Path:
    """Build (once, offline, with its family's recipe) a model that ships with a family plugin."""
    from ftx_triton.engine.builtin import builtin_model, ensure_builtin
    from ftx_triton.paths import ftx_home

    return ensure_builtin(ftx_home(), name, builtin_model(host, name))
