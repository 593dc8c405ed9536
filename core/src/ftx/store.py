"""The artifact store: keyed stage outputs, built in a temp dir and published atomically.

Layout under ``FTX_HOME``::

    store/<stage>/<key>/             a published artifact (holds ftx-artifact.json)
    store/.tmp/<stage>-<key>-<pid>-… a build in progress (never trusted)
    locks/<stage>-<key>.lock         one builder per key

An artifact counts as done only when its final directory exists; that directory appears by one
``os.replace`` after every file was written and hashed, so a killed run leaves nothing trusted.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import filelock
import structlog

log = structlog.get_logger(__name__)

PROVENANCE_FILE = "ftx-artifact.json"
SCHEMA = "ftx.artifact/1"


def make_key(inputs: Mapping[str, Any]) -> str:
    """A stable key from everything that determines an output."""
    text = json.dumps(inputs, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


@dataclass(frozen=True)
class Artifact:
    """A published stage output."""

    stage: str
    key: str
    path: Path
    provenance: Mapping[str, Any]


def sha256_file(path: Path, chunk: int = 8 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _list_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != PROVENANCE_FILE)


class ArtifactStore:
    """Keyed, locked, atomically published stage outputs."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.root = home / "store"
        self.tmp_root = self.root / ".tmp"
        self.lock_root = home / "locks"
        for d in (self.root, self.tmp_root, self.lock_root):
            d.mkdir(parents=True, exist_ok=True)

    def path(self, stage: str, key: str) -> Path:
        return self.root / stage / key

    def lookup(self, stage: str, key: str) -> Artifact | None:
        """The published artifact for (stage, key) if it exists and its files are intact."""
        path = self.path(stage, key)
        meta_path = path / PROVENANCE_FILE
        if not meta_path.is_file():
            return None
        meta = json.loads(meta_path.read_text())
        for rel, info in meta.get("outputs", {}).items():
            target = path / rel
            if not target.is_file() or target.stat().st_size != info["size"]:
                log.warning("cache.corrupt", stage=stage, key=key, file=rel)
                return None
        return Artifact(stage, key, path, meta)

    def mark_used(self, artifact: Artifact) -> None:
        """Record a use (a cache hit): the provenance file's mtime is the artifact's "last used"."""
        with contextlib.suppress(OSError):
            os.utime(artifact.path / PROVENANCE_FILE)

    @contextlib.contextmanager
    def lock(self, stage: str, key: str, timeout_s: float = -1) -> Iterator[None]:
        """One builder per (stage, key); a process that has to wait says so first."""
        from ftx.atomic import announced

        with announced(filelock.FileLock(str(self.lock_root / f"{stage}-{key}.lock")), f"building {stage} {key}",
                       timeout_s):
            yield

    def build(
        self,
        stage: str,
        key: str,
        builder: Callable[[Path], Mapping[str, Any]],
        *,
        inputs: Mapping[str, Any],
        producer: Mapping[str, Any],
        force: bool = False,
        hash_outputs: bool = True,
    ) -> tuple[Artifact, bool]:
        """Return (artifact, cached). ``builder(tmp_dir)`` writes the files and returns extra provenance."""
        if not force and (hit := self.lookup(stage, key)):
            return hit, True
        with self.lock(stage, key):
            if not force and (hit := self.lookup(stage, key)):  # built by another process meanwhile
                return hit, True
            self._remove_stale(stage, key)
            tmp = self.tmp_root / f"{stage}-{key}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            tmp.mkdir(parents=True)
            started = time.time()
            try:
                extra = dict(builder(tmp))
                meta = self._provenance(stage, key, tmp, inputs, producer, extra, started, hash_outputs)
                (tmp / PROVENANCE_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True, default=str))
                self._publish(tmp, self.path(stage, key))
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            return Artifact(stage, key, self.path(stage, key), meta), False

    def _provenance(self, stage: str, key: str, tmp: Path, inputs: Mapping[str, Any], producer: Mapping[str, Any],
                    extra: Mapping[str, Any], started: float, hash_outputs: bool) -> dict[str, Any]:
        outputs = {}
        for file in _list_files(tmp):
            info: dict[str, Any] = {"size": file.stat().st_size}
            if hash_outputs:
                info["sha256"] = sha256_file(file)
            outputs[file.relative_to(tmp).as_posix()] = info
        now = time.time()
        return {
            "schema": SCHEMA,
            "stage": stage,
            "key": key,
            "inputs": dict(inputs),
            "producer": dict(producer),
            "outputs": outputs,
            "started_at": _iso(started),
            "finished_at": _iso(now),
            "duration_s": round(now - started, 3),
            **extra,
        }

    def _publish(self, tmp: Path, final: Path) -> None:
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.exists():  # --force: move the old one aside first, then drop it
            trash = self.tmp_root / f"old-{final.name}-{uuid.uuid4().hex[:8]}"
            os.replace(final, trash)
            os.replace(tmp, final)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, final)

    def _remove_stale(self, stage: str, key: str) -> None:
        """Builds of this key left by killed processes (we hold the key's lock)."""
        for stale in self.tmp_root.glob(f"{stage}-{key}-*"):
            log.info("cache.stale_removed", stage=stage, key=key, path=str(stale))
            shutil.rmtree(stale, ignore_errors=True)


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).isoformat(timespec="seconds")
