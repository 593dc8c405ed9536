"""The artifact store: keyed stage outputs, built in a temp dir and published atomically.

Layout under ``FTX_HOME``::

    store/<stage>/<key>/             a published artifact (holds ftx-artifact.json)
    store/.tmp/<stage>-<key>-<pid>-… a build in progress (never trusted)
    locks/<stage>-<key>.lock         one builder per key
    locks/<stage>-<key>.use          shared by every process using the artifact (see ftx_triton.store.leases)

An artifact counts as done only when its final directory exists; that directory appears by one
``os.replace`` after every file was written and hashed, so a killed run leaves nothing trusted.
A ``--force`` rebuild swaps the old artifact out with :func:`ftx_triton.io.atomic.swap_in`; a kill between
its two renames is undone (the old artifact put back) by the next build of that key.

Every output is recorded with its digest and its ``lstat`` signature (its
:class:`~ftx_triton.io.identity.FileIdentity`: size, mtime_ns, ctime_ns, inode, device). The digest is the chunked
sha256 of :func:`~ftx_triton.io.hashing.chunked_digests` (``chunked_sha256``, schema ``ftx.artifact/2``): a converter's
writer threads make it from the chunks they write, and a re-hash spreads one file's chunks over every CPU. A record of
``ftx.artifact/1`` holds a plain ``sha256`` instead and is verified by that definition (the field names which), so an
artifact published by an earlier ftx stays usable; neither digest is ever compared with the other. A lookup trusts
an artifact only when the files on disk are exactly the recorded ones and each is unchanged: a file whose
signature still matches is not re-read (no write can keep its ctime), any other (a record without a whole
signature, as an older or damaged one, included) is re-hashed, and a match refreshes the recorded signature.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import re
import stat
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from ftx_triton.io.atomic import holders, recover, swap_in
from ftx_triton.io.atomic_file import write_json_atomic
from ftx_triton.io.hashing import chunked_digests, sha256_files, written_digest
from ftx_triton.io.identity import FileIdentity
from ftx_triton.io.trees import remove_tree
from ftx_triton.paths import unusable_home
from ftx_triton.store import leases
from ftx_triton.terminal.redact import redact_data

if TYPE_CHECKING:
    import filelock

log = structlog.get_logger(__name__)

PUBLISH_IMPORTS = ("filelock",)
"""What publishing a build imports that a cached lookup does not (its lock's library: 0.1 s on some hosts), for
a thread with time to spare before the publish to import ahead."""
PROVENANCE_FILE = "ftx-artifact.json"
SCHEMA = "ftx.artifact/2"
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
CHUNKED = "chunked_sha256"
"""The record's digest field: :func:`~ftx_triton.io.hashing.chunked_digests` of the file."""
PLAIN = "sha256"
"""The digest field of records written before ``ftx.artifact/2``: the plain sha256 of the file."""
UNKEYED = "0" * 24
"""The key in the name of a build in progress whose key is known only once it is built."""

__all__ = ["PROVENANCE_FILE", "SCHEMA", "Artifact", "ArtifactStore", "make_key", "read_provenance"]


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


def read_provenance(path: Path) -> dict[str, Any] | None:
    """The provenance record in ``path``, or None when it is missing or damaged (ftx's own file: a damaged
    one is rebuilt by the next lookup, not validated)."""
    try:
        if (path / PROVENANCE_FILE).is_symlink():  # ftx writes a file: a link is someone else's doing
            raise ValueError("it is a symbolic link")
        meta = json.loads((path / PROVENANCE_FILE).read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as exc:  # not JSON, not UTF-8, too deep …
        log.warning("cache.provenance_unreadable", path=str(path), error=f"{type(exc).__name__}: {exc}"[:200])
        return None
    if not isinstance(meta, dict):
        log.warning("cache.provenance_unreadable", path=str(path), error=f"a JSON {type(meta).__name__}, not an object")
        return None
    return meta


# --- output records ---------------------------------------------------------------------------


def _scan(root: Path) -> dict[str, os.stat_result]:
    """Every non-directory under ``root`` (lstat: symlinks are not followed), provenance excluded."""
    found: dict[str, os.stat_result] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*filenames, *dirnames]:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode):
                continue
            rel = Path(path).relative_to(root).as_posix()
            if rel != PROVENANCE_FILE:
                found[rel] = st
    return found


