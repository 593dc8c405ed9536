"""`ftx ls`/`rm`/`prune` over a store someone tampered with: links out of the home, hostile names and
lock files, damaged values; and what running processes use (a served `configure -o` repository, a
detached server's log). Each case is a defect a tester found; real processes and a real tritonserver."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest


@pytest.fixture
def built(ftx_cli, demo_ftx_home: Path) -> dict[str, dict]:
    """A store of the built-in model up to its repository: stage -> its `ftx ls --json` row."""
    result = ftx_cli("run", "tiny-gptj", "--until", "configure", "--runtime", "python")
    assert result.exit_code == 0, result.stderr
    return {row["stage"]: row for row in _ls(ftx_cli)}


def _ls(ftx_cli) -> list[dict]:
    result = ftx_cli("ls", "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "outside" / "0123456789abcdef01234567"  # named like an artifact
    victim.mkdir(parents=True)
    (victim / "data.txt").write_text("precious")
    return victim


# --------------------------------------------------------------------------- never out of the home


def test_a_linked_stage_directory_is_not_the_store(ftx_cli, ftx_home: Path, built: dict, tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    (ftx_home / "store" / "mystage").symlink_to(victim.parent)
    (ftx_home / "store" / "convert" / "abcdef0123456789abcdef01").symlink_to(victim)  # a linked artifact
    assert {row["stage"] for row in _ls(ftx_cli)} == {"fetch", "convert", "tune", "configure"}
    assert ftx_cli("prune").exit_code == 0
    assert ftx_cli("prune", "--to-size", "0").exit_code == 0
    assert ftx_cli("rm", victim.name).exit_code == 1
    assert (victim / "data.txt").read_text() == "precious"


def test_prune_never_empties_what_the_tmp_or_downloads_directory_links_to(
    ftx_cli, ftx_home: Path, built: dict, tmp_path: Path
) -> None:
    victim = _victim(tmp_path)
    old = victim / "weights.bin"
    old.write_bytes(b"w")
    os.utime(old, (0, 0))  # "a download remnant not touched for a week"
    tmp = ftx_home / "store" / ".tmp"
    tmp.rmdir()
    tmp.symlink_to(victim)
    (ftx_home / "downloads").mkdir(exist_ok=True)
    linked = ftx_home / "downloads" / "models"
    linked.symlink_to(victim)
    (ftx_home / "downloads" / "old.bin").symlink_to(old)
    assert ftx_cli("prune").exit_code == 0
    tmp.unlink()
    linked.unlink()
    (ftx_home / "downloads").rename(tmp_path / "downloads-was")
    (ftx_home / "downloads").symlink_to(victim)
    assert ftx_cli("prune").exit_code == 0
    assert sorted(p.name for p in victim.iterdir()) == ["data.txt", "weights.bin"]


def test_a_linked_provenance_is_damage_and_a_cache_hit_leaves_its_target_alone(
    ftx_cli, ftx_home: Path, built: dict, tmp_path: Path
) -> None:
    prov = Path(built["fetch"]["path"]) / "ftx-artifact.json"
    target = tmp_path / "elsewhere.json"
    target.write_bytes(prov.read_bytes())
    os.utime(target, (1_000_000, 1_000_000))
    prov.unlink()
    prov.symlink_to(target)
    assert ftx_cli("run", "tiny-gptj", "--until", "fetch", "--runtime", "python").exit_code == 0
    assert target.stat().st_mtime == 1_000_000
    assert not prov.is_symlink(), "the damaged artifact was rebuilt"


# --------------------------------------------------------------------------- what running processes use


def test_a_served_repository_outside_the_store_keeps_its_weights(
    ftx_cli, ftx_home: Path, built: dict, tmp_path: Path
) -> None:
    """`ftx configure -o DIR` served by a real tritonserver: its config names the store's converted
    weights, which `ftx prune --to-size 0` and `ftx rm` must leave alone."""
    from ftx_triton.server.tritonserver import TritonServer

    repo = tmp_path / "repo"
    assert ftx_cli("configure", "tiny-gptj", "-o", str(repo), "--runtime", "python").exit_code == 0
    with TritonServer(repo, home=tmp_path / "server-home", env={"FTX_DEVICE": "cpu"}, name="outside"):
        rows = {row["stage"]: row for row in _ls(ftx_cli)}
        assert rows["convert"]["in_use"] and rows["fetch"]["in_use"]
        assert ftx_cli("prune", "--to-size", "0").exit_code == 0
        assert Path(built["convert"]["path"]).is_dir()
        refused = ftx_cli("rm", built["convert"]["key"])
        assert refused.exit_code == 1 and "in use" in refused.stderr


def test_prune_keeps_a_log_a_running_process_writes(ftx_cli, ftx_home: Path) -> None:
    logs = ftx_home / "triton" / "logs"
    logs.mkdir(parents=True)
    for i in range(22):
        log = logs / f"m-{i:02d}.log"
        log.write_text("x")
        os.utime(log, (1000 + i, 1000 + i))
    written, idle = logs / "m-00.log", logs / "m-01.log"  # the two oldest: beyond the newest 20
    with written.open("a") as out:
        writer = subprocess.Popen(["sleep", "60"], stdout=out)
    try:
        assert ftx_cli("prune").exit_code == 0
        assert written.exists() and not idle.exists()
    finally:
        writer.kill()
        writer.wait()


def test_two_removals_of_one_artifact_free_it_once(ftx_home: Path, built: dict) -> None:
    """Two prunes at once: the second finds it gone, which is no error."""
    from ftx_triton.store.artifact_store import ArtifactStore
    from ftx_triton.store.housekeeping import inventory, remove_entry

    store = ArtifactStore(ftx_home)
    entry = next(e for e in inventory(store) if e.stage == "configure")
    assert remove_entry(store, entry) > 0
    assert remove_entry(store, entry) == 0


# --------------------------------------------------------------------------- hostile names, lock files, values


def test_a_name_too_long_for_a_lock_file_is_no_artifact(ftx_cli, ftx_home: Path, built: dict) -> None:
    (ftx_home / "store" / "convert" / ("a" * 250)).mkdir()
    assert len(_ls(ftx_cli)) == 4
    assert ftx_cli("prune", "--to-size", "0", "--dry-run").exit_code == 0


@pytest.mark.parametrize("kind", ["link", "directory"])
def test_an_unusable_lock_file_is_a_clear_error(
    ftx_cli, ftx_home: Path, built: dict, tmp_path: Path, kind: str
) -> None:
    row = built["configure"]
    lock = ftx_home / "locks" / f"configure-{row['key']}.lock"
    lock.unlink(missing_ok=True)
    if kind == "link":
        lock.symlink_to(lock)  # a loop
    else:
        lock.mkdir()
    result = ftx_cli("rm", row["key"])
    assert result.exit_code == 1 and result.exception is None
    assert "cannot lock configure/" in result.stderr and "remove that path" in result.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("prune", "--to-size", "9" * 400), "size out of range"),
        (("prune", "--to-size", ""), "not a size"),
        (("prune", "--older-than", ""), "not a duration"),
        (("rm", "/"), "'/' is too short"),
    ],
)
def test_values_out_of_range_are_refused(ftx_cli, ftx_home: Path, args: tuple[str, ...], needle: str) -> None:
    result = ftx_cli(*args)
    assert result.exit_code == 1 and result.exception is None and needle in result.stderr, result.stderr


def test_provenance_text_reaches_the_terminal_printable_and_future_times_are_now(
    ftx_cli, ftx_home: Path, built: dict
) -> None:
    prov = Path(built["fetch"]["path"]) / "ftx-artifact.json"
    meta = json.loads(prov.read_text())
    meta["result"]["ref"] = {"uri": "evil\x1b]0;pwned\x07\x1b[2J"}
    prov.write_text(json.dumps(meta))
    future = time.time() + 10 * 365 * 86400
    os.utime(prov, (future, future))
    table = ftx_cli("ls")
    assert table.exit_code == 0 and "\x1b" not in table.stdout and "evil?]0;pwned??[2J" in table.stdout
    assert "0s ago" in table.stdout and "-" not in table.stdout.split("fetch", 1)[1].split("\n", 1)[0]


def _deep_tree(root: Path, depth: int) -> None:
    """``root/d/d/…/d/w`` ``depth`` directories deep, made through directory fds (the path is too long)."""
    root.mkdir(parents=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.close(os.open("w", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    os.close(fd)


def test_a_tree_thousands_of_directories_deep_is_removed_by_prune(ftx_cli, ftx_home: Path) -> None:
    """Issue 27: an archive of thousands of nested directories (which extraction now refuses) left its tree
    in store/.tmp, and every later `ftx prune` crashed on it with RecursionError (shutil.rmtree and os.walk
    recurse once per level on Python 3.11). Removal and measuring now walk with an explicit stack."""
    from ftx_triton.io.trees import remove_tree, tree_size

    leftover = ftx_home / "store" / ".tmp" / "fetch-0a1b-999999999-x"
    other = ftx_home / "elsewhere"
    try:
        _deep_tree(leftover, 3000)
        result = ftx_cli("prune", "--unused")
        assert result.exit_code == 0 and result.exception is None, (result.stderr, result.exception)
        assert "removed leftover" in result.stdout + result.stderr and not leftover.exists()
        _deep_tree(other, 2500)
        assert tree_size(other) == 0
        remove_tree(other)
        assert not other.exists()
    finally:  # pytest's own clean-up of tmp_path would hit the same RecursionError
        remove_tree(leftover)
        remove_tree(other)
