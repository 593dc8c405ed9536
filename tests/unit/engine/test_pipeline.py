"""The stage pipeline and artifact store: keys, cache hits, --force, atomic publish under SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from cli_helpers import events, run_until_configure
from plugin_dists import make_dist


def test_second_run_converts_nothing(ftx_cli, ftx_home: Path, tiny_gptj_dir: Path) -> None:
    first = run_until_configure(ftx_cli, tiny_gptj_dir)
    finished = [e["stage"] for e in events(first.stderr) if e["event"] == "stage.finished"]
    assert finished == ["fetch", "convert", "tune", "configure"]
    repo = Path(first.stdout.strip())
    assert (repo / "fastertransformer" / "config.pbtxt").is_file()

    second = run_until_configure(ftx_cli, tiny_gptj_dir)
    evs = events(second.stderr)
    assert [e["stage"] for e in evs if e["event"] == "cache.hit"] == ["fetch", "convert", "tune", "configure"]
    assert not [e for e in evs if e["event"] in ("stage.finished", "conversion.finished")]
    assert second.stdout.strip() == str(repo)


def test_force_redoes_one_stage(ftx_cli, tiny_gptj_dir: Path) -> None:
    run_until_configure(ftx_cli, tiny_gptj_dir)
    again = run_until_configure(ftx_cli, tiny_gptj_dir, "--force", "convert")
    evs = events(again.stderr)
    assert [e["stage"] for e in evs if e["event"] == "stage.finished"] == ["convert"]
    assert [e["stage"] for e in evs if e["event"] == "cache.hit"] == ["fetch", "tune", "configure"]


def test_provenance_records_inputs_producer_and_hashes(ftx_cli, ftx_home: Path, tiny_gptj_dir: Path) -> None:
    run_until_configure(ftx_cli, tiny_gptj_dir)
    (convert_dir,) = (ftx_home / "store" / "convert").iterdir()
    meta = json.loads((convert_dir / "ftx-artifact.json").read_text())
    assert meta["stage"] == "convert" and meta["key"] == convert_dir.name
    assert meta["inputs"]["settings"]["tp"] == 1 and meta["inputs"]["family"] == "gptj"
    assert meta["producer"]["family"]["distribution"] == "ftx-triton-gptj"
    assert meta["producer"]["family"]["version"] == "0.1.0"
    assert "1-gpu/model.wte.bin" in meta["outputs"]
    (fetch_dir,) = (ftx_home / "store" / "fetch").iterdir()
    fetch_meta = json.loads((fetch_dir / "ftx-artifact.json").read_text())
    assert fetch_meta["result"]["path"] == str(tiny_gptj_dir)


def test_key_changes_with_what_determines_the_output(ftx_cli, ftx_home: Path, tiny_gptj_dir: Path) -> None:
    run_until_configure(ftx_cli, tiny_gptj_dir)
    run_until_configure(ftx_cli, tiny_gptj_dir, "--tp", "2")
    run_until_configure(ftx_cli, tiny_gptj_dir, "--weight-dtype", "fp16")
    converts = sorted(p.name for p in (ftx_home / "store" / "convert").iterdir())
    assert len(converts) == 3
    assert len(list((ftx_home / "store" / "fetch").iterdir())) == 1


HANG_IN_CONVERT = """
import os, time
from pathlib import Path
from ftx_triton import hookimpl
from ftx_triton.conversion.convert import convert_checkpoint

@hookimpl(tryfirst=True)
def ftx_convert(family, source, spec, dest, ctx):
    reader = family.open_weights(source.path)
    calls = []
    def progress(done, total):
        calls.append(done)
        if len(calls) == 3:  # part of the files are on disk: signal and wait to be killed
            signal = Path(os.environ["FTX_TEST_SIGNAL"])
            signal.with_suffix(".tmp").write_text(str(dest))
            signal.with_suffix(".tmp").rename(signal)  # whole when it appears: the test reads it at once
            time.sleep(600)
    convert_checkpoint(family, reader, family.read_hf_config(source.path), spec, dest,
                       tp=ctx.settings.convert.tp, weight_dtype=ctx.settings.convert.weight_dtype, progress=progress)
"""


def test_sigkill_during_convert_leaves_nothing_trusted(ftx_home: Path, tiny_gptj_dir: Path, tmp_path: Path) -> None:
    site = make_dist(tmp_path / "site", "ftx-hang", "ftx_hang", HANG_IN_CONVERT)
    signal_file = tmp_path / "in-convert"
    env = {**os.environ, "FTX_HOME": str(ftx_home), "FTX_TEST_SIGNAL": str(signal_file), "PYTHONPATH": str(site)}
    cmd = [sys.executable, "-m", "ftx_triton", "run", str(tiny_gptj_dir), "--until", "convert", "--log-format", "json"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 60
        while not signal_file.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.time() < deadline
            time.sleep(0.05)
        partial = Path(signal_file.read_text())
        assert any(partial.rglob("*.bin")), "the killed run had written some files"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        proc.kill()
    assert not (ftx_home / "store" / "convert").exists() or not any((ftx_home / "store" / "convert").iterdir())

    env.pop("PYTHONPATH")
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    evs = events(again.stderr)
    assert {"event": "stage.finished", "stage": "convert"}.items() <= next(
        e for e in evs if e.get("stage") == "convert" and e["event"] == "stage.finished"
    ).items()
    assert any(e["event"] == "cache.stale_removed" for e in evs)
    assert not partial.exists()
    assert Path(again.stdout.strip(), "config.ini").is_file()


def test_configure_writes_a_config_pbtxt_that_parses_through_the_triton_schema(ftx_cli, tiny_gptj_dir: Path) -> None:
    from ftx_triton.repository.model_config import parse_config
    from tritonclient.grpc import model_config_pb2 as mc

    repo = Path(run_until_configure(ftx_cli, tiny_gptj_dir, "--tp", "2").stdout.strip())
    config = parse_config(repo / "fastertransformer" / "config.pbtxt")
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert params["model_type"] == "GPT-J"
    assert params["tensor_para_size"] == "2" and params["pipeline_para_size"] == "1"
    assert params["model_checkpoint_path"].endswith("/2-gpu")
    assert Path(params["model_checkpoint_path"], "config.ini").is_file()
    assert [g.kind for g in config.instance_group] == [mc.ModelInstanceGroup.Kind.KIND_CPU]
    names = {i.name: mc.DataType.Name(i.data_type) for i in config.input}
    assert names["input_ids"] == "TYPE_UINT32" and names["request_output_len"] == "TYPE_UINT32"
    assert {o.name for o in config.output} >= {"output_ids", "sequence_length"}
