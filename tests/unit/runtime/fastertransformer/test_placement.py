"""--tp auto's planner, given a GPU inventory (no GPU needed): the smallest tp x pp that fits, instances
on the GPUs left, and a clear error for a model that fits nowhere."""

from __future__ import annotations

import pytest
from ftx_gptj.family import GPTJ_6B_CONFIG
from ftx_triton.errors import ConfigError
from ftx_triton.runtime.fastertransformer.placement import Footprint, GiB, layouts, plan_placement

H100 = 80 * GiB  # 81559 MiB as nvidia-smi shows it is a little under; 80 GiB keeps the arithmetic plain
# published shapes, fp16: parameters x 2 bytes; KV width = heads x head size
GPTJ_6B = Footprint(weight_bytes=6_050_000_000 * 2, layers=28, kv_width=4096, tp_divides=(16, 16384))
NEOX_20B = Footprint(weight_bytes=20_550_000_000 * 2, layers=44, kv_width=6144, tp_divides=(64, 24576))


def test_a_6b_model_takes_one_gpu_and_the_second_holds_another_instance() -> None:
    plan = plan_placement(GPTJ_6B, [H100, H100], batch=8, seq_len=2048)
    assert (plan.tp, plan.pp, plan.instances) == (1, 1, 2)
    assert "tp 1 x pp 1" in plan.reason and "2 instances fill the 2 GPUs" in plan.reason


def test_gpt_neox_20b_fits_one_h100_at_a_small_batch_and_needs_two_at_a_large_one() -> None:
    one = plan_placement(NEOX_20B, [H100], batch=1, seq_len=2048)
    assert (one.tp, one.pp, one.instances) == (1, 1, 1)
    two = plan_placement(NEOX_20B, [H100, H100], batch=24, seq_len=2048)
    assert (two.tp, two.pp, two.instances) == (2, 1, 1)
    assert "tp 1 x pp 1 would need" in two.reason  # says why the smaller layout was not taken
    with pytest.raises(ConfigError, match="does not fit the 1 GPU.*even at tp 1 x pp 1") as err:
        plan_placement(NEOX_20B, [H100], batch=24, seq_len=2048, model="GPT-NeoX-20B")
    assert "GPT-NeoX-20B" in str(err.value) and "--hosts" in (err.value.hint or "")


def test_a_pp_or_instance_count_the_user_gave_is_kept() -> None:
    """--pp 2 with auto: only tp is chosen; --instances 2: each instance gets its share of the GPUs."""
    plan = plan_placement(NEOX_20B, [H100, H100], batch=24, seq_len=2048, pp=2)
    assert (plan.tp, plan.pp, plan.instances) == (1, 2, 1)
    plan = plan_placement(GPTJ_6B, [H100] * 4, batch=8, seq_len=2048, instances=2)
    assert (plan.tp, plan.pp, plan.instances) == (1, 1, 2) and "--instances 2 as given" in plan.reason
    with pytest.raises(ConfigError, match="does not fit the 2 GPU.* with --instances 2") as err:
        plan_placement(NEOX_20B, [H100, H100], batch=24, seq_len=2048, instances=2)
    assert "fewer than --instances 2" in (err.value.hint or "")


def test_the_smallest_gpu_decides_and_no_gpu_is_an_error() -> None:
    assert plan_placement(GPTJ_6B, [H100, 16 * GiB], batch=8, seq_len=2048).tp == 2
    # a tp 2 model on four GPUs: one instance (two would share its GPUs: refused at serve, see node_layout)
    wide = plan_placement(NEOX_20B, [H100] * 4, batch=24, seq_len=2048)
    assert (wide.tp, wide.instances) == (2, 1) and "instances fill" not in wide.reason
    with pytest.raises(ConfigError, match="no GPU found"):
        plan_placement(GPTJ_6B, [], batch=1, seq_len=128)


