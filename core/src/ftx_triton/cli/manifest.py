"""``ftx.toml``: a deployment file that pins plugins and the model source.

```toml
requires = ["ftx-triton>=0.1,<1", "ftx-triton-kogpt==0.1.0"]

[model]
source = "hf://kakaobrain/kogpt"
revision = "4f5b1d9c…"          # written by `ftx lock`
family = "kogpt"

[settings]                      # written by `ftx lock`: every setting of the deployment
runtime = "python"
tp = 1
weight_dtype = "fp16"

[stack]                         # written by `ftx lock`: what the deployment computes and serves with
python = "3.11.7"
torch = "2.5.1"
numpy = "2.1.3"
fastertransformer-docker = "fastertransformer_backend@c6936c39be6f FasterTransformer@df4a75348601 triton 23.05"
```
``requires`` is checked against the installed distributions before any stage runs; an unmet
requirement is an error listing each one with what is installed. ``[stack]`` is compared with this
machine's (:func:`check_stack`): a difference is refused by ``ftx run`` unless ``--allow-drift``.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from ftx_triton.errors import ConfigError, PluginError

MANIFEST_NAME = "ftx.toml"
MODEL_KEYS = ("source", "revision", "family", "preset", "sha256", "adapter", "adapter_revision")
"""Keys of ``[model]``; each is a string."""


@dataclass(frozen=True)
class Manifest:
    """A parsed ftx.toml."""

    path: Path
    requires: tuple[str, ...] = ()
    model: Mapping[str, Any] = field(default_factory=dict)
    settings: Mapping[str, Any] = field(default_factory=dict)
    stack: Mapping[str, str] = field(default_factory=dict)


MAX_MANIFEST_BYTES = 1 << 20
"""The largest deployment file read (one ``ftx lock`` writes is a few hundred bytes)."""


def _manifest_text(path: Path) -> str:
    """The file's text: a regular file of at most :data:`MAX_MANIFEST_BYTES` (a FIFO or ``/dev/zero`` is
    refused without blocking on it or reading it to the end)."""
    from ftx_triton.errors import CheckpointError
    from ftx_triton.io.regular import read_regular

    try:
        return read_regular(path, MAX_MANIFEST_BYTES).decode("utf-8")
    except CheckpointError as exc:  # a pipe, device or directory
        raise ValueError(exc.message) from None


def load_manifest(path: Path) -> Manifest:
    """Parse ``path``; errors name the file and the key."""
    try:
        data = tomllib.loads(_manifest_text(path))
    except (OSError, ValueError, RecursionError) as exc:  # TOMLDecodeError and UnicodeDecodeError are ValueErrors
        raise ConfigError(
            f"cannot read {path}: {exc}", hint="fix the TOML syntax (UTF-8 text), or rewrite it with `ftx lock MODEL`"
        ) from exc
    requires = data.get("requires", [])
    if not isinstance(requires, list) or not all(isinstance(r, str) for r in requires):
        raise ConfigError(
            f"{path}: 'requires' must be a list of strings",
            hint='write requires = ["ftx-triton-gptj==0.1.0"], or rewrite the file with `ftx lock MODEL`',
        )
    model = data.get("model", {})
    if not isinstance(model, dict):
        raise ConfigError(f"{path}: [model] must be a table", hint='write [model] on its own line, then source = "…"')
    for key in MODEL_KEYS:
        if key in model and not isinstance(model[key], str):
            raise ConfigError(
                f"{path}: [model] {key} must be a string, not {type(model[key]).__name__} {model[key]!r}",
                hint=f'write {key} = "…" (quoted), or rewrite the file with `ftx lock MODEL`',
            )
    settings = data.get("settings", {})
    if not isinstance(settings, dict):
        raise ConfigError(
            f"{path}: [settings] must be a table",
            hint="write [settings] on its own line, then "
            "one `option = value` per line, or rewrite the file with `ftx lock MODEL`",
        )
    stack = data.get("stack", {})
    if not isinstance(stack, dict) or not all(isinstance(v, str) for v in stack.values()):
        raise ConfigError(
            f'{path}: [stack] must be a table of strings (package = "version")',
            hint="rewrite the file with `ftx lock MODEL --force`",
        )
    return Manifest(path, tuple(requires), model, settings, stack)


def find_manifest(start: Path | None = None, lock: Path | None = None) -> Manifest | None:
    """The deployment file: ``lock`` when given (``ftx run --lock FILE``), else ``ftx.toml`` in the working
    directory, if there is one."""
    if lock is not None:
        return load_manifest(Path(lock))
    path = (start or Path.cwd()) / MANIFEST_NAME
    return load_manifest(path) if path.is_file() else None


def unmet_requirements(requires: Sequence[str]) -> list[tuple[str, str]]:
    """(requirement, what is installed) for every requirement the environment does not satisfy."""
    from packaging.requirements import InvalidRequirement, Requirement

    unmet = []
    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement as exc:
            raise ConfigError(
                f"invalid requirement {text!r} in ftx.toml: {exc}",
                hint='write a pip requirement such as "ftx-triton-gptj==0.1.0"',
            ) from exc
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


STACK_PACKAGES = ("torch", "transformers", "numpy", "nvidia-pytriton")
"""The Python distributions that compute and serve (nvidia-pytriton carries the tritonserver binary)."""


def current_stack(runtimes: Iterable[Any] = ()) -> dict[str, str]:
    """This machine's stack: Python, :data:`STACK_PACKAGES` and each runtime's :meth:`identity` (the sources its
    image or build comes from)."""
    import platform

    stack = {"python": platform.python_version()}
    for name in STACK_PACKAGES:
        try:
            stack[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            stack[name] = "not installed"
    for runtime in runtimes:
        stack.update({str(k): str(v) for k, v in runtime.identity().items()})
    return stack


def stack_drift(manifest: Manifest, runtimes: Iterable[Any] = ()) -> list[str]:
    """``name: locked -> here`` for every entry of the lock's ``[stack]`` this machine differs in."""
    here = current_stack(runtimes)
    return [
        f"{name} {locked} -> {here.get(name, 'unknown here')}"
        for name, locked in manifest.stack.items()
        if here.get(name) != locked
    ]


