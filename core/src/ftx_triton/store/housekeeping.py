"""What the store holds and what may go: artifacts with size, source, age and use; removal; logs.

Every artifact's provenance (``ftx-artifact.json``) names the keys it was built from, so the store
is a graph: ``convert`` builds on ``fetch``, ``configure`` on ``convert`` and ``tune``. A
``configure`` artifact (a model repository) points at its ``convert`` artifact at serve time, so
removing a checkpoint removes the repositories built on it too. An artifact a running tritonserver
serves (found with psutil, whatever started it) is never removed. "Last used" is the provenance
file's modification time, which a cache hit refreshes.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import stat
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from ftx_triton.errors import ConfigError
from ftx_triton.io.trees import remove_tree, tree_size
from ftx_triton.store import leases
from ftx_triton.store.artifact_store import PROVENANCE_FILE, ArtifactStore, read_provenance

log = structlog.get_logger(__name__)

UPSTREAM_KEYS = {"convert": ("fetch",), "configure": ("convert", "tune")}
"""Which artifact keys each stage's provenance inputs name."""
LOGS_KEPT = 20
"""Server logs kept under ``<home>/triton/logs`` (the newest; older ones are removed)."""
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)
_STAGE_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
_KEY_NAME = re.compile(r"[0-9a-f]{8,64}")  # make_key's hex digests
_SIZE_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_MAX_SIZE = 1e18
_REMOVAL_TRASH = re.compile(r"\.[0-9a-f]{8,64}\.rm-[0-9a-f]{8}")
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


@dataclass
class StoreEntry:
    """One published artifact."""

    stage: str
    key: str
    path: Path
    size: int
    created: str
    last_used: float
    source: str
    upstream: list[tuple[str, str]] = field(default_factory=list)
    in_use: bool = False
    damaged: bool = False

    @property
    def ref(self) -> str:
        return f"{self.stage}/{self.key}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "key": self.key,
            "path": str(self.path),
            "size": self.size,
            "created": self.created,
            "last_used": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.last_used)),
            "source": self.source,
            "in_use": self.in_use,
            "damaged": self.damaged,
            "upstream": [f"{stage}/{key}" for stage, key in self.upstream],
        }


def parse_size(text: str) -> int:
    """``50GB``, ``500M``, ``1.5g``, ``1024`` → bytes (decimal units)."""
    match = _SIZE.match(text)
    if not match:
        raise ConfigError(f"not a size: {text!r}", hint="write it like 50GB, 500MB or 1.5T")
    size = float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]
    if not math.isfinite(size) or size > _MAX_SIZE:
        raise ConfigError(f"size out of range: {text!r}", hint="write it like 50GB, 500MB or 1.5T (at most 1000000T)")
    return int(size)


def parse_age(text: str) -> float:
    """``30d``, ``12h``, ``2w``, ``90m`` → seconds."""
    match = _AGE.match(text)
    if not match:
        raise ConfigError(f"not a duration: {text!r}", hint="write it like 30d, 12h, 2w or 90m")
    return float(match.group(1)) * _AGE_UNITS[match.group(2).lower()]


def _source_text(stage: str, meta: dict[str, Any]) -> str:
    """What an artifact was made from, for `ftx ls`: printable text only (provenance is read from disk)."""
    inputs = _mapping(meta.get("inputs"))
    if stage == "fetch":
        ref = _mapping(_mapping(meta.get("result")).get("ref"))
        text = str(ref.get("preset") or ref.get("uri") or inputs.get("ref") or "?")
    elif stage == "tune":
        text = f"{inputs.get('family', '?')} GEMMs ({inputs.get('runtime', '?')})"
    else:
        return ""
    return "".join(c if c.isprintable() else "?" for c in text[:300])


