"""`ftx ls`, `ftx rm`, `ftx prune` on a real store built by real runs; server logs rotated."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ftx_gptj.tiny import tiny_gptj


@pytest.fixture
def store_with_two_models(ftx_cli, ftx_home: Path, tmp_path: Path) -> dict[str, Path]:
    a = tiny_gptj(tmp_path / "a")
    b = tiny_gptj(tmp_path / "b", n_embd=128, seed=1)
    for src in (a, b):
        result = ftx_cli("run", str(src), "--until", "configure", "--runtime", "python")
        assert result.exit_code == 0, result.stderr
    return {"a": a, "b": b}


def _ls(ftx_cli) -> list[dict]:
    result = ftx_cli("ls", "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_ls_lists_artifacts_with_size_source_and_age(ftx_cli, store_with_two_models: dict[str, Path]) -> None:
    rows = _ls(ftx_cli)
    assert sorted(r["stage"] for r in rows) == sorted(["fetch", "convert", "tune", "configure"] * 2)
    for row in rows:
        assert row["size"] > 0 and row["last_used"] and row["created"]
    sources = {r["source"] for r in rows if r["stage"] in ("fetch", "convert", "configure")}
    assert sources == {str(store_with_two_models["a"]), str(store_with_two_models["b"])}
    table = ftx_cli("ls")
    assert "convert" in table.stdout and "SOURCE" in table.stdout and "8 artifacts" in table.stderr


def test_rm_by_key_prefix_takes_the_repositories_built_on_it(
    ftx_cli, ftx_home: Path, store_with_two_models: dict[str, Path]
) -> None:
    rows = _ls(ftx_cli)
    convert_a = next(r for r in rows if r["stage"] == "convert" and r["source"] == str(store_with_two_models["a"]))
    repo_a = next(r for r in rows if r["stage"] == "configure" and r["source"] == str(store_with_two_models["a"]))
    dry = ftx_cli("rm", convert_a["key"][:8], "--dry-run")
    assert dry.exit_code == 0 and Path(convert_a["path"]).is_dir()
    removed = ftx_cli("rm", convert_a["key"][:8])
    assert removed.exit_code == 0, removed.stderr
    assert set(removed.stdout.split()) == {f"convert/{convert_a['key']}", f"configure/{repo_a['key']}"}
    assert "a repository built on it: removed too" in removed.stderr
    assert not Path(convert_a["path"]).exists() and not Path(repo_a["path"]).exists()
    assert len(_ls(ftx_cli)) == 6
    missing = ftx_cli("rm", "ffffffff")
    assert missing.exit_code == 1 and "no artifact" in missing.stderr and "ftx ls" in missing.stderr
    short = ftx_cli("rm", "ab")
    assert short.exit_code == 1 and "too short" in short.stderr


def test_prune_older_than_and_to_size_remove_least_recently_used(
    ftx_cli, store_with_two_models: dict[str, Path]
) -> None:
    rows = _ls(ftx_cli)
    old = time.time() - 40 * 86400
    for row in rows:  # model a was last used 40 days ago
        if row["source"] == str(store_with_two_models["a"]):
            os.utime(Path(row["path"]) / "ftx-artifact.json", (old, old))
    pruned = ftx_cli("prune", "--older-than", "30d")
    assert pruned.exit_code == 0, pruned.stderr
    left = _ls(ftx_cli)
    assert {r["source"] for r in left if r["stage"] != "tune"} == {str(store_with_two_models["b"])}
    total = sum(r["size"] for r in left)
    biggest = max(r["size"] for r in left)
    to = ftx_cli("prune", "--to-size", str(total - biggest // 2))
    assert to.exit_code == 0, to.stderr
    assert sum(r["size"] for r in _ls(ftx_cli)) <= total - biggest // 2
    bad = ftx_cli("prune", "--to-size", "lots")
    assert bad.exit_code == 1 and "50GB" in bad.stderr


def test_prune_unused_keeps_what_others_build_on_and_removes_leftovers(
    ftx_cli, ftx_home: Path, store_with_two_models: dict[str, Path]
) -> None:
    stale = ftx_home / "store" / ".tmp" / "convert-0123abcd-999999999-deadbeef"  # a killed build's remains
    stale.mkdir(parents=True)
    (stale / "x.bin").write_bytes(b"0" * 100)
    pruned = ftx_cli("prune", "--unused")
    assert pruned.exit_code == 0, pruned.stderr
    assert not stale.exists() and "leftover" in pruned.stderr
    stages = sorted(r["stage"] for r in _ls(ftx_cli))
    assert stages == ["convert", "convert", "fetch", "fetch", "tune", "tune"], "the repositories were the leaves"


def test_server_logs_are_rotated(ftx_home: Path) -> None:
    from ftx_triton.store.housekeeping import LOGS_KEPT, rotate_logs

    logs = ftx_home / "triton" / "logs"
    logs.mkdir(parents=True)
    for i in range(LOGS_KEPT + 5):
        path = logs / f"s-{i}.log"
        path.write_text("x")
        os.utime(path, (time.time() - 1000 + i, time.time() - 1000 + i))
    removed = rotate_logs(ftx_home)
    assert sorted(p.name for p in removed) == sorted(f"s-{i}.log" for i in range(5))
    assert len(list(logs.glob("*.log"))) == LOGS_KEPT


def test_sizes_and_ages_parse() -> None:
    from ftx_triton.store.housekeeping import parse_age, parse_size

    assert parse_size("50GB") == 50_000_000_000 and parse_size("1.5g") == 1_500_000_000 and parse_size("512") == 512
    assert parse_age("30d") == 30 * 86400 and parse_age("2w") == 14 * 86400 and parse_age("90m") == 5400


# --------------------------------------------------------------------------- artifacts a running ftx uses

# What a run's stage does with an artifact it builds on (the convert stage with its checkpoint): look it
# up through the store, then work on it. A real second process, holding until told to go.
_HOLDER = """
import sys
from pathlib import Path
from ftx_triton.store.artifact_store import ArtifactStore
store = ArtifactStore(Path(sys.argv[1]))
if sys.argv[4] == "build":  # what `ftx run --force` holds while it rebuilds the artifact
    with store.lock(sys.argv[2], sys.argv[3]):
        print("holding", flush=True)
        sys.stdin.readline()
