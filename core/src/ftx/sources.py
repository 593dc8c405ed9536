"""What a model name means: presets, built-in models and references resolved to a ``SourceRef``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import structlog

from ftx.artifacts import SourceRef
from ftx.errors import SourceError
from ftx.plugins import PluginHost
from ftx.settings import RunSettings

log = structlog.get_logger(__name__)

BUILTIN = "builtin:"


def preset_refs(host: PluginHost) -> dict[str, SourceRef]:
    """Every preset of every family as a SourceRef (built-in models are built on first use)."""
    from ftx.fetching.refs import parse_ref

    refs = {}
    for name, (_family, preset) in host.presets().items():
        if preset.source.startswith(BUILTIN):
            refs[name] = SourceRef("builtin", preset.source, preset=name)
            continue
        base = parse_ref(preset.source, revision=preset.revision)
        refs[name] = SourceRef(base.kind, base.uri, preset.revision or base.revision, preset.sha256, preset=name)
    return refs


def resolve_source(settings: RunSettings, host: PluginHost) -> tuple[SourceRef, str | None]:
    """The SourceRef for ``settings.model`` (or ``--source``) and the family a preset implies."""
    from ftx.fetching.refs import parse_ref

    presets = preset_refs(host)
    preset_family = None
    if settings.model in presets:
        family, preset = host.presets()[settings.model]
        preset_family = family.name
        if family.license or preset.license:
            log.info("license.notice", model=settings.model, license=preset.license or family.license)
    text = settings.fetch.source or settings.model
    ref = parse_ref(text, presets=presets, revision=settings.fetch.revision)
    if settings.fetch.sha256:
        ref = dataclasses.replace(ref, sha256=settings.fetch.sha256)
    if ref.kind == "builtin":
        ref = SourceRef("local", str(build_builtin(ref.uri.removeprefix(BUILTIN))), preset=ref.preset)
    return ref, preset_family


def build_builtin(name: str) -> Path:
    """Build (once, offline, deterministically) a model that ships with ftx."""
    from ftx.demo import ensure_demo_checkpoint
    from ftx.paths import ftx_home

    if name != "tiny-gptj":
        raise SourceError(f"unknown built-in model {name!r}", hint="the built-in model is tiny-gptj")
    return ensure_demo_checkpoint(ftx_home())
