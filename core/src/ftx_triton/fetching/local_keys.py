"""Keys of a local checkpoint directory: the quick fingerprint ``ftx lock`` records, and the content key the
store keys it by (every byte the converter can read, through links), remembered so that it is computed once.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ftx_triton.errors import SourceError
from ftx_triton.io.atomic_file import write_json_atomic
from ftx_triton.io.source_tree import TreeFile, tree_files

RACY_NS = 2_000_000_000
"""A file changed this close to the moment it is read may change again within the same timestamp (file
systems keep times in ticks, FAT in 2 s): its digest is used for the run but not remembered."""

_MEMO_VERSION = "tree-identity-v3"
"""Part of every memo's name: v3 memos hold keys of :data:`_KEY_VERSION` (v2's held keys of whole-file sha256s)."""
_KEY_VERSION = b"local-content-key-v2"
"""Domain of the content key: v2 hashes each file's chunked digest (v1, before it, each file's plain sha256), so a
store entry keyed by a v1 key is never found by a v2 one, whatever bytes either covered."""
_now_ns = time.time_ns


@dataclass(frozen=True)
class LocalKey:
    """A local source's content key, and the identity of its files when they were hashed."""

    key: str
    identity: str


def _digest_name(file: TreeFile) -> bytes:
    return os.fsencode(file.rel.as_posix())


def local_fingerprint(root: Path) -> str:
    """A quick content fingerprint: relative names, sizes and mtime_ns of every file, links followed (VCS
    folders skipped)."""
    digest = hashlib.sha256()
    for file in tree_files(root):
        digest.update(_digest_name(file) + f"\0{file.st.st_size}\0{file.st.st_mtime_ns}\n".encode())
    return f"local-{digest.hexdigest()[:40]}"


def tree_identity(files: list[TreeFile]) -> str:
    """What identifies the bytes of ``files`` without reading them: names, devices, inodes, sizes, mtimes
    and ctimes (a write in place moves ctime even when mtime is set back; a replaced file has a new inode)."""
    digest = hashlib.sha256(_MEMO_VERSION.encode() + b"\n")
    for file in files:
        digest.update(_digest_name(file) + f"\0{file.identity.token()}\n".encode())
    return digest.hexdigest()


def source_identity(root: Path) -> str:
    """:func:`tree_identity` of the files under ``root`` now."""
    return tree_identity(tree_files(root))


@dataclass(frozen=True)
class PendingKey:
    """A local source whose digest is not remembered: its files, and their identity when they were listed."""

    root: Path
    files: list[TreeFile]
    identity: str
    memo: Path

    @property
    def keyed_before(self) -> bool:
        """Whether a digest of this directory was computed before (its files' identity has moved since: touched,
        copied over, rewritten). Such a source is likely already converted, so a run hashes it first rather
        than converting it while it is hashed."""
        return _path_record(self.memo.parent, self.root).is_file()

    def check_readable(self) -> None:
        """Refuse a file that would never finish hashing (a named pipe blocks, a device never ends) by name."""
        from ftx_triton.io.regular import open_regular

        for file in self.files:
            try:
                open_regular(file.path).close()
            except FileNotFoundError:  # removed (or a link retargeted at nothing) since it was listed
                raise changed_error(self.root, "while it was hashed") from None


def remembered_key(root: Path, home: Path) -> LocalKey | PendingKey:
    """The key of ``root`` if its digest is remembered for the identity its files have now (no byte read),
    else what :func:`settle` needs to compute it."""
    files = tree_files(root)
    identity = tree_identity(files)
    memo = Path(home) / "local-keys" / f"{identity[:40]}.json"
    try:
        remembered = json.loads(memo.read_text())
        if isinstance(remembered, dict) and isinstance(remembered.get("key"), str):
            return LocalKey(str(remembered["key"]), identity)
    except (OSError, ValueError):
        pass  # not remembered (or a damaged memo of ftx's own): hashed again
    return PendingKey(Path(root), files, identity, memo)