else:
    assert store.lookup(sys.argv[2], sys.argv[3]) is not None
    print("holding", flush=True)
    sys.stdin.readline()
"""


@pytest.fixture
def lone_fetch(ftx_cli, store_with_two_models: dict[str, Path]) -> dict:
    """Model a's checkpoint with nothing built on it any more: what a run that is converting it sees."""
    rows = _ls(ftx_cli)
    convert_a = next(r for r in rows if r["stage"] == "convert" and r["source"] == str(store_with_two_models["a"]))
    assert ftx_cli("rm", convert_a["key"]).exit_code == 0
    fetch_key = convert_a["upstream"][0].split("/", 1)[1]
    return next(r for r in _ls(ftx_cli) if r["key"] == fetch_key)


@contextlib.contextmanager
def _held_by_another_process(home: Path, stage: str, key: str, how: str = "use") -> Iterator[subprocess.Popen[str]]:
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(home), stage, key, how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        yield holder
    finally:
        holder.kill()
        holder.wait()


def test_prune_keeps_what_a_running_ftx_process_is_building_from(ftx_cli, ftx_home: Path, lone_fetch: dict) -> None:
    """`ftx prune --unused` while another ftx converts a checkpoint: the checkpoint has no published
    dependent yet, but the process using it keeps it; once that process is gone, prune takes it."""
    with _held_by_another_process(ftx_home, "fetch", lone_fetch["key"]):
        assert next(r for r in _ls(ftx_cli) if r["key"] == lone_fetch["key"])["in_use"]
        table = ftx_cli("ls")
        assert "in use" in table.stdout
        pruned = ftx_cli("prune", "--unused")
        assert pruned.exit_code == 0, pruned.stderr
        assert Path(lone_fetch["path"]).is_dir() and f"fetch/{lone_fetch['key']}" not in pruned.stdout
        refused = ftx_cli("rm", lone_fetch["key"])
        assert refused.exit_code == 1 and "in use by a running server or ftx process" in refused.stderr
        assert Path(lone_fetch["path"]).is_dir()
    pruned = ftx_cli("prune", "--unused")
    assert pruned.exit_code == 0 and f"fetch/{lone_fetch['key']}" in pruned.stdout
    assert not Path(lone_fetch["path"]).exists()


