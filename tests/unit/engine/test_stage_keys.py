"""Stage keys come from whole settings sections: any field, present or added later, changes its stage's key;
`ftx convert` and `ftx run --until convert` share one artifact."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from ftx_triton.plan.settings import FIELD_SECTION, SECTIONS, RepositorySettings, RunSettings, section_fingerprint
from ftx_triton.runtime.fastertransformer.docker.options import DockerSection


def _other_value(value: Any, annotation: str) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 2
    if "Path" in annotation:
        return Path("/nonexistent/other")
    if "tuple" in annotation and value == ():
        return ("X=1",)
    return f"{value}-other"


@pytest.mark.parametrize("field_name", sorted(FIELD_SECTION))
def test_every_field_of_every_section_changes_its_fingerprint(field_name: str) -> None:
    """Iterates the dataclass fields themselves, so a field added to a section is covered with no list to edit."""
    section_name = FIELD_SECTION[field_name]
    section = getattr(RunSettings.of("m"), section_name)
    f = next(f for f in dataclasses.fields(section) if f.name == field_name)
    changed = dataclasses.replace(section, **{field_name: _other_value(getattr(section, field_name), str(f.type))})
    assert section_fingerprint(changed) != section_fingerprint(section)


def test_a_field_added_to_a_section_changes_the_key_without_editing_a_list() -> None:
    extended = dataclasses.make_dataclass(
        "Extended", [("kv_cache_blocks", int, 64)], bases=(RepositorySettings,), frozen=True
    )
    assert section_fingerprint(extended()) != section_fingerprint(extended(kv_cache_blocks=128))
    assert "kv_cache_blocks" in section_fingerprint(extended())


def test_a_path_setting_is_keyed_by_content(tmp_path: Path) -> None:
    tok = tmp_path / "tokenizer"
    tok.mkdir()
    (tok / "tokenizer.json").write_text("{}")
    before = section_fingerprint(RunSettings.of("m", tokenizer=tok).configure)
    (tok / "tokenizer.json").write_text('{"edited": true}')
    assert section_fingerprint(RunSettings.of("m", tokenizer=tok).configure) != before


def test_flat_option_names_land_in_their_sections() -> None:
    s = RunSettings.of(
        "m",
        tp=2,
        max_batch_size=32,
        tune_batch=4,
        http_port=9000,
        image="i:1",
        revision="main",
        until="tune",
        force=["convert"],
    )
    assert (s.convert.tp, s.configure.max_batch_size, s.tune.tune_batch) == (2, 32, 4)
    assert (s.serve.http_port, s.options(DockerSection).image, s.fetch.revision) == (9000, "i:1", "main")
    assert s.until == "tune" and s.force == frozenset({"convert"})
    with pytest.raises(TypeError, match="unknown setting"):
        RunSettings.of("m", tensor_parallel=2)
    assert set(SECTIONS) == {"fetch", "convert", "tune", "configure", "serve"}  # a runtime's options are its own


def _events(stderr: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def test_convert_and_run_until_convert_share_one_artifact(
    ftx_cli: Any, ftx_home: Path, tiny_gptj_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "ft"
    first = ftx_cli("--log-format", "json", "convert", str(tiny_gptj_dir), "--tp", "2", "-o", str(out))
    assert first.exit_code == 0, first.stderr + repr(first.exception)
    placed = Path(first.stdout.strip())
    assert placed == out / "2-gpu" and (placed / "config.ini").is_file()
    second = ftx_cli("--log-format", "json", "run", str(tiny_gptj_dir), "--tp", "2", "--until", "convert")
    assert second.exit_code == 0, second.stderr
    hits = [e["stage"] for e in _events(second.stderr) if e["event"] == "cache.hit"]
    assert hits == ["fetch", "convert"]
    (artifact,) = (ftx_home / "store" / "convert").iterdir()
    assert Path(second.stdout.strip()) == artifact / "2-gpu"
    store_files = sorted(p.name for p in (artifact / "2-gpu").iterdir())
    placed_files = sorted(p.name for p in placed.iterdir() if p.name != "ftx-convert.json")
    assert store_files == placed_files
    for name in store_files:
        assert (artifact / "2-gpu" / name).read_bytes() == (placed / name).read_bytes()
