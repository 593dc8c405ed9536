"""Plugin host: discovery through entry points, broken plugins, blocking, duplicate families."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from plugin_dists import make_dist

BROKEN = "import does_not_exist_anywhere\n"
DUPLICATE_GPTJ = """
from ftx_triton import hookimpl
from ftx_gptj.family import GPTJ

class OtherGPTJ(GPTJ):
    pass

@hookimpl
def ftx_register_families():
    return [OtherGPTJ]
"""
MISSPELLED_HOOK = """
from ftx_triton import hookimpl

@hookimpl
def ftx_regster_families():
    return []
"""


def ftx(args: list[str], extra_path: Path | None, home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run the real console script in a subprocess (entry points are read from sys.path)."""
    environ = {**os.environ, "FTX_HOME": str(home), **env}
    if extra_path:
        environ["PYTHONPATH"] = os.pathsep.join([str(extra_path), environ.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "ftx_triton", *args], capture_output=True, text=True, env=environ, timeout=120
    )


def test_installed_first_party_plugins_are_discovered(plugin_host) -> None:
    assert {"gptj"} <= set(plugin_host.families)
    by_name = {r.name: r for r in plugin_host.records}
    for slug in ("gptj", "t5", "gptneox", "kogpt"):
        assert by_name[slug].distribution == f"ftx-triton-{slug}"
        assert by_name[slug].status == "loaded", by_name[slug].error
    assert plugin_host.family_owner["gptj"] == "ftx-triton-gptj"


def test_broken_plugin_is_reported_and_other_commands_work(tmp_path: Path) -> None:
    site = make_dist(tmp_path / "site", "ftx-broken", "ftx_broken", BROKEN)
    listing = ftx(["plugins", "--json"], site, tmp_path / "home")
    assert listing.returncode == 1  # a broken plugin makes `ftx plugins` fail, after listing everything
    records = {r["name"]: r for r in json.loads(listing.stdout)}
    assert records["ftx_broken"]["status"] == "broken"
    assert records["ftx_broken"]["distribution"] == "ftx-broken"
    assert "does_not_exist_anywhere" in records["ftx_broken"]["error"]
    assert records["gptj"]["status"] == "loaded"
    models = ftx(["models", "--json"], site, tmp_path / "home")
    assert models.returncode == 0
    assert "gptj" in {m["family"] for m in json.loads(models.stdout)}
    assert "ftx_broken" in models.stderr and "failed to load" in models.stderr


def test_disabled_plugin_is_not_loaded(tmp_path: Path) -> None:
    site = make_dist(tmp_path / "site", "ftx-broken", "ftx_broken", BROKEN)
    listing = ftx(["plugins", "--json"], site, tmp_path / "home", FTX_DISABLE_PLUGINS="ftx_broken,kogpt")
    assert listing.returncode == 0
    records = {r["name"]: r for r in json.loads(listing.stdout)}
    assert records["ftx_broken"]["status"] == "disabled" and records["ftx_broken"]["error"] is None
    assert records["kogpt"]["status"] == "disabled"


def test_duplicate_family_names_both_distributions(tmp_path: Path) -> None:
    site = make_dist(tmp_path / "site", "ftx-gptj-fork", "ftx_gptj_fork", DUPLICATE_GPTJ)
    result = ftx(["models"], site, tmp_path / "home")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "family 'gptj' is registered by both" in result.stderr
    assert "ftx-triton-gptj" in result.stderr and "ftx-gptj-fork" in result.stderr
    assert "hint:" in result.stderr


def test_misspelled_hook_marks_plugin_broken(tmp_path: Path) -> None:
    site = make_dist(tmp_path / "site", "ftx-typo", "ftx_typo", MISSPELLED_HOOK)
    listing = ftx(["plugins", "--json"], site, tmp_path / "home")
    records = {r["name"]: r for r in json.loads(listing.stdout)}
    assert records["ftx_typo"]["status"] == "broken"
    assert "ftx_regster_families" in records["ftx_typo"]["error"]


