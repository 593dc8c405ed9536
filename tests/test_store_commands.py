"""`ftx ls`, `ftx rm`, `ftx prune` on a real store built by real runs; server logs rotated."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from ftx.tiny import tiny_gptj


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


def test_rm_by_key_prefix_takes_the_repositories_built_on_it(ftx_cli, ftx_home: Path,
                                                             store_with_two_models: dict[str, Path]) -> None:
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


def test_prune_older_than_and_to_size_remove_least_recently_used(ftx_cli,
                                                                 store_with_two_models: dict[str, Path]) -> None:
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
        ftx_cli, ftx_home: Path, store_with_two_models: dict[str, Path]) -> None:
    stale = ftx_home / "store" / ".tmp" / "convert-0123abcd-999999999-deadbeef"  # a killed build's remains
    stale.mkdir(parents=True)
    (stale / "x.bin").write_bytes(b"0" * 100)
    pruned = ftx_cli("prune", "--unused")
    assert pruned.exit_code == 0, pruned.stderr
    assert not stale.exists() and "leftover" in pruned.stderr
    stages = sorted(r["stage"] for r in _ls(ftx_cli))
    assert stages == ["convert", "convert", "fetch", "fetch", "tune", "tune"], "the repositories were the leaves"


def test_server_logs_are_rotated(ftx_home: Path) -> None:
    from ftx.housekeeping import LOGS_KEPT, rotate_logs

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
    from ftx.housekeeping import parse_age, parse_size

    assert parse_size("50GB") == 50_000_000_000 and parse_size("1.5g") == 1_500_000_000 and parse_size("512") == 512
    assert parse_age("30d") == 30 * 86400 and parse_age("2w") == 14 * 86400 and parse_age("90m") == 5400
