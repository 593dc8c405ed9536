"""Built-in models: a preset whose source is ``builtin:NAME`` is built offline at first use, by its family.

``ensure_builtin(home, name, model)`` returns ``<home>/builtin/<name>``: the Hugging Face checkpoint the family's
:class:`~ftx_triton.conversion.family.BuiltinModel` writes (the gptj plugin's ``tiny-gptj``, the default of the
README's first command, trains a 2-layer GPT-J for a few seconds). Core owns only the mechanism: the build runs
in a temporary directory under a lock and is published by one rename, so a killed build leaves nothing behind; a
marker (``ftx-demo.json``: name, version, recipe, the sha256 of every file) says a finished build is current.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from ftx_triton.errors import SourceError

if TYPE_CHECKING:
    from ftx_triton.conversion.family import BuiltinModel
    from ftx_triton.plugins import PluginHost

log = structlog.get_logger(__name__)

MARKER = "ftx-demo.json"
BUILD_DISK_BYTES = 16 << 20
"""Room a build needs: a tiny checkpoint (about 2 MB) built beside its final place, with headroom."""


def builtin_dir(home: Path, name: str) -> Path:
    """Where the built-in model ``name`` lives in ``home``."""
    return Path(home) / "builtin" / name


def builtin_model(host: PluginHost, name: str) -> BuiltinModel:
    """The recipe of the built-in model ``name``, from the preset of that name a family declares."""
    found = host.presets().get(name)
    preset = found[1] if found else None
    if preset is None or preset.builtin is None or preset.source != f"builtin:{name}":
        known = sorted(n for n, (_f, p) in host.presets().items() if p.builtin is not None)
        raise SourceError(
            f"unknown built-in model {name!r}",
            hint=f"the built-in models are {', '.join(known)}" if known else "no installed family declares one",
        )
    return preset.builtin


def _marker_ok(path: Path, model: BuiltinModel) -> bool:
    try:
        marker = json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return False
    if marker.get("version") != model.version or marker.get("recipe") != model.recipe:
        return False
    return all((path / name).is_file() for name in marker.get("files", {}))


def ensure_builtin(home: Path, name: str, model: BuiltinModel) -> Path:
    """The built-in model ``name`` under ``<home>/builtin/<name>``, built with ``model`` on first use."""
    from ftx_triton.io.atomic import lock_for, publish_dir

    target = builtin_dir(home, name)
    if _marker_ok(target, model):
        return target
    from ftx_triton.io.atomic import announced
    from ftx_triton.plan.resources import require_disk
    from ftx_triton.terminal.console import status

    what = f"building the built-in {name} model"
    require_disk(target.parent, BUILD_DISK_BYTES, what)
    with announced(lock_for(target), what):
        if _marker_ok(target, model):  # another process built it while we waited
            return target
        started = time.perf_counter()
        about = f" ({model.about})" if model.about else ""
        with status(f"{what}{about} …"), publish_dir(target, replace=True, locked=False) as tmp:
            build_into(tmp, name, model)
        log.info("demo.built", path=str(target), seconds=round(time.perf_counter() - started, 2))
    return target


def build_into(dest: Path, name: str, model: BuiltinModel) -> Path:
    """Build ``name`` with ``model`` into ``dest`` and write its marker (deterministic where the recipe is)."""
    dest.mkdir(parents=True, exist_ok=True)
    facts = dict(model.build(dest) or {})
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(dest.iterdir()) if p.is_file()}
    record = {"name": name, "version": model.version, "recipe": dict(model.recipe), "files": files, **facts}
    (dest / MARKER).write_text(json.dumps(record, indent=2))
    return dest
