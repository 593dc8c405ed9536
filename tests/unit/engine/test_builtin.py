"""Built-in models are declared by their family (``Preset(builtin=BuiltinModel(...))``); core only builds them once
per FTX_HOME and publishes them (engine/builtin.py). The build functions here are toys that write a file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ftx_triton.conversion.family import BuiltinModel
from ftx_triton.engine.builtin import MARKER, builtin_dir, builtin_model, ensure_builtin
from ftx_triton.errors import SourceError


def _toy(calls: list[Path], recipe: dict[str, int], version: int = 1) -> BuiltinModel:
    def build(dest: Path) -> dict[str, object]:
        calls.append(dest)
        (dest / "config.json").write_text(json.dumps({"model_type": "toy", **recipe}))
        return {"final_loss": 0.5}

    return BuiltinModel(build, recipe, version=version, about="a toy")


def test_a_builtin_model_is_built_once_and_rebuilt_when_its_recipe_changes(tmp_path: Path) -> None:
    calls: list[Path] = []
    first = ensure_builtin(tmp_path, "toy", _toy(calls, {"layers": 1}))
    assert first == builtin_dir(tmp_path, "toy") and (first / "config.json").is_file()
    marker = json.loads((first / MARKER).read_text())
    assert marker["name"] == "toy" and marker["recipe"] == {"layers": 1} and marker["final_loss"] == 0.5
    assert set(marker["files"]) == {"config.json"}
    assert ensure_builtin(tmp_path, "toy", _toy(calls, {"layers": 1})) == first and len(calls) == 1
    ensure_builtin(tmp_path, "toy", _toy(calls, {"layers": 2}))
    ensure_builtin(tmp_path, "toy", _toy(calls, {"layers": 2}, version=2))
    assert len(calls) == 3 and json.loads((first / "config.json").read_text())["layers"] == 2
    assert sorted(p.name for p in (tmp_path / "builtin").iterdir()) == [".toy.lock", "toy"]  # no build left beside it


def test_a_builtin_model_comes_from_the_family_that_declares_it(plugin_host) -> None:
    from ftx_gptj.tiny import DEMO

    assert builtin_model(plugin_host, "tiny-gptj") is DEMO
    for name in ("tiny-gpt2", "gptj"):  # unknown, and a preset that is not built in
        with pytest.raises(SourceError, match=f"unknown built-in model '{name}'") as err:
            builtin_model(plugin_host, name)
        assert "tiny-gptj" in (err.value.hint or "")