def test_layouts_respect_what_tp_and_pp_must_divide() -> None:
    six_heads = Footprint(weight_bytes=1, layers=10, kv_width=768, tp_divides=(6, 3072))
    assert layouts(six_heads, 4) == [(1, 1), (2, 1), (1, 2), (3, 1), (2, 2)]  # no tp 4 (6 heads), no pp 4, pp 3
    big = Footprint(weight_bytes=150 * GiB, layers=10, kv_width=768, tp_divides=(6, 3072))
    plan = plan_placement(big, [H100] * 4, batch=1, seq_len=128)
    assert (plan.tp, plan.pp, plan.instances) == (3, 1, 1)  # world 2 would need 77.5 GiB a GPU


def test_footprint_of_gpt_j_6b_from_its_published_config() -> None:
    """Parameters come from the family's own table on config.json alone (no weights)."""
    from ftx_triton.plugins import load_host
    from ftx_triton.runtime.fastertransformer.placement import footprint_of

    family = load_host().family("gptj")
    fp = footprint_of(family, family.spec(GPTJ_6B_CONFIG), "fp16")
    assert 6.0e9 * 2 < fp.weight_bytes < 6.2e9 * 2 and fp.layers == 28 and fp.kv_width == 4096
    assert 16 in fp.tp_divides
    assert plan_placement(fp, [H100, H100], batch=8, seq_len=2048).instances == 2


class _Runtime:
    """Stands in for a FasterTransformer runtime (none can run without a GPU); only its name and compute
    type matter to the planner."""

    name = "fastertransformer-native"
    default_data_type = "fp16"


def _gptj_config(layers: int = 28) -> dict:
    """GPT-J 6B's config.json with ``layers`` layers."""
    return {**GPTJ_6B_CONFIG, "n_layer": layers}


def test_auto_layout_for_a_fastertransformer_runtime_uses_the_gpus_given() -> None:
    from ftx_triton.plan.settings import RunSettings
    from ftx_triton.plugins import load_host
    from ftx_triton.runtime.fastertransformer.gpus import Gpu
    from ftx_triton.runtime.fastertransformer.placement import auto_layout

    family = load_host().family("gptj")
    h100s = [Gpu(i, "NVIDIA H100 80GB HBM3", (9, 0), memory_mib=81559) for i in range(2)]
    auto = RunSettings.of("gptj-6b", tp="auto")
    layout = auto_layout(auto, family, _gptj_config(), _Runtime(), gpus=h100s)
    assert (layout.tp, layout.pp, layout.instances) == (1, 1, 2) and layout.reason.startswith("tp 1 x pp 1")
    only_one = RunSettings.of("gptj-6b", tp="auto", gpus="1")  # --gpus narrows what the planner fills
    layout = auto_layout(only_one, family, _gptj_config(), _Runtime(), gpus=h100s)
    assert (layout.tp, layout.pp, layout.instances) == (1, 1, 1), layout.reason
    small = [Gpu(i, "NVIDIA T4", (7, 5), memory_mib=15360) for i in range(4)]
    layout = auto_layout(auto, family, _gptj_config(), _Runtime(), gpus=small)
    assert (layout.tp, layout.pp, layout.instances) == (2, 1, 1)  # one tp 2 instance: a second would share its GPUs
    with pytest.raises(ConfigError, match="gptj-6b does not fit the 1 GPU"):
        auto_layout(auto, family, _gptj_config(), _Runtime(), gpus=small[:1])
    with pytest.raises(ConfigError, match="a --hosts layout needs --tp and --pp"):
        auto_layout(auto.replace(hosts="hosts.txt"), family, _gptj_config(), _Runtime(), gpus=h100s)


def test_tp_auto_on_the_command_line_says_what_it_chose(ftx_cli, tiny_gptj_dir) -> None:
    """``ftx run --tp auto --dry-run`` on a CPU machine: the python runtime, so tp 1, and the line says why."""
    result = ftx_cli("run", str(tiny_gptj_dir), "--tp", "auto", "--runtime", "python", "--dry-run")
    assert result.exit_code == 0, result.stderr + repr(result.exception)
    assert "place     --tp auto: tp 1 (the python runtime runs on one device)" in result.stdout
    assert "tp=1" in result.stdout
    bad = ftx_cli("run", str(tiny_gptj_dir), "--tp", "many", "--dry-run")
    assert bad.exit_code != 0 and "many" in bad.stderr