def _drop_bytecode(root: Path, outputs: object) -> None:
    """Remove the ``__pycache__`` folders that serving leaves beside an artifact's Python models.

    Triton's Python-backend stub imports ``model.py`` from the artifact through an embedded interpreter that
    writes bytecode whatever the environment says; left in place, that bytecode would make the artifact
    differ from its record (and a planted ``.pyc`` could run instead of the verified source), so every
    lookup drops what the record does not name before verifying the rest.
    """
    recorded = set(outputs) if isinstance(outputs, dict) else set()
    for dirpath, dirnames, _ in os.walk(root):
        for name in dirnames:
            cache = Path(dirpath, name)
            if (
                name == "__pycache__"
                and not cache.is_symlink()
                and not any(rel.startswith(cache.relative_to(root).as_posix() + "/") for rel in recorded)
            ):
                remove_tree(cache)
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]


def _record_outputs(root: Path) -> dict[str, dict[str, Any]]:
    """The output records of a finished build: chunked digest and signature per file, target per symlink. A file
    whose writer hashed it as it wrote it, and that is unchanged since, is not read again."""
    found = _scan(root)
    outputs: dict[str, dict[str, Any]] = {}
    files = []
    digests: dict[Path, str] = {}
    for rel, st in found.items():
        if stat.S_ISLNK(st.st_mode):
            outputs[rel] = {"symlink": os.readlink(root / rel)}
        elif stat.S_ISREG(st.st_mode):
            files.append(rel)
            if known := written_digest(root / rel, st):
                digests[root / rel] = known
        else:
            raise OSError(f"{root / rel} is neither a file nor a symlink; an artifact cannot hold it")
    digests.update(chunked_digests([(root / rel, found[rel].st_size) for rel in files if root / rel not in digests]))
    for rel in files:
        outputs[rel] = {CHUNKED: digests[root / rel], **FileIdentity.of(found[rel]).as_record()}
    return dict(sorted(outputs.items()))


def _digest_field(info: dict[str, Any]) -> str | None:
    """Which digest a file's record holds (:data:`CHUNKED`, or :data:`PLAIN` in an older record); None when it
    holds neither, or both (no record of ftx's has both: such a record is not ftx's)."""
    fields = [field for field in (CHUNKED, PLAIN) if field in info]
    if len(fields) != 1 or not isinstance(info[fields[0]], str) or not _SHA256_RE.match(info[fields[0]]):
        return None
    return fields[0]


def _valid_record(info: object) -> bool:
    if not isinstance(info, dict):
        return False
    if "symlink" in info:
        return isinstance(info["symlink"], str)
    return isinstance(info.get("size"), int) and _digest_field(info) is not None