def test_a_command_gives_its_leases_back_when_it_ends(ftx_home: Path, store_with_two_models: dict[str, Path]) -> None:
    """In-process commands (tests, tools embedding ftx) do not go on holding what they used once they end."""
    from ftx_triton.store.leases import held_here

    assert not [path for path in held_here() if ftx_home in path.parents]


def test_an_artifact_taken_up_after_the_listing_is_kept_by_prune(
    ftx_home: Path, lone_fetch: dict, capsys: pytest.CaptureFixture[str]
) -> None:
    """The use begins between prune's listing and its removal: the removal itself checks, and prune
    goes on with the rest."""
    from ftx_triton.cli.store import _remove
    from ftx_triton.store.artifact_store import ArtifactStore
    from ftx_triton.store.housekeeping import inventory

    store = ArtifactStore(ftx_home)
    chosen = [e for e in inventory(store) if e.key == lone_fetch["key"]]
    assert chosen and not chosen[0].in_use
    with _held_by_another_process(ftx_home, "fetch", lone_fetch["key"]):
        _remove(store, chosen, dry_run=False, skip_busy=True)
    assert Path(lone_fetch["path"]).is_dir()
    assert "another running ftx process uses or builds it" in capsys.readouterr().err


def test_an_artifact_being_rebuilt_elsewhere_is_refused_by_rm_and_kept_by_prune(
    ftx_cli, ftx_home: Path, lone_fetch: dict
) -> None:
    with _held_by_another_process(ftx_home, "fetch", lone_fetch["key"], how="build"):
        refused = ftx_cli("rm", lone_fetch["key"])
        assert refused.exit_code == 1 and "is being built by another ftx process" in refused.stderr
        pruned = ftx_cli("prune", "--unused")
        assert pruned.exit_code == 0, pruned.stderr
        assert "kept fetch/" in pruned.stderr and Path(lone_fetch["path"]).is_dir()
    assert ftx_cli("rm", lone_fetch["key"]).exit_code == 0 and not Path(lone_fetch["path"]).exists()


def test_a_process_removes_what_it_used_itself(ftx_home: Path, lone_fetch: dict) -> None:
    """Its own lease never blocks a process: `ftx rm` run in-process after a lookup there removes."""
    from ftx_triton.store.artifact_store import ArtifactStore
    from ftx_triton.store.housekeeping import inventory, remove_entry

    store = ArtifactStore(ftx_home)
    assert store.lookup("fetch", lone_fetch["key"]) is not None
    entry = next(e for e in inventory(store) if e.key == lone_fetch["key"])
    assert not entry.in_use
    assert remove_entry(store, entry) > 0 and not Path(lone_fetch["path"]).exists()
    assert not store.lease("fetch", lone_fetch["key"]).exists(), "the lease file goes with its artifact"


def test_a_planted_link_as_lease_file_is_neither_followed_nor_fatal(
    ftx_home: Path, lone_fetch: dict, tmp_path: Path
) -> None:
    """A link planted where a lease file goes, pointing where no file is: lookups and removal still
    work, and nothing is created where it points."""
    from ftx_triton.store.artifact_store import ArtifactStore
    from ftx_triton.store.housekeeping import inventory, remove_entry

    target = tmp_path / "elsewhere" / "made-by-ftx"
    target.parent.mkdir()
    store = ArtifactStore(ftx_home)
    lease = store.lease("fetch", lone_fetch["key"])
    lease.unlink(missing_ok=True)
    lease.symlink_to(target)
    assert store.lookup("fetch", lone_fetch["key"]) is not None
    entry = next(e for e in inventory(store) if e.key == lone_fetch["key"])
    remove_entry(store, entry)
    assert not Path(lone_fetch["path"]).exists()
    assert not target.exists()