def settle(pending: PendingKey, stop: threading.Event | None = None) -> LocalKey:
    """Hash every file of ``pending`` and remember the key; a SourceError when a file changed meanwhile.

    The files' chunks are hashed on every usable CPU at once (:func:`~ftx_triton.io.hashing.chunked_digests`), the
    same key whatever the thread count; ``stop`` (a background digest beside a conversion): give up
    (``HashStopped``) once it is set."""
    from ftx_triton.io.hashing import chunked_digests

    pending.check_readable()
    started = _now_ns()
    try:
        digests = chunked_digests([(file.path, file.st.st_size) for file in pending.files], stop=stop)
    except OSError:  # checked readable a moment ago: removed, retargeted or swapped (a pipe) since it was listed
        raise changed_error(pending.root, "while it was hashed") from None
    if source_identity(pending.root) != pending.identity:
        raise changed_error(pending.root, "while it was hashed")
    key = _content_key(pending.files, digests, _KEY_VERSION + b"\n")
    pending.memo.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(_path_record(pending.memo.parent, pending.root), {"path": str(pending.root.resolve())})
    if all(max(f.st.st_mtime_ns, f.st.st_ctime_ns) < started - RACY_NS for f in pending.files):
        write_json_atomic(pending.memo, {"key": key, "path": str(pending.root.resolve())})
    return LocalKey(key, pending.identity)


def _content_key(files: list[TreeFile], digests: Mapping[Path, str], domain: bytes = b"") -> str:
    """``content-…`` over ``domain`` and every file's relative name and digest, in the listing's order."""
    digest = hashlib.sha256(domain)
    for file in files:
        digest.update(_digest_name(file) + f"\0{digests[file.path]}\n".encode())
    return f"content-{digest.hexdigest()[:40]}"


def _path_record(folder: Path, root: Path) -> Path:
    """The file that says the directory ``root`` was hashed before (whatever its files hold now)."""
    return folder / f"path-{hashlib.sha256(os.fsencode(Path(root).resolve())).hexdigest()[:40]}.json"


class BackgroundKey:
    """:func:`settle` in a thread of its own, so that a conversion reads the source while it is hashed (hashlib
    releases the GIL): the run keys and publishes what it converted once :meth:`result` is known."""

    def __init__(self, pending: PendingKey, on_key: Callable[[LocalKey], None] | None = None) -> None:
        """Start hashing; ``on_key(key)`` is called in the hashing thread as soon as the key is known."""
        self.pending = pending
        self._on_key = on_key
        self._stop = threading.Event()
        self._key: LocalKey | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="ftx-source-key", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._key = settle(self.pending, self._stop)
        except BaseException as exc:  # handed to result()
            self._error = exc
            return
        if self._on_key is not None:
            self._on_key(self._key)

    def result(self) -> LocalKey:
        """The key, once every file is hashed (a SourceError when one changed meanwhile)."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._key is not None
        return self._key

    def cancel(self) -> None:
        """Stop hashing (the run failed); the thread ends at its next chunk."""
        self._stop.set()


def local_content_key(root: Path, home: Path) -> LocalKey:
    """The key of a local checkpoint directory by what it holds: every file's relative name and chunked sha256
    (``content-…``; :func:`~ftx_triton.io.hashing.chunked_digests`), links to files and folders followed, wherever
    the directory lies, so a copy keys as the original.

    Hashing a multi-GB checkpoint on every run would cost minutes: the digest is remembered in
    ``<home>/local-keys`` under the identity of every file (device, inode, size, mtime, ctime) and computed
    again when any of it changes. Files that change while they are hashed are refused.
    """
    found = remembered_key(root, home)
    return found if isinstance(found, LocalKey) else settle(found)


def whole_file_key(root: Path) -> str:
    """The content key ftx gave a local directory before chunked digests (every file's relative name and plain
    sha256, links followed): the adapter revision an earlier ``ftx lock`` recorded, recomputed (not remembered)
    so that such a lock still tells an unchanged adapter from a changed one."""
    from ftx_triton.io.hashing import sha256_files

    files = tree_files(root)
    return _content_key(files, sha256_files(file.path for file in files))


def changed_error(root: Path, when: str) -> SourceError:
    """The error for a local source whose files changed under a run."""
    return SourceError(
        f"the local source {root} changed {when} (a file was written, replaced, added or removed)",
        hint="run again once nothing writes into the checkpoint; nothing built from the changing files was kept",
    )