def check_stack(manifest: Manifest, runtimes: Iterable[Any], *, allow_drift: bool) -> None:
    """Refuse (ConfigError) a replay on another stack than the lock's, or only warn with ``allow_drift``."""
    drift = stack_drift(manifest, runtimes)
    if not drift:
        return
    what = f"{manifest.path} was locked on another stack: " + "; ".join(drift)
    if allow_drift:
        from ftx_triton.terminal.console import warn

        warn(f"{what} (going on: --allow-drift)")
        return
    raise ConfigError(
        what,
        hint="install the locked versions (the same image and build pins come with the same ftx-triton), pass "
        "--allow-drift to serve with this stack anyway, or `ftx lock --force` to pin this one",
    )


LOCKED_SECTIONS = ("convert", "tune", "configure", "serve")
"""Settings sections ``ftx lock`` records (every field that is set), so ``ftx run`` reproduces them, besides the
options the runtimes declare (``Runtime.option_sections``)."""
_NOT_LOCKED = frozenset({"detach"})


def locked_settings(settings: Any) -> dict[str, Any]:
    """Flat option values of a (resolved) RunSettings that shape the deployment, TOML-ready."""
    from dataclasses import fields

    from ftx_triton.plan.options import OptionSection
    from ftx_triton.plan.settings import Auto

    out: dict[str, Any] = {"runtime": settings.runtime}
    values = [
        (f.name, getattr(getattr(settings, s), f.name)) for s in LOCKED_SECTIONS for f in fields(settings.section(s))
    ]
    declared = [(name, value) for name, value in settings.plugin_options if name in OptionSection.registry]
    for name, value in [*values, *declared]:
        if value is None or name in _NOT_LOCKED or value == () or value == {}:
            continue
        if isinstance(value, Auto):
            value = str(value)  # as asked: the machine that replays the lock plans its own layout
        elif isinstance(value, Path):
            value = str(value)
        elif isinstance(value, tuple):
            value = list(value)
        elif isinstance(value, Mapping):
            value = {str(k): str(v) for k, v in value.items()}
        out[name] = value
    return out


