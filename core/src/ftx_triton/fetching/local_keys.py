"""Keys of a local checkpoint directory: the quick fingerprint ``ftx lock`` records, and the content key the
store keys it by (every byte the converter can read, through links to files and to folders).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ftx_triton.io.source_tree import TreeFile, tree_files


def _digest_name(file: TreeFile) -> bytes:
    return os.fsencode(file.rel.as_posix())


def local_fingerprint(root: Path) -> str:
    """A quick content fingerprint: relative names, sizes and mtime_ns of every file, links followed (VCS
    folders skipped)."""
    digest = hashlib.sha256()
    for file in tree_files(root):
        digest.update(_digest_name(file) + f"\0{file.st.st_size}\0{file.st.st_mtime_ns}\n".encode())
    return f"local-{digest.hexdigest()[:40]}"


def local_content_key(root: Path, home: Path) -> str:
    """The key of a local checkpoint directory by what it holds: every file's relative name and sha256
    (``content-…``), links to files and folders followed, wherever the directory lies, so a copy keys as the
    original.

    Hashing a multi-GB checkpoint on every run would cost minutes: the digest is remembered in
    ``<home>/local-keys`` under the directory's absolute path and quick fingerprint (names, sizes, mtimes), and
    computed again only when one of them changes.
    """
    from ftx_triton.io.hashing import sha256_files
    from ftx_triton.io.regular import open_regular

    quick = local_fingerprint(root)
    memo = (
        Path(home) / "local-keys" / (hashlib.sha256(f"{root.resolve()}\0{quick}".encode()).hexdigest()[:32] + ".json")
    )
    try:
        remembered = json.loads(memo.read_text())
        if isinstance(remembered, dict) and isinstance(remembered.get("key"), str):
            return str(remembered["key"])
    except (OSError, ValueError):
        pass  # not remembered (or a damaged memo of ftx's own): hashed again
    files = tree_files(root)
    for file in files:  # a named pipe would block the hash, a device never end it: refuse them by name
        open_regular(file.path).close()
    digests = sha256_files([file.path for file in files])
    digest = hashlib.sha256()
    for file in files:
        digest.update(_digest_name(file) + f"\0{digests[file.path]}\n".encode())
    key = f"content-{digest.hexdigest()[:40]}"
    memo.parent.mkdir(parents=True, exist_ok=True)
    tmp = memo.with_name(f".{memo.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"key": key, "path": str(root.resolve())}))
    os.replace(tmp, memo)
    return key
