"""Options are checked before the first byte is fetched (issue: `--runtime pyhton` failed only after fetch and
convert). A real local HTTP server counts the requests a run makes; the store must stay empty."""

from __future__ import annotations

from pathlib import Path

import pytest
from fetch_helpers import LocalServer, payload


def _store_files(home: Path) -> list[Path]:
    return [p for p in (home / "store").rglob("*") if p.is_file()] if (home / "store").is_dir() else []


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--runtime", "pyhton"], "unknown runtime 'pyhton' (did you mean 'python'?)"),
        (["--family", "gtpj"], "unknown family 'gtpj'"),
    ],
    ids=["runtime-typo", "family-typo"],
)
def test_a_bad_option_fails_before_anything_is_fetched(ftx_cli, ftx_home: Path, options: list[str], says: str) -> None:
    with LocalServer() as server:
        server.serve_bytes("/model.tar.gz", payload(4096))
        result = ftx_cli("run", server.url("/model.tar.gz"), *options)
        requests = server.seen()
    assert result.exit_code == 1, result.stdout
    assert says in result.stderr and "hint:" in result.stderr, result.stderr
    assert requests == [], [r.path for r in requests]  # not even a HEAD
    assert _store_files(ftx_home) == []


def test_tp_the_model_cannot_split_fails_before_a_local_checkpoint_is_read(
    ftx_cli, ftx_home: Path, tiny_gptj_dir: Path
) -> None:
    result = ftx_cli("run", str(tiny_gptj_dir), "--tp", "3", "--runtime", "python")
    assert result.exit_code == 1 and "hint:" in result.stderr, result.stderr
    assert "fetch" not in result.stderr.split("error:")[0]  # no stage ran before the refusal
    assert _store_files(ftx_home) == []
