"""Keys of a local checkpoint directory: the quick fingerprint ``ftx lock`` records, and the content key the
store keys it by (every byte the converter can read, through links), remembered so that it is computed once.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from ftx_triton.errors import SourceError
from ftx_triton.io.source_tree import TreeFile, tree_files

RACY_NS = 2_000_000_000
"""A file changed this close to the moment it is read may change again within the same timestamp (file
systems keep times in ticks, FAT in 2 s): its digest is used for the run but not remembered."""

_MEMO_VERSION = "tree-identity-v2"
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
        digest.update(_digest_name(file) + f"\0{file.identity}\n".encode())
    return digest.hexdigest()


def source_identity(root: Path) -> str:
    """:func:`tree_identity` of the files under ``root`` now."""
    return tree_identity(tree_files(root))


def local_content_key(root: Path, home: Path) -> LocalKey:
    """The key of a local checkpoint directory by what it holds: every file's relative name and sha256
    (``content-…``), links to files and folders followed, wherever the directory lies, so a copy keys as the
    original.

    Hashing a multi-GB checkpoint on every run would cost minutes: the digest is remembered in
    ``<home>/local-keys`` under the identity of every file (device, inode, size, mtime, ctime) and computed
    again when any of it changes. Files that change while they are hashed are refused.
    """
    from ftx_triton.io.hashing import sha256_files
    from ftx_triton.io.regular import open_regular

    files = tree_files(root)
    identity = tree_identity(files)
    memo = Path(home) / "local-keys" / f"{identity[:40]}.json"
    try:
        remembered = json.loads(memo.read_text())
        if isinstance(remembered, dict) and isinstance(remembered.get("key"), str):
            return LocalKey(str(remembered["key"]), identity)
    except (OSError, ValueError):
        pass  # not remembered (or a damaged memo of ftx's own): hashed again
    for file in files:  # a named pipe would block the hash, a device never end it: refuse them by name
        open_regular(file.path).close()
    started = _now_ns()
    digests = sha256_files([file.path for file in files])
    if source_identity(root) != identity:
        raise changed_error(root, "while it was hashed")
    digest = hashlib.sha256()
    for file in files:
        digest.update(_digest_name(file) + f"\0{digests[file.path]}\n".encode())
    key = f"content-{digest.hexdigest()[:40]}"
    if all(max(f.st.st_mtime_ns, f.st.st_ctime_ns) < started - RACY_NS for f in files):
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_name(f".{memo.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"key": key, "path": str(Path(root).resolve())}))
        os.replace(tmp, memo)
    return LocalKey(key, identity)


def changed_error(root: Path, when: str) -> SourceError:
    """The error for a local source whose files changed under a run."""
    return SourceError(
        f"the local source {root} changed {when} (a file was written, replaced, added or removed)",
        hint="run again once nothing writes into the checkpoint; nothing built from the changing files was kept",
    )
