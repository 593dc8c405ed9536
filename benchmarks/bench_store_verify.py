#!/usr/bin/env python3
"""What content verification costs the artifact store, on a synthetic ~1 GB converted checkpoint.

The artifact is shaped like a GPT-J FT checkpoint scaled down: two embedding-sized files (wte,
lm_head) and per-layer files (qkv, attention out, fc_in, fc_out, layer norms). Prints JSON lines:

- ``publish``: ``ArtifactStore.build`` minus writing the same files (= hashing every output + provenance),
  with the hashing alone done sequentially and in parallel for comparison; ``publish_runs`` lists every
  timed write and build (on a small machine the page cache's writeback makes plain writes of 1 GB vary
  several-fold, so read the hashing figures as the cost);
- ``lookup_fast``: a lookup whose files are unchanged (one lstat per file, no reads);
- ``lookup_rehash_warm`` / ``lookup_rehash_cold``: a lookup after every file's mtime moved (all re-hashed),
  from the page cache and after asking the kernel to drop the files' pages (posix_fadvise DONTNEED;
  ``cold_evicted`` says whether a plain read afterwards was slower, i.e. whether the drop worked);
- ``lookup_size_only``: what the old size-only check cost, for reference.

    python benchmarks/bench_store_verify.py --gb 1 --work /tmp/ftx-bench-store
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from pathlib import Path

import numpy as np
from ftx_triton.io.hashing import sha256_file, sha256_files
from ftx_triton.store.artifact_store import PROVENANCE_FILE, ArtifactStore


def layout(total: int, layers: int) -> dict[str, int]:
    """File name -> size: 20% each for wte/lm_head, the rest over the layers like GPT-J (3H², H², 4H², 4H²)."""
    sizes = {"1-gpu/model.wte.bin": total // 5, "1-gpu/model.lm_head.weight.bin": total // 5}
    per_layer = (total - 2 * (total // 5)) // layers
    parts = {
        "attention.query_key_value.weight.0.bin": 3,
        "attention.dense.weight.0.bin": 1,
        "mlp.dense_h_to_4h.weight.0.bin": 4,
        "mlp.dense_4h_to_h.weight.0.bin": 4,
    }
    for i in range(layers):
        for name, share in parts.items():
            sizes[f"1-gpu/model.layers.{i}.{name}"] = per_layer * share // 12
        sizes[f"1-gpu/model.layers.{i}.input_layernorm.weight.bin"] = 8192
    return sizes


def write_files(dest: Path, sizes: dict[str, int], block: bytes) -> None:
    for rel, size in sizes.items():
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as fh:
            left = size
            while left:
                n = min(left, len(block))
                fh.write(block[:n])
                left -= n


def drop_pages(root: Path) -> None:
    for path in root.rglob("*.bin"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_all(root: Path) -> float:
    t0 = time.perf_counter()
    for path in root.rglob("*.bin"):
        with path.open("rb", buffering=0) as fh:
            while fh.read(16 << 20):
                pass
    return time.perf_counter() - t0


def emit(what: str, **fields: object) -> None:
    print(json.dumps({"what": what, **fields}), flush=True)


def _built(tmp: Path, sizes: dict[str, int], block: bytes) -> dict[str, object]:
    """A store build's body: the files written, no metadata."""
    write_files(tmp, sizes, block)
    return {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path("/tmp/ftx-bench-store"))
    args = parser.parse_args()

    shutil.rmtree(args.work, ignore_errors=True)
    sizes = layout(int(args.gb * 1e9), args.layers)
    total = sum(sizes.values())
    block = np.random.default_rng(0).bytes(64 << 20)
    emit("artifact", files=len(sizes), bytes=total, cpus=os.cpu_count())

    # plain writes and store builds alternate which goes first, each into a page cache in the same state:
    # the previous output removed and everything synced (a write measured while another gigabyte was still
    # dirty ran 3-5x slower, which made the store look cheaper than a plain write)
    writes, builds = [], []
    store = ArtifactStore(args.work / "home")
    for i in range(args.repeat):
        for which in ("plain", "build") if i % 2 == 0 else ("build", "plain"):
            shutil.rmtree(args.work / "plain", ignore_errors=True)
            shutil.rmtree(args.work / "home", ignore_errors=True)
            os.sync()
            t0 = time.perf_counter()
            if which == "plain":
                write_files(args.work / "plain", sizes, block)
                writes.append(time.perf_counter() - t0)
            else:
                store = ArtifactStore(args.work / "home")
                store.build("convert", "k", lambda tmp: _built(tmp, sizes, block), inputs={}, producer={})
                builds.append(time.perf_counter() - t0)
    if not (args.work / "home").exists():  # the last one timed was the plain write
        store = ArtifactStore(args.work / "home")
        store.build("convert", "k", lambda tmp: _built(tmp, sizes, block), inputs={}, producer={})
    shutil.rmtree(args.work / "plain", ignore_errors=True)
    art = store.path("convert", "k")
    files = sorted(p for p in art.rglob("*.bin"))
    t0 = time.perf_counter()
    for path in files:
        sha256_file(path)
    sequential = time.perf_counter() - t0
    t0 = time.perf_counter()
    sha256_files(files)
    parallel = time.perf_counter() - t0
    write_s, build_s = statistics.median(writes), statistics.median(builds)
    emit("publish_runs", writes=[round(x, 3) for x in writes], builds=[round(x, 3) for x in builds])
    emit(
        "publish",
        write_s=round(write_s, 3),
        build_s=round(build_s, 3),
        overhead_s=round(build_s - write_s, 3),
        overhead_pct=round(100 * (build_s - write_s) / write_s, 1),
        hash_sequential_s=round(sequential, 3),
        hash_parallel_s=round(parallel, 3),
        hash_parallel_gb_s=round(total / parallel / 1e9, 2),
        hash_sequential_gb_s=round(total / sequential / 1e9, 2),
    )

    fast = []
    for _ in range(20):
        t0 = time.perf_counter()
        assert store.lookup("convert", "k") is not None
        fast.append(time.perf_counter() - t0)
    emit("lookup_fast", median_ms=round(1e3 * statistics.median(fast), 2), max_ms=round(1e3 * max(fast), 2))

    meta = json.loads((art / PROVENANCE_FILE).read_text())
    t0 = time.perf_counter()
    for rel, info in meta["outputs"].items():
        assert (art / rel).stat().st_size == info["size"]
    emit("lookup_size_only", ms=round(1e3 * (time.perf_counter() - t0), 2))

    for label, cold in (("lookup_rehash_warm", False), ("lookup_rehash_cold", True)):
        runs, evicted = [], None
        for _ in range(args.repeat):
            for path in files:
                os.utime(path)
            if cold:
                warm_read = read_all(art)
                drop_pages(art)
                evicted = read_all(art) > 1.5 * warm_read
                drop_pages(art)
            t0 = time.perf_counter()
            assert store.lookup("convert", "k") is not None
            runs.append(time.perf_counter() - t0)
        extra = {"cold_evicted": evicted} if cold else {}
        emit(
            label,
            median_s=round(statistics.median(runs), 3),
            gb_s=round(total / statistics.median(runs) / 1e9, 2),
            **extra,
        )
    t0 = time.perf_counter()
    assert store.lookup("convert", "k") is not None
    emit("lookup_after_rehash", ms=round(1e3 * (time.perf_counter() - t0), 2))
    shutil.rmtree(args.work)


if __name__ == "__main__":
    main()