def test_a_named_runtime_that_cannot_serve_here_is_refused_before_converting(ftx_cli, tiny_gptj_dir, ftx_home) -> None:
    """No GPU here: --runtime fastertransformer-native with --tp 4 stops at once with the runtime's reason,
    and nothing was converted (before the check, the convert stage ran first and the failure came at tune)."""
    result = ftx_cli("run", str(tiny_gptj_dir), "--runtime", "fastertransformer-native", "--tp", "4")
    assert result.exit_code != 0
    assert "error: the fastertransformer-native runtime cannot serve here: no NVIDIA GPU" in result.stderr, (
        result.stderr
    )
    assert "hint: lower --tp/--pp" in result.stderr
    assert not list((ftx_home / "store" / "convert").glob("*/*-gpu"))


def test_a_hosts_file_naming_an_unreachable_machine_is_refused_before_converting(
    ftx_cli, tiny_gptj_dir, ftx_home, tmp_path
) -> None:
    """A name under .invalid never resolves (RFC 2606): the error names it within seconds, nothing converted."""
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost\nnode-b.invalid\n")
    result = ftx_cli(
        "run", str(tiny_gptj_dir), "--runtime", "fastertransformer-native", "--tp", "2", "--hosts", str(hosts)
    )
    assert result.exit_code != 0
    assert "error: the hosts file names node-b.invalid, which cannot be reached on ssh port 22" in result.stderr
    assert not list((ftx_home / "store" / "convert").glob("*/*-gpu"))


# --------------------------------------------------------------------------- --tp auto as ftx run's default

H100_GPU = ("NVIDIA H100 80GB HBM3", (9, 0))


@pytest.fixture()
def gpus_seen(monkeypatch: pytest.MonkeyPatch):
    """Sets the GPUs ftx sees (a stand-in inventory: this machine has none); the planner and the native
    runtime's host probe both read it."""
    from ftx_triton.runtime.fastertransformer import gpus as gpus_module
    from ftx_triton.runtime.fastertransformer.gpus import Gpu
    from ftx_triton.runtime.fastertransformer.native import toolchain

    def see(count: int, memory_mib: int = 81559) -> None:
        found = tuple(Gpu(i, H100_GPU[0], H100_GPU[1], memory_mib=memory_mib) for i in range(count))
        monkeypatch.setattr(gpus_module, "local_gpus", lambda: found)
        monkeypatch.setattr(toolchain, "local_gpus", lambda: found)

    return see


def test_tp_auto_is_ftx_runs_default_and_cpu_runs_keep_tp_1(ftx_cli, tiny_gptj_dir) -> None:
    """No --tp on a machine without GPUs: the python runtime at tp 1, as before auto became the default."""
    result = ftx_cli("run", str(tiny_gptj_dir), "--dry-run")
    assert result.exit_code == 0, result.stderr + repr(result.exception)
    assert "place     --tp auto: tp 1 (the python runtime runs on one device)" in result.stdout
    assert "tp=1" in result.stdout
    explicit = ftx_cli("run", str(tiny_gptj_dir), "--tp", "1", "--dry-run")
    assert explicit.exit_code == 0 and "place " not in explicit.stdout  # an explicit tp is taken as given