def test_version_lists_core_and_every_plugin(ftx_cli) -> None:
    result = ftx_cli("--version")
    assert result.exit_code == 0
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    for dist in ("ftx-triton", "ftx-triton-gptj", "ftx-triton-t5", "ftx-triton-gptneox", "ftx-triton-kogpt"):
        assert lines[dist] == "0.1.0"


def test_freeze_prints_pins(ftx_cli) -> None:
    result = ftx_cli("plugins", "--freeze")
    assert result.exit_code == 0
    assert "ftx-triton==0.1.0" in result.stdout.splitlines()
    assert "ftx-triton-gptj==0.1.0" in result.stdout.splitlines()


def test_unknown_family_lists_installed(ftx_cli, tiny_gptj_dir: Path, tmp_path: Path) -> None:
    result = ftx_cli("convert", str(tiny_gptj_dir), "--family", "llama", "--output", str(tmp_path / "o"))
    assert result.exit_code == 1
    assert "unknown family 'llama'" in result.stderr and "gptj" in result.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("hook", ["ftx_fetch", "ftx_convert", "ftx_tune", "ftx_configure", "ftx_serve"])
def test_hook_stage_hooks_are_firstresult_with_trylast_defaults(plugin_host, hook: str) -> None:
    caller = getattr(plugin_host.hook, hook)
    assert caller.spec.opts["firstresult"]
    defaults = [
        impl for impl in caller.get_hookimpls() if impl.plugin_name.startswith("ftx_triton.engine.default_plugins")
    ]
    assert len(defaults) == 1 and defaults[0].trylast


FUTURE_API = """
from ftx_triton import hookimpl

FTX_PLUGIN_API = (3, 4)

@hookimpl
def ftx_register_families():
    return []
"""


def test_plugin_outside_the_api_range_is_refused(tmp_path: Path) -> None:
    site = make_dist(tmp_path / "site", "ftx-future", "ftx_future", FUTURE_API)
    listing = ftx(["plugins", "--json"], site, tmp_path / "home")
    record = {r["name"]: r for r in json.loads(listing.stdout)}["ftx_future"]
    assert record["status"] == "broken"
    assert "supports plugin API 3..4 but this ftx provides API 2" in record["error"]
    assert "upgrade ftx" in record["error"]


def test_plugins_check_fails_ci_on_a_broken_plugin_and_says_it_once(tmp_path: Path) -> None:
    site = make_dist(tmp_path / "site", "ftx-broken", "ftx_broken", BROKEN)
    checked = ftx(["plugins", "--check"], site, tmp_path / "home")
    assert checked.returncode == 1 and checked.stdout == ""
    assert checked.stderr.count("does_not_exist_anywhere") == 1 and "error: plugin ftx_broken" in checked.stderr
    assert "hint:" in checked.stderr and "Traceback" not in checked.stderr
    listing = ftx(["plugins"], site, tmp_path / "home")  # the table: the failure is said once too, then exit 1
    assert listing.returncode == 1 and listing.stderr.count("failed to load") == 1
    clean = ftx(["plugins", "--check"], None, tmp_path / "home")
    assert clean.returncode == 0 and "plugins loaded" in clean.stderr and "gptj" in clean.stderr


@pytest.mark.parametrize("how", ["preset", "--family"])
def test_a_family_hidden_by_the_allow_list_is_named_hidden_not_unknown(
    tmp_path: Path, tiny_gptj_dir: Path, how: str
) -> None:
    args = ["run", "gptj"] if how == "preset" else ["run", str(tiny_gptj_dir), "--family", "gptj"]
    hidden = ftx([*args, "--dry-run"], None, tmp_path / "home", FTX_LOAD_PLUGINS="ftx-triton-t5")
    assert hidden.returncode == 1 and "unknown" not in hidden.stderr, hidden.stderr
    assert "family 'gptj' is hidden" in hidden.stderr and "FTX_LOAD_PLUGINS does not list it" in hidden.stderr
    assert "hint: add gptj to FTX_LOAD_PLUGINS" in hidden.stderr
