"""config.ini of every family, written and read back, equals the snapshot taken from the families'
hand-written writers and readers (``tests/ftini_snapshot.json``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from ftini_cases import CASES, UPSTREAM, family_of, hf_config_of, snapshot, upstream_ini_text
from ftx.io.ftformat import read_ini, write_ini

SNAP = snapshot()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_config_ini_equals_the_snapshot(case, tmp_path: Path) -> None:
    family = family_of(case.family)
    hf_config = hf_config_of(case, family)
    path = tmp_path / "config.ini"
    write_ini(path, family.config_ini(family.spec(hf_config), hf_config, case.weight_dtype))
    assert path.read_text() == SNAP["ftx"][case.id]["config_ini"]
    assert family.hf_config_from_ini(read_ini(path)) == SNAP["ftx"][case.id]["hf_config"]


@pytest.mark.parametrize("case", sorted(UPSTREAM))
def test_upstream_config_ini_reads_like_the_snapshot(case: str, tmp_path: Path) -> None:
    family = family_of(UPSTREAM[case])
    path = tmp_path / "config.ini"
    path.write_text(upstream_ini_text(case))
    assert family.hf_config_from_ini(read_ini(path)) == SNAP["upstream"][case]
