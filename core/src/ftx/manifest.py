"""``ftx.toml``: a deployment file that pins plugins and the model source.

```toml
requires = ["ftx>=0.1,<1", "ftx-kogpt==0.1.0"]

[model]
source = "hf://kakaobrain/kogpt"
revision = "4f5b1d9c…"          # written by `ftx lock`
family = "kogpt"
```
``requires`` is checked against the installed distributions before any stage runs; an unmet
requirement is an error listing each one with what is installed.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement

from ftx.errors import ConfigError, PluginError

MANIFEST_NAME = "ftx.toml"
MODEL_KEYS = ("source", "revision", "family", "preset", "sha256")
"""Keys of ``[model]``; each is a string."""


@dataclass(frozen=True)
class Manifest:
    """A parsed ftx.toml."""

    path: Path
    requires: tuple[str, ...] = ()
    model: Mapping[str, Any] = field(default_factory=dict)


def load_manifest(path: Path) -> Manifest:
    """Parse ``path``; errors name the file and the key."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # TOMLDecodeError and UnicodeDecodeError are ValueErrors
        raise ConfigError(f"cannot read {path}: {exc}", hint="fix the TOML syntax (UTF-8 text), or rewrite it "
                          "with `ftx lock MODEL`") from exc
    requires = data.get("requires", [])
    if not isinstance(requires, list) or not all(isinstance(r, str) for r in requires):
        raise ConfigError(f"{path}: 'requires' must be a list of strings",
                          hint='write requires = ["ftx-gptj==0.1.0"], or rewrite the file with `ftx lock MODEL`')
    model = data.get("model", {})
    if not isinstance(model, dict):
        raise ConfigError(f"{path}: [model] must be a table", hint='write [model] on its own line, then source = "…"')
    for key in MODEL_KEYS:
        if key in model and not isinstance(model[key], str):
            raise ConfigError(f"{path}: [model] {key} must be a string, not {type(model[key]).__name__} "
                              f"{model[key]!r}", hint=f'write {key} = "…" (quoted), or rewrite the file with '
                              "`ftx lock MODEL`")
    return Manifest(path, tuple(requires), model)


def find_manifest(start: Path | None = None) -> Manifest | None:
    """``ftx.toml`` in the working directory, if there is one."""
    path = (start or Path.cwd()) / MANIFEST_NAME
    return load_manifest(path) if path.is_file() else None


def unmet_requirements(requires: Sequence[str]) -> list[tuple[str, str]]:
    """(requirement, what is installed) for every requirement the environment does not satisfy."""
    unmet = []
    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement as exc:
            raise ConfigError(f"invalid requirement {text!r} in ftx.toml: {exc}",
                              hint='write a pip requirement such as "ftx-gptj==0.1.0"') from exc
        try:
            installed = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            unmet.append((text, "not installed"))
            continue
        if not req.specifier.contains(installed, prereleases=True):
            unmet.append((text, f"{req.name} {installed} is installed"))
    return unmet


def check_requirements(manifest: Manifest) -> None:
    """Raise PluginError listing each unmet requirement of the manifest."""
    unmet = unmet_requirements(manifest.requires)
    if unmet:
        lines = "; ".join(f"{req} ({have})" for req, have in unmet)
        raise PluginError(
            f"{manifest.path} requires {lines}",
            hint="install the pinned versions (pip install " + " ".join(f"'{r}'" for r, _ in unmet) + ")",
        )


def write_lock(path: Path, requires: Sequence[str], model: Mapping[str, Any]) -> None:
    """Write ftx.toml with exact pins and the resolved source (kept human-readable)."""
    lines = ["# Written by `ftx lock`: exact plugin versions and the resolved model source.", "requires = ["]
    lines += [f"  {json.dumps(r)}," for r in requires]
    lines += ["]", "", "[model]"]
    for key, value in model.items():
        if value is None:
            continue
        rendered = json.dumps(value) if isinstance(value, str | bool) else str(value)  # a JSON string is a TOML one
        lines.append(f"{key} = {rendered}")
    path.write_text("\n".join(lines) + "\n")