# --------------------------------------------------------------------------- provenance damaged on disk

DAMAGES = {
    "not an object": lambda prov: prov.write_text("[1, 2]"),
    "not JSON": lambda prov: prov.write_bytes(b"\xff{"),
    "missing": lambda prov: prov.unlink(),
    "fields of the wrong type": lambda prov: prov.write_text(
        json.dumps({"inputs": [1], "result": "x", "finished_at": {"y": 1}})
    ),
    "upstream keys not strings": lambda prov: prov.write_text(
        json.dumps({"inputs": {"fetch": {"k": 1}}, "result": {"ref": 7}})
    ),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_damaged_provenance_is_listed_and_pruned_not_a_crash(
    ftx_cli, store_with_two_models: dict[str, Path], damage: str
) -> None:
    """A provenance record is ftx's own file: one damaged on disk is not validated but dropped: `ftx ls` lists
    what it can, calls an unreadable one damaged, and `ftx prune` removes damaged ones (a lookup rebuilds them)."""
    rows = _ls(ftx_cli)
    convert_a = next(r for r in rows if r["stage"] == "convert" and r["source"] == str(store_with_two_models["a"]))
    DAMAGES[damage](Path(convert_a["path"]) / "ftx-artifact.json")
    rows = _ls(ftx_cli)
    assert len(rows) == 8
    row = next(r for r in rows if r["key"] == convert_a["key"])
    unreadable = damage in ("not an object", "not JSON", "missing")
    assert row["damaged"] == unreadable and (row["source"].startswith("damaged") == unreadable)
    dry = ftx_cli("prune", "--dry-run")
    assert dry.exit_code == 0 and Path(convert_a["path"]).is_dir()
    pruned = ftx_cli("prune")
    assert pruned.exit_code == 0, pruned.stderr
    assert Path(convert_a["path"]).exists() != unreadable
    assert len(_ls(ftx_cli)) == 8 - unreadable


def test_rm_by_source_name_removes_that_model_as_ollama_rm_does(
    ftx_cli, ftx_home: Path, store_with_two_models: dict[str, Path]
) -> None:
    """`ftx rm SOURCE` (the SOURCE column of `ftx ls`) removes the model's fetch, conversion and repository; the
    shared GEMM configs and the other model stay. A source with two fetched versions is ambiguous: the error
    lists both keys and nothing is removed."""
    a, b = str(store_with_two_models["a"]), str(store_with_two_models["b"])
    removed = ftx_cli("rm", a)
    assert removed.exit_code == 0, removed.stderr
    assert sorted(ref.split("/")[0] for ref in removed.stdout.split()) == ["configure", "convert", "fetch"]
    rows = _ls(ftx_cli)
    assert {r["source"] for r in rows if r["stage"] != "tune"} == {b}
    assert sum(r["stage"] == "tune" for r in rows) == 2
    (store_with_two_models["b"] / "config.json").write_text(
        (store_with_two_models["b"] / "config.json").read_text().replace("}", ', "ftx_note": 1}', 1)
    )
    again = ftx_cli("run", b, "--until", "fetch", "--runtime", "python")
    assert again.exit_code == 0, again.stderr
    fetches = [r for r in _ls(ftx_cli) if r["stage"] == "fetch" and r["source"] == b]
    assert len(fetches) == 2
    ambiguous = ftx_cli("rm", b)
    assert ambiguous.exit_code == 1
    assert "2 fetched versions" in ambiguous.stderr and all(f"fetch/{r['key']}" in ambiguous.stderr for r in fetches)
    assert "hint:" in ambiguous.stderr and len(_ls(ftx_cli)) == len(rows) + 1