def running_repositories() -> set[Path]:
    """Model repositories of every tritonserver running on this machine (any user, any launcher)."""
    import psutil

    found: set[Path] = set()
    for proc in psutil.process_iter(["name", "cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if not cmdline or "tritonserver" not in Path(cmdline[0]).name and proc.info.get("name") != "tritonserver":
            continue
        for arg in cmdline:
            if arg.startswith("--model-repository="):
                found.add(Path(arg.split("=", 1)[1]).resolve())
    return found


def inventory(store: ArtifactStore) -> list[StoreEntry]:
    """Every published artifact, its source traced through the keys it was built from; one whose
    provenance cannot be read (never used again: a lookup rebuilds it) is listed as damaged."""
    entries: dict[tuple[str, str], StoreEntry] = {}
    for path in _artifact_dirs(store):
        stage, key = path.parent.name, path.name
        last_used = _mtime(path / PROVENANCE_FILE) or _mtime(path)
        meta = read_provenance(path)
        if meta is None:
            entries[(stage, key)] = StoreEntry(
                stage,
                key,
                path,
                tree_size(path),
                "",
                last_used,
                "damaged: its provenance is missing or unreadable",
                damaged=True,
            )
            continue
        inputs = _mapping(meta.get("inputs"))
        upstream = [(name, inputs[name]) for name in UPSTREAM_KEYS.get(stage, ()) if isinstance(inputs.get(name), str)]
        entries[(stage, key)] = StoreEntry(
            stage,
            key,
            path,
            tree_size(path),
            str(meta.get("finished_at", ""))[:40],
            last_used,
            _source_text(stage, meta),
            upstream,
        )
    for entry in entries.values():  # sources of derived artifacts: follow the keys up to a fetch
        if not entry.source:
            entry.source = _trace_source(entry, entries)
    served = running_repositories()
    pointed_at = _served_model_configs(served)
    for entry in entries.values():
        if (
            (entry.stage == "configure" and entry.path.resolve() in served)
            or _named_in(entry.path, pointed_at)
            or leases.held_elsewhere(store.lease(entry.stage, entry.key))
        ):
            for used in [entry, *closure(entry, entries)]:
                used.in_use = True
    return sorted(entries.values(), key=lambda e: (e.stage, -e.last_used))


def _served_model_configs(repositories: set[Path]) -> str:
    """The model configs of served repositories, as one text: a repository placed outside the store
    (``ftx configure -o``) names the store's converted weights in them."""
    texts = []
    for repository in repositories:
        for config in repository.glob("*/config.pbtxt"):
            with contextlib.suppress(OSError):  # ftx wrote it: read whole
                texts.append(config.read_text(errors="replace"))
    return "\n".join(texts)


def _named_in(path: Path, text: str) -> bool:
    return bool(text) and (f"{path}/" in text or f"{path.resolve()}/" in text)


def _artifact_dirs(store: ArtifactStore) -> list[Path]:
    """The directories ``store/<stage>/<key>`` named as ftx names them, that are directories of the
    store itself: a link (to another file system, or out of the home) is no artifact, so nothing
    reached through one is ever listed, let alone removed."""
    return [
        path
        for stage_dir in _stage_dirs(store)
        for path in sorted(stage_dir.iterdir())
        if _KEY_NAME.fullmatch(path.name) and not path.is_symlink() and path.is_dir()
    ]


def _stage_dirs(store: ArtifactStore) -> list[Path]:
    """``store/<stage>`` directories named as ftx names stages, never links."""
    if not store.root.is_dir():
        return []
    return [
        d for d in sorted(store.root.iterdir()) if _STAGE_NAME.fullmatch(d.name) and not d.is_symlink() and d.is_dir()
    ]


def _mtime(path: Path) -> float:
    try:
        return os.lstat(path).st_mtime
    except OSError:
        return 0.0


def _mapping(value: object) -> dict[str, Any]:
    """``value`` if it is a JSON object, else an empty one (provenance is read from disk, not trusted)."""
    return value if isinstance(value, dict) else {}


def _trace_source(entry: StoreEntry, entries: dict[tuple[str, str], StoreEntry]) -> str:
    for stage, key in entry.upstream:
        found = entries.get((stage, key))
        if found is not None and stage != "tune":
            return found.source or _trace_source(found, entries)
    return "?"


def closure(entry: StoreEntry, entries: dict[tuple[str, str], StoreEntry]) -> list[StoreEntry]:
    """What ``entry`` was built from, transitively."""
    out: list[StoreEntry] = []
    for stage, key in entry.upstream:
        found = entries.get((stage, key))
        if found is not None and found not in out:
            out += [found, *closure(found, entries)]
    return out


def dependents(targets: Iterable[StoreEntry], entries: Iterable[StoreEntry]) -> list[StoreEntry]:
    """Repositories that point at a removed checkpoint or GEMM config (they cannot serve without it)."""
    removed = {(t.stage, t.key) for t in targets}
    return [
        e
        for e in entries
        if e.stage == "configure"
        and (e.stage, e.key) not in removed
        and any(up in removed for up in e.upstream if up[0] in ("convert", "tune"))
    ]


def find(entries: list[StoreEntry], text: str) -> list[StoreEntry]:
    """Artifacts named by their source (the SOURCE column of `ftx ls`: the model and everything built from it),
    a key (or a unique prefix of 4+ characters), ``stage/key`` or their path."""
    given, text = text, text.strip().rstrip("/")
    if named := by_source(entries, text):
        return named
    as_path = Path(text).expanduser()
    if as_path.is_absolute() or os.sep in text and not re.fullmatch(r"\w+/[0-9a-f]+", text):
        resolved = as_path.resolve()
        return [e for e in entries if e.path.resolve() == resolved]
    stage, _, key = text.rpartition("/")
    if len(key) < 4:
        raise ConfigError(f"{given!r} is too short to name an artifact", hint="give 4 or more characters of a key")
    matches = [e for e in entries if e.key.startswith(key) and (not stage or e.stage == stage)]
    if len(matches) > 1 and len({e.key for e in matches}) > 1:
        shown = ", ".join(e.ref for e in matches[:5])
        raise ConfigError(f"{text!r} matches several artifacts ({shown})", hint="give more characters of the key")
    return matches


def by_source(entries: list[StoreEntry], name: str) -> list[StoreEntry]:
    """The artifacts of one model, named as `ftx ls` shows its source (``ftx rm tiny-gptj``, as ``ollama rm
    NAME``): its fetch and the conversions and repositories built on it (shared GEMM configs stay). A name
    several fetched versions share is ambiguous: the error lists their keys."""
    named = [e for e in entries if e.stage != "tune" and e.source == name]
    lineages: dict[str, StoreEntry] = {}
    for entry in named:
        root = next(
            (up for up in [entry, *closure(entry, {(e.stage, e.key): e for e in entries})] if up.stage == "fetch"),
            entry,
        )
        lineages.setdefault(root.ref, root)
    if len(lineages) > 1:
        shown = ", ".join(f"{ref} ({entry.created or 'unknown date'})" for ref, entry in sorted(lineages.items()))
        raise ConfigError(
            f"{name!r} names {len(lineages)} fetched versions in the store: {shown}",
            hint=f"remove one by its key (`ftx rm {next(iter(sorted(lineages)))}`), or see them all with `ftx ls`",
        )
    return named


class ArtifactInUse(ConfigError):
    """An artifact another running ftx process uses or builds."""


def remove_entry(store: ArtifactStore, entry: StoreEntry) -> int:
    """Remove one artifact, never while another ftx process builds or uses it; return the bytes freed.

    Under the key's build lock and its exclusive use lease the artifact is only renamed to a hidden
    sibling (same directory, so same file system); its bytes are deleted after both are given back, so a
    run waiting to look it up waits for a rename. One removed meanwhile by another ftx frees nothing.
    (The build lock's file stays: filelock cannot tell a waiter that its file was unlinked.)
    """
    import filelock  # here: every run imports this module for rotate_logs, which takes no lock

    lock = filelock.FileLock(str(store.lock_path(entry.stage, entry.key)))
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        raise ArtifactInUse(
            f"{entry.ref} is being built by another ftx process", hint="wait for it to finish, then remove it"
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"cannot lock {entry.ref}: {lock.lock_file} is unusable ({exc.strerror or exc})",
            hint="remove that path (no ftx process is using it), then try again",
        ) from None
    trash = entry.path.with_name(f".{entry.key}.rm-{uuid.uuid4().hex[:8]}")
    try:
        with leases.exclusive(store.lease(entry.stage, entry.key)) as free:
            if not free:
                raise ArtifactInUse(
                    f"{entry.ref} is in use by another running ftx process",
                    hint="let it finish (`ftx ps` lists servers), then remove it",
                )
            try:
                os.replace(entry.path, trash)  # gone from the store at once; the bytes follow
            except FileNotFoundError:
                return 0  # another ftx removed it first
    finally:
        lock.release()
    remove_tree(trash)
    log.info("store.removed", stage=entry.stage, key=entry.key, bytes=entry.size)
    return entry.size


def prune_selection(
    entries: list[StoreEntry],
    *,
    unused: bool = False,
    older_than_s: float | None = None,
    to_size: int | None = None,
    now: float | None = None,
) -> list[StoreEntry]:
    """What ``ftx prune`` removes: never what a running server uses; repositories on removed parts follow."""
    now = time.time() if now is None else now
    free = [e for e in entries if not e.in_use]
    chosen: list[StoreEntry] = []
    if unused:
        needed = {(up_stage, up_key) for e in entries for up_stage, up_key in e.upstream}
        chosen += [e for e in free if (e.stage, e.key) not in needed]
    if older_than_s is not None:
        chosen += [e for e in free if now - e.last_used > older_than_s and e not in chosen]
    if to_size is not None:
        total = sum(e.size for e in entries) - sum(e.size for e in chosen)
        for entry in sorted(free, key=lambda e: e.last_used):  # least recently used first
            if total <= to_size:
                break
            if entry not in chosen:
                chosen.append(entry)
                total -= entry.size
    chosen += [d for d in dependents(chosen, entries) if d not in chosen and not d.in_use]
    return chosen


def rotate_logs(home: Path, keep: int = LOGS_KEPT) -> list[Path]:
    """Remove all but the ``keep`` newest server logs; return what was removed."""
    logs = sorted((Path(home) / "triton" / "logs").glob("*.log"), key=lambda p: p.stat().st_mtime, reverse=True)
    removed = []
    written = _open_for_writing(set(logs[keep:]))
    for old in logs[keep:]:
        if old in written:
            continue  # a running server's log
        with contextlib.suppress(OSError):
            old.unlink()
            removed.append(old)
    return removed


def _open_for_writing(paths: set[Path]) -> set[Path]:
    """Those of ``paths`` that a running process (a detached server's stdout) has open."""
    if not paths:
        return set()
    import psutil  # only when there are logs to rotate: not on every run's start

    found: set[Path] = set()
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            found |= {Path(f.path) for f in process.open_files()} & paths
    return found


def leftovers(store: ArtifactStore) -> list[Path]:
    """Builds of processes that are gone (``store/.tmp``), removals a kill interrupted, and download
    remnants not being written; never anything reached through a link (``.tmp`` or ``downloads`` itself
    a link is skipped: pruning must not reach out of the home)."""
    import psutil

    found = []
    if store.tmp_root.is_dir() and not store.tmp_root.is_symlink():
        for tmp in store.tmp_root.iterdir():
            match = re.match(r"^\w+-[0-9a-f]+-(\d+)-", tmp.name)
            if match is None or not psutil.pid_exists(int(match.group(1))):
                found.append(tmp)
    for stage_dir in _stage_dirs(store):
        found += [p for p in stage_dir.glob(".*.rm-*") if _REMOVAL_TRASH.fullmatch(p.name)]
    downloads = store.home / "downloads"
    if downloads.is_dir() and not downloads.is_symlink():
        for root, _dirs, files in os.walk(downloads):  # does not descend into linked directories
            for name in files:
                part = Path(root) / name
                with contextlib.suppress(OSError):
                    info = part.lstat()
                    if (
                        stat.S_ISREG(info.st_mode)
                        and part.suffix != ".lock"
                        and time.time() - info.st_mtime > 7 * 86400
                    ):
                        found.append(part)
    return found


def remove_path(path: Path) -> int:
    """Remove a leftover (a link is unlinked, never followed); return the bytes freed."""
    if path.is_symlink() or not path.is_dir():
        with contextlib.suppress(FileNotFoundError):
            size = path.lstat().st_size
            path.unlink()
            return size
        return 0
    size = tree_size(path)
    remove_tree(path)
    return size


__all__ = [
    "LOGS_KEPT",
    "ArtifactInUse",
    "StoreEntry",
    "closure",
    "dependents",
    "find",
    "inventory",
    "leftovers",
    "parse_age",
    "parse_size",
    "prune_selection",
    "remove_entry",
    "remove_path",
    "rotate_logs",
    "running_repositories",
]
