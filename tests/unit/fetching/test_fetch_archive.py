"""ftx_triton.fetching.archive: happy paths per format, refused malicious members, atomicity."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from fetch_helpers import MODEL_TREE, Entry, LocalServer, payload, sha256, tar_bytes, tree, write_archive, zip_bytes
from ftx_triton.errors import OutputError, SourceError
from ftx_triton.fetching.archive import is_archive, safe_extract
from ftx_triton.fetching.http import download
from mounts import tmpfs

FORMATS = ["ckpt.tar.zstd", "ckpt.tar.zst", "ckpt.tzst", "ckpt.tar.gz", "ckpt.tgz", "ckpt.tar", "ckpt.zip"]


def expected_model_tree() -> dict[str, bytes | str]:
    return {
        "config.json": b'{"model_type": "gptj"}',
        "weights": "/",
        "weights/latest": "-> shard-0.bin",
        "weights/shard-0.bin": MODEL_TREE[2].data,
    }


def assert_nothing_left(dest: Path) -> None:
    assert not dest.exists()
    assert [p.name for p in dest.parent.iterdir() if p.name.startswith(f".{dest.name}.")] == []


@pytest.mark.parametrize("name", FORMATS)
def test_extracts_each_format_and_returns_the_single_top_dir(tmp_path: Path, name: str) -> None:
    archive = write_archive(tmp_path / name, MODEL_TREE)
    assert is_archive(archive)
    root = safe_extract(archive, tmp_path / "out", progress=False)
    assert root == tmp_path / "out" / "model"
    assert tree(root) == expected_model_tree()


def test_archive_without_a_single_top_dir_returns_dest(tmp_path: Path) -> None:
    archive = write_archive(tmp_path / "flat.tar.gz", [Entry("config.json", b"{}"), Entry("w.bin", b"w")])
    assert safe_extract(archive, tmp_path / "out", progress=False) == tmp_path / "out"
    assert tree(tmp_path / "out") == {"config.json": b"{}", "w.bin": b"w"}


def test_existing_empty_dest_is_used(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    archive = write_archive(tmp_path / "a.zip", MODEL_TREE)
    assert safe_extract(archive, tmp_path / "out", progress=False) == tmp_path / "out" / "model"


def test_downloaded_tar_zstd_end_to_end(tmp_path: Path) -> None:
    archive = write_archive(tmp_path / "step_383500_slim.tar.zstd", MODEL_TREE)
    with LocalServer() as server:
        server.serve_bytes("/step_383500_slim.tar.zstd", archive.read_bytes())
        got = download(
            server.url("/step_383500_slim.tar.zstd"),
            tmp_path / "dl" / archive.name,
            sha256=sha256(archive.read_bytes()),
            progress=False,
        )
    assert tree(safe_extract(got, tmp_path / "out", progress=False)) == expected_model_tree()


MALICIOUS = {
    "dotdot": [Entry("model/config.json", b"{}"), Entry("model/../../evil.txt", b"pwned")],
    "absolute": [Entry("/tmp/ftx-evil-abs.txt", b"pwned")],
    "symlink-out": [Entry("model", kind="dir"), Entry("model/escape", kind="symlink", link="../../outside")],
    "symlink-absolute": [Entry("passwd", kind="symlink", link="/etc/passwd")],
    "symlink-then-write": [Entry("link", kind="symlink", link=".."), Entry("link/evil.txt", b"pwned")],
    "hardlink-out": [Entry("h", kind="hardlink", link="../outside.txt")],
    "fifo": [Entry("model/pipe", kind="fifo")],
    "device": [Entry("model/null", kind="chrdev")],
}
REASONS = {
    "dotdot": ("model/../../evil.txt", "'..'"),
    "absolute": ("/tmp/ftx-evil-abs.txt", "absolute path"),
    "symlink-out": ("model/escape", "symlink pointing outside"),
    "symlink-absolute": ("passwd", "symlink to an absolute path"),
    "symlink-then-write": ("link", "symlink pointing outside"),
    "hardlink-out": ("'h'", "hardlink pointing outside"),
    "fifo": ("model/pipe", "special file"),
    "device": ("model/null", "special file"),
}


@pytest.mark.parametrize("case", sorted(MALICIOUS))
@pytest.mark.parametrize("suffix", [".tar", ".tar.zstd"])
def test_malicious_tar_is_refused_and_leaves_nothing(tmp_path: Path, case: str, suffix: str) -> None:
    work = tmp_path / "work"
    work.mkdir()
    archive = write_archive(work / f"bad{suffix}", MALICIOUS[case])
    dest = work / "out"
    with pytest.raises(SourceError) as err:
        safe_extract(archive, dest, progress=False)
    member, reason = REASONS[case]
    assert member in err.value.message and reason in err.value.message
    assert "--sha256" in err.value.hint
    assert_nothing_left(dest)
    assert not (tmp_path / "evil.txt").exists() and not (tmp_path / "outside").exists()
    assert not Path("/tmp/ftx-evil-abs.txt").exists()


@pytest.mark.parametrize(
    ("entries", "member", "reason"),
    [
        ([Entry("model/ok.txt", b"ok"), Entry("../zip-slip.txt", b"pwned")], "../zip-slip.txt", "'..'"),
        ([Entry("/abs-zip.txt", b"pwned")], "/abs-zip.txt", "absolute path"),
        ([Entry("C:/windows.txt", b"pwned")], "C:/windows.txt", "absolute path"),
        ([Entry("model/escape", kind="symlink", link="../../x")], "model/escape", "symlink pointing outside"),
    ],
)
def test_zip_slip_is_refused_before_anything_is_written(
    tmp_path: Path, entries: list[Entry], member: str, reason: str
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    archive = work / "bad.zip"
    archive.write_bytes(zip_bytes(entries))
    with pytest.raises(SourceError) as err:
        safe_extract(archive, work / "out", progress=False)
    assert member in err.value.message and reason in err.value.message
    assert_nothing_left(work / "out")
    assert not (tmp_path / "zip-slip.txt").exists()


def test_symlink_inside_the_archive_is_kept(tmp_path: Path) -> None:
    entries = [
        Entry("m/a/w.bin", b"w"),
        Entry("m/b/link", kind="symlink", link="../a/w.bin"),
        Entry("m/h", kind="hardlink", link="m/a/w.bin"),
    ]
    root = safe_extract(write_archive(tmp_path / "ok.tar", entries), tmp_path / "out", progress=False)
    assert (root / "b" / "link").read_bytes() == b"w" and (root / "h").read_bytes() == b"w"


@pytest.mark.parametrize("name", ["t.tar.gz", "t.tar.zstd", "t.zip"])
def test_truncated_archive_is_a_source_error(tmp_path: Path, name: str) -> None:
    full = write_archive(tmp_path / name, MODEL_TREE).read_bytes()
    (tmp_path / name).write_bytes(full[: len(full) // 2])
    with pytest.raises(SourceError, match="corrupt or truncated") as err:
        safe_extract(tmp_path / name, tmp_path / "out", progress=False)
    assert "fetch it again" in err.value.hint
    assert_nothing_left(tmp_path / "out")


def test_bad_inputs(tmp_path: Path) -> None:
    archive = write_archive(tmp_path / "a.tar", MODEL_TREE)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(OutputError, match="already exists"):
        safe_extract(archive, tmp_path / "full", progress=False)
    with pytest.raises(SourceError, match="not a supported archive") as err:
        safe_extract(tmp_path / "weights.bin", tmp_path / "o", progress=False)
    assert ".tar.zstd" in err.value.hint
    with pytest.raises(SourceError, match="does not exist"):
        safe_extract(tmp_path / "missing.tar.gz", tmp_path / "o", progress=False)


def test_is_archive_goes_by_name(tmp_path: Path) -> None:
    (tmp_path / "pytorch_model.bin").write_bytes(gzip.compress(tar_bytes(MODEL_TREE)))
    assert not is_archive(tmp_path / "pytorch_model.bin")
    assert is_archive(Path("STEP.TAR.ZSTD")) and is_archive(Path("x.tar.xz")) and not is_archive(Path("x.npz"))


# --- links already on disk, duplicates, bombs ------------------------------------------------

DEEP = "x1/x2/x3/x4/x5"
CHAINED = [  # each link looks inside when read as text; together they reach 5 levels above the target
    Entry(f"{DEEP}/l", kind="symlink", link="../../../../.."),
    Entry(f"{DEEP}/l/esc", kind="symlink", link="../../../../.."),
    Entry(f"{DEEP}/l/esc/PWNED-chained", b"pwned"),
]
ON_DISK = {
    "chained-symlinks": (CHAINED, "x1/x2/x3/x4/x5/l/esc", "symlink"),
    "write-through-inside-link": (
        [Entry("m/real", kind="dir"), Entry("m/link", kind="symlink", link="real"), Entry("m/link/PWNED-in", b"x")],
        "m/link/PWNED-in",
        "symlink",
    ),
    "link-through-link": (  # 'd' is the target itself, so d/e/../.. is one level above it
        [Entry("e", kind="dir"), Entry("d", kind="symlink", link="."), Entry("a", kind="symlink", link="d/e/../..")],
        "a",
        "resolves outside",
    ),
    "file-then-dir": ([Entry("m/w.bin", b"w"), Entry("m/w.bin/PWNED-under", b"x")], "m/w.bin/PWNED-under", "file"),
    "duplicate-file": ([Entry("m/config.json", b"{}"), Entry("m/config.json", b"{evil}")], "m/config.json", "twice"),
    "duplicate-after-dot-slash": ([Entry("m/w.bin", b"a"), Entry("./m/w.bin", b"b")], "m/w.bin", "twice"),
    "duplicate-link-then-file": (
        [Entry("m/w.bin", kind="symlink", link="x"), Entry("m/w.bin", b"b")],
        "m/w.bin",
        "twice",
    ),
}


def nested_work(tmp_path: Path) -> Path:
    """tmp/a/b/c/d/work: five levels above the staging directory is tmp/a, still inside tmp_path."""
    work = tmp_path / "a" / "b" / "c" / "d" / "work"
    work.mkdir(parents=True)
    return work


def assert_nothing_escaped(tmp_path: Path) -> None:
    assert [p for p in tmp_path.rglob("PWNED*")] == []
    assert not Path("/PWNED-chained").exists()


@pytest.mark.filterwarnings("ignore:Duplicate name")
@pytest.mark.parametrize("case", sorted(ON_DISK))
@pytest.mark.parametrize("suffix", [".zip", ".tar", ".tar.zstd", ".tar.gz"])
def test_members_never_write_through_links_or_twice(tmp_path: Path, case: str, suffix: str) -> None:
    entries, member, reason = ON_DISK[case]
    work = nested_work(tmp_path)
    archive = write_archive(work / f"bad{suffix}", entries)
    with pytest.raises(SourceError) as err:
        safe_extract(archive, work / "out", progress=False)
    assert member in err.value.message and reason in err.value.message, err.value.message
    assert "nothing was extracted" in err.value.hint
    assert_nothing_left(work / "out")
    assert_nothing_escaped(tmp_path)


def test_directories_may_repeat(tmp_path: Path) -> None:
    entries = [
        Entry("m/sub/w.bin", b"w"),
        Entry("m", kind="dir"),
        Entry("m/sub", kind="dir"),
        Entry("./m/", kind="dir"),
    ]
    root = safe_extract(write_archive(tmp_path / "ok.zip", entries), tmp_path / "out", progress=False)
    assert tree(root) == {"sub": "/", "sub/w.bin": b"w"}


def zip_of_zeros(path: Path, size: int, name: str = "m/zeros.bin") -> Path:
    import zipfile

    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf, zf.open(name, "w") as out:
        block = bytes(1 << 20)
        for _ in range(size >> 20):
            out.write(block)
    return path


@pytest.mark.parametrize("suffix", [".zip", ".tar.gz", ".tar.zstd"])
def test_decompression_bomb_is_refused_before_writing_it(tmp_path: Path, suffix: str) -> None:
    """A 64 MiB file of zeros compresses ~1000x: over the ratio limit, refused from the declared sizes."""
    size = 64 << 20
    if suffix == ".zip":
        archive = zip_of_zeros(tmp_path / "bomb.zip", size)
    else:
        archive = write_archive(tmp_path / f"bomb{suffix}", [Entry("m/zeros.bin", bytes(size))])
    assert archive.stat().st_size < 1 << 20
    with pytest.raises(SourceError) as err:
        safe_extract(archive, tmp_path / "out", progress=False)
    assert "m/zeros.bin" in err.value.message and "expands" in err.value.message, err.value.message
    assert "extract it yourself" in err.value.hint
    assert_nothing_left(tmp_path / "out")


def test_bomb_limits_count_written_bytes(tmp_path: Path) -> None:
    """Explicit limits: the byte cap and the ratio each stop an extraction."""
    archive = write_archive(tmp_path / "ok.tar", MODEL_TREE)
    with pytest.raises(SourceError, match="expands to more than 1000 bytes"):
        safe_extract(archive, tmp_path / "out", progress=False, max_bytes=1000)
    assert_nothing_left(tmp_path / "out")
    assert safe_extract(archive, tmp_path / "out", progress=False, max_bytes=1 << 20).name == "model"


def test_full_disk_is_an_output_error_and_leaves_nothing(tmp_path: Path) -> None:
    """More than the free space of a real 1 MiB tmpfs (needs root to mount; skipped otherwise)."""
    archive = write_archive(tmp_path / "big.tar", [Entry("m/w.bin", payload(3 << 20, 7))])
    with tmpfs(tmp_path / "small") as mnt:
        with pytest.raises(OutputError) as err:
            safe_extract(archive, mnt / "out", progress=False)
        assert "no space left" in err.value.message and str(mnt) in err.value.message
        assert list(mnt.iterdir()) == []


def test_read_only_destination_is_an_output_error(tmp_path: Path) -> None:
    """A real read-only file system (a tmpfs mounted ro; needs root, skipped otherwise)."""
    archive = write_archive(tmp_path / "a.tar", MODEL_TREE)
    with tmpfs(tmp_path / "ro", read_only=True) as mnt:
        with pytest.raises(OutputError) as err:
            safe_extract(archive, mnt / "out", progress=False)
        assert "cannot extract into" in err.value.message and "writable" in err.value.hint


def test_pull_of_a_chained_symlink_zip_writes_nothing_outside(ftx_cli, ftx_home: Path, tmp_path: Path) -> None:
    """Through `ftx pull` (local file) and `ftx run http://…/a.zip` (a server on 127.0.0.1)."""
    archive = write_archive(tmp_path / "a.zip", CHAINED)
    pulled = ftx_cli("pull", str(archive))
    assert pulled.exit_code == 1 and "error:" in pulled.stderr and "Traceback" not in pulled.stderr, pulled.stderr
    assert_nothing_escaped(tmp_path)
    with LocalServer() as server:
        server.serve_bytes("/a.zip", archive.read_bytes())
        ran = ftx_cli("run", server.url("/a.zip"), "--until", "convert")
    assert ran.exit_code == 1 and "x1/x2/x3/x4/x5/l/esc" in ran.stderr, ran.stderr
    assert_nothing_escaped(tmp_path)
    assert [p.name for p in (ftx_home / "store").glob("fetch/*")] == []


# --- names a file system or a terminal cannot take, encrypted members (issue 27) -------------------

DEEP_DIRS = ["/".join(["d"] * n) for n in range(1, 3001)]
HOSTILE_NAMES = {
    "thousands-of-nested-dirs": (
        [Entry(d, kind="dir") for d in DEEP_DIRS] + [Entry(DEEP_DIRS[-1] + "/w", b"x")],
        "directories deep",
    ),
    "300-character-name": ([Entry("m/" + "n" * 300, b"x")], "path component of 300 bytes"),
    "escape-sequence": ([Entry("m/\x1b[2Jconfig.json", b"{}")], "control or bidi-override"),
    "bidi-override": ([Entry("m/model\u202enosj.bin", b"x")], "control or bidi-override"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_NAMES))
@pytest.mark.parametrize("suffix", [".tar.gz", ".zip"])
def test_member_names_no_file_system_or_terminal_takes_are_refused(tmp_path: Path, case: str, suffix: str) -> None:
    """Issue 27: thousands of nested directories crashed extraction (RecursionError while removing the
    staging tree, which stayed behind); a 300-character name said "make … writable"; escape sequences
    and bidi overrides were extracted silently and printed raw."""
    entries, reason = HOSTILE_NAMES[case]
    archive = write_archive(tmp_path / f"bad{suffix}", entries)
    with pytest.raises(SourceError) as err:
        safe_extract(archive, tmp_path / "out", progress=False)
    assert reason in err.value.message
    assert err.value.message.isprintable() and "\u202e" not in err.value.message
    assert "writable" not in err.value.hint
    assert_nothing_left(tmp_path / "out")
    assert [p.name for p in tmp_path.iterdir()] == [archive.name]


def test_encrypted_zip_member_is_a_clear_error(tmp_path: Path) -> None:
    """Issue 27: a member with the zip encryption flag crashed with RuntimeError ("password required")."""
    import zipfile

    raw = bytearray(zip_bytes([Entry("m/config.json", b"{}")]))
    for signature, flag_at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):  # local header, central directory
        at = raw.index(signature) + flag_at
        raw[at] |= 0x1  # "encrypted"; zipfile writes no encrypted members itself
    archive = tmp_path / "locked.zip"
    archive.write_bytes(bytes(raw))
    assert zipfile.ZipFile(archive).infolist()[0].flag_bits & 0x1
    with pytest.raises(SourceError, match="'m/config.json' is encrypted") as err:
        safe_extract(archive, tmp_path / "out", progress=False)
    assert "password-protected" in err.value.hint
    assert_nothing_left(tmp_path / "out")