def _digests(root: Path, records: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Each file's digest now, by the definition its record names (chunked, or plain for an older record)."""
    plain = [rel for rel, info in records.items() if _digest_field(info) == PLAIN]
    chunked = [rel for rel in records if rel not in plain]
    found = chunked_digests([(root / rel, records[rel]["size"]) for rel in chunked])
    found.update(sha256_files(root / rel for rel in plain))
    return {rel: found[root / rel] for rel in records}


def _verify(root: Path, outputs: object) -> tuple[str | None, dict[str, dict[str, int]]]:
    """(why the artifact cannot be trusted or None, fresh signatures of files re-hashed and found intact)."""
    if not isinstance(outputs, dict):
        return "its provenance records no outputs", {}
    if bad := next((rel for rel, info in outputs.items() if not _valid_record(info)), None):
        return f"the record of {bad} has no size and digest", {}
    found = _scan(root)
    if extra := sorted(set(found) - set(outputs)):
        return f"{extra[0]} is not one of its recorded outputs", {}
    if missing := sorted(set(outputs) - set(found)):
        return f"{missing[0]} is missing", {}
    rehash = []
    for rel, info in outputs.items():
        st = found[rel]
        if "symlink" in info:
            if not stat.S_ISLNK(st.st_mode) or os.readlink(root / rel) != info["symlink"]:
                return f"the symlink {rel} changed", {}
        elif not stat.S_ISREG(st.st_mode) or st.st_size != info["size"]:
            return f"{rel} changed size or type", {}
        elif FileIdentity.of(st) != FileIdentity.from_record(info):  # None (an older or damaged record): re-read
            rehash.append(rel)
    digests = _digests(root, {rel: outputs[rel] for rel in rehash})
    for rel in rehash:
        if digests[rel] != outputs[rel][_digest_field(outputs[rel])]:
            return f"the content of {rel} changed", {}
    return None, {rel: FileIdentity.of(found[rel]).as_record() for rel in rehash}


# --- the store ------------------------------------------------------------------------------


class ArtifactStore:
    """Keyed, locked, atomically published, content-verified stage outputs."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.root = home / "store"
        self.tmp_root = self.root / ".tmp"
        self.lock_root = home / "locks"
        self._locks: dict[str, filelock.FileLock] = {}
        self._leased: list[Path] = []  # what this store's user holds; given back when the store goes
        weakref.finalize(self, leases.release_all, self._leased)
        try:
            for d in (self.root, self.tmp_root, self.lock_root):
                d.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise unusable_home(home, exc) from exc

    def path(self, stage: str, key: str) -> Path:
        return self.root / stage / key

    def lookup(self, stage: str, key: str) -> Artifact | None:
        """The published artifact for (stage, key) if its provenance is readable and its files intact."""
        path = self.path(stage, key)
        self._hold(stage, key)  # before reading: a removal running now finishes first
        meta = read_provenance(path)
        if meta is None:
            return None
        if meta.get("stage") != stage or meta.get("key") != key:
            problem: str | None = "its provenance names another stage or key"
            fresh: dict[str, dict[str, int]] = {}
        else:
            _drop_bytecode(path, meta.get("outputs"))
            problem, fresh = _verify(path, meta.get("outputs"))
        if problem:
            log.warning("cache.corrupt", stage=stage, key=key, path=str(path), problem=problem)
            return None
        if fresh:
            log.info("cache.rehashed", stage=stage, key=key, files=len(fresh))
            self._refresh_signatures(stage, key, meta, fresh)
        return Artifact(stage, key, path, meta)

    def _hold(self, stage: str, key: str) -> None:
        path = self.lease(stage, key)
        if path not in self._leased and leases.hold(path):
            self._leased.append(path)

    def close(self) -> None:
        """Give back the leases this store holds (also done when it is collected)."""
        leases.release_all(self._leased)
        self._leased.clear()

    def lock_path(self, stage: str, key: str) -> Path:
        """The file whose lock lets one process at a time build (or remove) (stage, key)."""
        return self.lock_root / f"{stage}-{key}.lock"

    def lease(self, stage: str, key: str) -> Path:
        """The lease file whose shared lock marks (stage, key) as used by a running ftx process."""
        return leases.lease_path(self.lock_root, stage, key)

    def mark_used(self, artifact: Artifact) -> None:
        """Record a use (a cache hit): the provenance file's mtime is the artifact's "last used"."""
        with contextlib.suppress(OSError):
            os.utime(artifact.path / PROVENANCE_FILE, follow_symlinks=False)

    @contextlib.contextmanager
    def lock(self, stage: str, key: str, timeout_s: float = -1) -> Iterator[None]:
        """One builder per (stage, key), re-entrant within this store object; a process that has to wait says
        so first."""
        import filelock  # here: a cached lookup takes no lock

        from ftx_triton.io.atomic import announced

        lock = self._locks.setdefault(key + stage, filelock.FileLock(str(self.lock_path(stage, key))))
        with announced(lock, f"building {stage} {key}", timeout_s):
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
        accept: Callable[[Artifact], object] | None = None,
    ) -> tuple[Artifact, bool]:
        """Return (artifact, cached). ``builder(tmp_dir)`` writes the files and returns extra provenance.

        ``accept(artifact)`` may refuse a cached artifact's provenance by raising (TypeError, ValueError,
        KeyError, AttributeError): it is then rebuilt like a corrupt one.
        """
        self._hold(stage, key)
        if not force and (hit := self._usable(stage, key, accept)):
            return hit, True
        with self.lock(stage, key):
            self._recover(stage, key)
            if not force and (hit := self._usable(stage, key, accept)):  # built by another process meanwhile
                return hit, True
            tmp = self.tmp_root / f"{stage}-{key}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            tmp.mkdir(parents=True)
            started = time.time()
            try:
                extra = dict(builder(tmp))
                return self._publish(stage, key, tmp, inputs, producer, extra, started), False
            except BaseException:
                remove_tree(tmp)
                raise

    def build_keyed_after(
        self,
        stage: str,
        builder: Callable[[Path], Mapping[str, Any]],
        keyed: Callable[[], tuple[str, Mapping[str, Any]]],
        *,
        producer: Callable[[], Mapping[str, Any]],
        force: bool = False,
        accept: Callable[[Artifact], object] | None = None,
    ) -> tuple[Artifact, bool]:
        """:meth:`build` for an artifact whose key is known only once it is built: ``builder(tmp_dir)`` runs first,
        then ``keyed()`` gives (key, inputs), and the build is published under that key; when the key turns out
        to be in the store already, the fresh build is dropped and the stored one returned (cached).
        ``producer()`` is asked once the build is done, as the key is: nothing of it delays the build."""
        self._remove_dead_unkeyed(stage)  # before writing: a killed run's multi-GB leftovers free their disk first
        # named like a keyed build with this pid: `ftx prune` leaves it alone while this process lives
        tmp = self.tmp_root / f"{stage}-{UNKEYED}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir(parents=True)
        started = time.time()
        try:
            extra = dict(builder(tmp))
            key, inputs = keyed()
            self._hold(stage, key)
            with self.lock(stage, key):
                self._recover(stage, key)
                if not force and (hit := self._usable(stage, key, accept)):
                    remove_tree(tmp)
                    return hit, True
                return self._publish(stage, key, tmp, inputs, producer(), extra, started), False
        except BaseException:
            remove_tree(tmp)
            raise

    def _remove_dead_unkeyed(self, stage: str) -> None:
        """Remove what killed processes left of their unkeyed builds of ``stage`` (a keyed build's leftovers go
        when its key is built again; these have no key to be found by)."""
        for stale in self.tmp_root.glob(f"{stage}-{UNKEYED}-*"):
            match = re.match(rf"^{re.escape(stage)}-{UNKEYED}-(\d+)-", stale.name)
            if match is not None and not _process_alive(int(match[1])):
                log.info("cache.stale_removed", stage=stage, path=str(stale))
                remove_tree(stale)

    def _publish(
        self,
        stage: str,
        key: str,
        tmp: Path,
        inputs: Mapping[str, Any],
        producer: Mapping[str, Any],
        extra: Mapping[str, Any],
        started: float,
    ) -> Artifact:
        """Record ``tmp``'s outputs and publish it as (stage, key); the caller holds the key's lock."""
        outputs = _record_outputs(tmp)  # hashing the outputs is part of the build's time
        now = time.time()
        meta = redact_data(
            {
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
        )
        (tmp / PROVENANCE_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True, default=str))
        final = self.path(stage, key)
        final.parent.mkdir(parents=True, exist_ok=True)
        swap_in(tmp, final, replace=True)  # a corrupt or --force'd artifact is swapped out
        return Artifact(stage, key, final, meta)

    def _usable(self, stage: str, key: str, accept: Callable[[Artifact], object] | None) -> Artifact | None:
        hit = self.lookup(stage, key)
        if hit is None or accept is None:
            return hit
        try:
            accept(hit)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            log.warning(
                "cache.corrupt",
                stage=stage,
                key=key,
                path=str(hit.path),
                problem=f"its provenance cannot be used ({type(exc).__name__}: {exc})"[:300],
            )
            return None
        return hit

    def linked(self, stage: str, key: str) -> None:
        """Record the signatures of files ftx just hard-linked elsewhere (``ftx convert -o``): a link moves only
        their ctime, which would make the next lookup read them all again. Files whose size, inode or mtime
        moved too are left as recorded (the next lookup re-hashes them)."""
        path = self.path(stage, key)
        meta = read_provenance(path)
        outputs = meta.get("outputs") if meta else None
        if meta is None or not isinstance(outputs, dict):
            return
        found = _scan(path)
        fresh = {}
        for rel, info in outputs.items():
            st = found.get(rel)
            if st is None or not _valid_record(info) or "symlink" in info:
                continue
            now, recorded = FileIdentity.of(st), FileIdentity.from_record(info)
            if recorded is not None and now._replace(ctime_ns=recorded.ctime_ns) == recorded:  # only ctime moved
                fresh[rel] = now.as_record()
        if fresh:
            self._refresh_signatures(stage, key, meta, fresh)

    def _refresh_signatures(self, stage: str, key: str, meta: dict[str, Any], fresh: dict[str, dict[str, int]]) -> None:
        """Record the signatures of re-hashed, intact files, so the next lookup need not re-read them.

        Best effort: skipped when another process holds the key or the store is read-only.
        """
        import filelock  # here: for its Timeout; a cached lookup that re-hashed nothing takes no lock

        path = self.path(stage, key)
        tmp = self.tmp_root / f"{stage}-{key}-provenance-{uuid.uuid4().hex[:8]}"
        try:
            with self.lock(stage, key, timeout_s=0):
                if read_provenance(path) != meta:
                    return
                updated = {
                    **meta,
                    "outputs": {rel: {**info, **fresh.get(rel, {})} for rel, info in meta["outputs"].items()},
                }
                # the temp file is written in store/.tmp, not beside the record: inside the artifact it would be
                # an output no record names (the artifact corrupt to a concurrent lookup); a kill leaves it where
                # the next build of the key (or `ftx prune`) removes it
                write_json_atomic(path / PROVENANCE_FILE, updated, indent=2, sort_keys=True, default=str, tmp=tmp)
        except (filelock.Timeout, OSError) as exc:
            log.debug("cache.signatures_not_refreshed", stage=stage, key=key, error=str(exc))

    def _recover(self, stage: str, key: str) -> None:
        """Undo what killed processes left for this key (we hold the key's lock)."""
        final = self.path(stage, key)
        if not final.exists() and holders(final, "old"):
            log.warning(
                "cache.restored",
                stage=stage,
                key=key,
                path=str(final),
                reason="a replacement of it was killed half-way",
            )
        recover(final)
        self._remove_dead_unkeyed(stage)
        for stale in [*self.tmp_root.glob(f"{stage}-{key}-*"), *self.tmp_root.glob(f"old-{key}-*")]:
            log.info("cache.stale_removed", stage=stage, key=key, path=str(stale))
            if stale.is_dir():
                remove_tree(stale)
            else:
                stale.unlink(missing_ok=True)


def _process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).isoformat(timespec="seconds")