def test_default_run_plans_gpt_neox_20b_over_the_gpus_it_sees(ftx_cli, gpus_seen, monkeypatch) -> None:
    """The gpt-neox-20b preset's published configuration (known without a download) on the
    FasterTransformer runtime: 41 GiB of fp16 weights and 17.2 GiB of KV cache (--tune-batch 8 x 2048
    tokens) fit one H100 at tp 1; at --tune-batch 24 they need tp 2, which two H100s give."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    base = ("run", "gpt-neox-20b", "--runtime", "fastertransformer-native", "--dry-run")
    gpus_seen(1)
    one = ftx_cli(*base)
    assert one.exit_code == 0, one.stderr + repr(one.exception)
    assert "place     --tp auto: tp 1 x pp 1: " in one.stdout and "batch 8 x 2048 tokens" in one.stdout
    gpus_seen(2)
    two = ftx_cli(*base, "--tune-batch", "24")
    assert two.exit_code == 0, two.stderr + repr(two.exception)
    assert "place     --tp auto: tp 2 x pp 1: " in two.stdout and "tp 1 x pp 1 would need" in two.stdout
    assert "tp=2" in two.stdout


def test_a_model_that_fits_no_layout_is_refused_before_any_download(ftx_cli, gpus_seen, ftx_home, monkeypatch) -> None:
    """GPT-NeoX-20B at --tune-batch 24 on one H100: an error naming the sizes and a hint, before the
    fetch stage (nothing in the store, no Hugging Face cache created)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(ftx_home / "hf"))
    gpus_seen(1)
    result = ftx_cli("run", "gpt-neox-20b", "--runtime", "fastertransformer-native", "--tune-batch", "24")
    assert result.exit_code != 0
    assert "error: gpt-neox-20b does not fit the 1 GPU(s) here" in result.stderr, result.stderr
    assert "hint: use more GPUs" in result.stderr
    assert not (ftx_home / "hf").exists()
    assert not list((ftx_home / "store").glob("fetch/*"))


@pytest.mark.parametrize("runtime", ["fastertransformer-native", "fastertransformer-docker"])
def test_fewer_gpus_than_an_explicit_tp_is_refused_before_converting(
    ftx_cli, gpus_seen, tiny_gptj_dir, ftx_home, runtime: str
) -> None:
    """One GPU seen, --tp 2 asked: the runtime's reason at once, nothing converted (the Docker runtime
    found out at its tune stage, after the conversion)."""
    gpus_seen(1)
    result = ftx_cli("run", str(tiny_gptj_dir), "--runtime", runtime, "--tp", "2")
    assert result.exit_code != 0
    assert "tp x pp needs 2 GPUs but this machine has 1" in result.stderr, result.stderr
    assert not list((ftx_home / "store" / "convert").glob("*/*-gpu"))


def test_tp_auto_with_a_hosts_file_asks_for_the_layout(ftx_cli, gpus_seen, tiny_gptj_dir, tmp_path) -> None:
    """--hosts spans machines the planner cannot see: the default auto asks for --tp and --pp."""
    gpus_seen(2)
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost\nlocalhost\n")
    result = ftx_cli("run", str(tiny_gptj_dir), "--runtime", "fastertransformer-native", "--hosts", str(hosts))
    assert result.exit_code != 0
    assert "a --hosts layout needs --tp and --pp" in result.stderr and "hint: give --tp" in result.stderr


def test_ftx_lock_records_tp_auto_and_a_replay_takes_it(ftx_cli, tiny_gptj_dir, tmp_path, monkeypatch) -> None:
    """The default is written as tp = "auto" (a lock written on one machine plans on the one replaying it)."""
    lock = tmp_path / "ftx.toml"
    written = ftx_cli("lock", str(tiny_gptj_dir), "--runtime", "python", "-o", str(lock))
    assert written.exit_code == 0, written.stderr + repr(written.exception)
    assert 'tp = "auto"' in lock.read_text()
    monkeypatch.chdir(tmp_path)
    replay = ftx_cli("run", "--dry-run")
    assert replay.exit_code == 0, replay.stderr + repr(replay.exception)
    assert "place     --tp auto: tp 1 (the python runtime runs on one device)" in replay.stdout


def test_the_docker_launcher_refuses_a_hosts_file_naming_a_machine_without_an_address(
    ftx_cli, tiny_gptj_dir, ftx_home, tmp_path
) -> None:
    """A name under .invalid never resolves (RFC 2606): the Docker launcher's error names it before
    anything is converted (it failed only when mpirun in the container tried it, after the conversion)."""
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost\nnode-b.invalid\n")
    result = ftx_cli(
        "run", str(tiny_gptj_dir), "--runtime", "fastertransformer-docker", "--tp", "2", "--hosts", str(hosts)
    )
    assert result.exit_code != 0
    assert "error: the hosts file names node-b.invalid, which does not resolve to an address" in result.stderr, (
        result.stderr
    )
    assert "hint: check the name" in result.stderr
    assert not list((ftx_home / "store" / "convert").glob("*/*-gpu"))