def write_lock(
    path: Path,
    requires: Sequence[str],
    model: Mapping[str, Any],
    settings: Mapping[str, Any] | None = None,
    *,
    stack: Mapping[str, str] | None = None,
    replace: bool = False,
) -> None:
    """Write ftx.toml (with tomlkit: any path or value is quoted correctly) through a temp file and a rename.

    An existing file that says something else is replaced only with ``replace`` (``ftx lock --force``): a lock
    is committed and reviewed, so rewriting it silently would lose its pins."""
    import tomlkit

    from ftx_triton.io.atomic_file import write_atomic

    doc = tomlkit.document()
    doc.add(
        tomlkit.comment(
            "Written by `ftx lock`: exact plugin versions, the resolved model source and every "
            "setting of the deployment."
        )
    )
    doc.add(tomlkit.comment("`ftx run` with no MODEL reproduces it; options given on the command line override it."))
    doc["requires"] = tomlkit.array()
    for requirement in requires:
        doc["requires"].append(requirement)
    doc["requires"].multiline(True)
    table = tomlkit.table()
    for key, value in model.items():
        if value is not None:
            table[key] = value
    doc["model"] = table
    if settings:
        section = tomlkit.table()
        for key, value in settings.items():
            section[key] = value
        doc["settings"] = section
    if stack:
        pinned = tomlkit.table()
        pinned.add(tomlkit.comment("the stack it was locked on: `ftx run` refuses another unless --allow-drift"))
        for key, value in stack.items():
            pinned[key] = value
        doc["stack"] = pinned
    if path.is_symlink() or (path.exists() and not path.is_file()):
        # the rename would replace the link or special file itself (as root: /dev/null with a text file)
        raise ConfigError(
            f"{path} exists and is not a regular file; ftx lock writes a new file there",
            hint="pass -o with the path of a file (e.g. ./ftx.toml) that is absent or a regular file",
        )
    text = tomlkit.dumps(doc)
    if path.is_file() and not replace and _existing_text(path) != text:
        raise ConfigError(
            f"{path} already exists and pins something else; ftx lock does not overwrite it silently",
            hint="pass --force to replace it (review the difference before committing it), or -o another file",
        )
    try:
        write_atomic(path, text)
    except OSError as exc:
        raise ConfigError(
            f"cannot write {path}: {exc.strerror or exc}", hint="pass -o with a writable path in an existing directory"
        ) from None


def _existing_text(path: Path) -> str | None:
    """The deployment file already at ``path`` (None when it cannot be read as one)."""
    try:
        return _manifest_text(path)
    except (OSError, ValueError):
        return None


def locked_source(manifest: Manifest) -> str:
    """``[model] source`` as ``ftx run`` takes it: a local directory (pinned by ``tree_sha256``) is written relative
    to the lock file, so the file can be committed and replayed from any checkout; it is resolved against the
    file's directory here."""
    source = str(manifest.model.get("source", ""))
    if "tree_sha256" in manifest.model and not Path(source).is_absolute():
        return str((manifest.path.parent / source).resolve())
    return source


def locked_adapter(manifest: Manifest) -> str | None:
    """``[model] adapter`` as ``--adapter`` takes it: a Hub adapter at its locked commit, or a folder (relative to
    the lock file) that must still hold what it held at ``ftx lock`` time."""
    from ftx_triton.fetching.local_keys import local_content_key, whole_file_key
    from ftx_triton.paths import ftx_home

    adapter, revision = manifest.model.get("adapter"), manifest.model.get("adapter_revision")
    if not adapter:
        return None
    if str(adapter).startswith("hf://"):
        return f"{adapter}@{revision}" if revision else str(adapter)
    folder = (manifest.path.parent / str(adapter)).resolve()
    if (
        revision
        and folder.is_dir()
        and local_content_key(folder, ftx_home()).key != revision
        and whole_file_key(folder) != revision  # a lock of an earlier ftx, whose keys were whole-file sha256s
    ):
        raise ConfigError(
            f"the locked adapter {folder} changed since `ftx lock` (its files' sha256 differ)",
            hint="restore the locked adapter, or run `ftx lock` again to pin the new one",
        )
    return str(folder)


def check_local_source(manifest: Manifest) -> None:
    """A locked local source must hold what it held at ``ftx lock`` time (by content)."""
    from ftx_triton.fetching.local_keys import local_fingerprint
    from ftx_triton.plan.settings import path_fingerprint

    model = manifest.model
    source = Path(locked_source(manifest))
    if "tree_sha256" not in model:
        return
    if not source.is_dir():
        raise ConfigError(
            f"the locked source {source} does not exist", hint="restore it, or run `ftx lock` again for the new source"
        )
    if model.get("fingerprint") == local_fingerprint(source):
        return  # same names, sizes and times: unchanged
    if path_fingerprint(source).get("tree") != model["tree_sha256"]:
        raise ConfigError(
            f"the locked source {source} changed since `ftx lock` (its files' sha256 differ)",
            hint="restore the locked checkpoint, or run `ftx lock` again to pin the new one",
        )
