"""Runtimes are plugins: a third-party runtime is used by `ftx run --runtime NAME` with no core change,
``--runtime auto`` and aliases choose by availability and priority, and registration errors are clear."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from ftx_triton.cli.run import command_kit
from plugin_dists import make_dist

TOY_RUNTIME = '''
import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import click

import ftx_triton
from ftx_triton.commandkit import options_of
from ftx_triton.plan.artifacts import Endpoint, GemmConfig


@dataclass(frozen=True)
class AbacusOptions(ftx_triton.OptionSection):
    """The toy runtime's own options: `ftx run --wires 2 --beads 20`, `wires = 2` in ftx.toml."""

    title: ClassVar[str] = "Abacus runtime"
    wires: int = ftx_triton.option(1, help="Wires of the abacus (its tensor-parallel ranks under --tp auto).",
                                   kind=int, low=1, high=8, show_default=True)
    beads: int = ftx_triton.option(10, help="Beads per wire.", kind=int, low=1, high=1000, show_default=True)


class ToyHandle:
    """A served toy deployment (a ServedDeployment): it records how it was stopped or detached."""

    def __init__(self, record: Path) -> None:
        self.record = record
        self.name = "toy-1"
        self.stop_hint = "`toyctl down toy-1` stops it"
        self.log_path = None
        self.metrics_url = None
        self.pid = None

    def stop(self) -> None:
        self.record.write_text("stopped")

    def detach(self) -> None:
        self.record.write_text("detached")

    def wait(self, timeout=None):
        return 0

    def exit_report(self) -> str:
        return "the abacus stopped"


class Toy(ftx_triton.Runtime):
    name = "toy"
    selects_as = ("abacus",)
    priority = -1
    description = "a runtime from outside core, for tests"
    uses_gemm_config = True
    default_data_type = "fp32"
    option_sections = (AbacusOptions,)

    def layout(self, settings, family, hf_config):
        wires = settings.options(AbacusOptions).wires
        return ftx_triton.Layout(wires, 1, 1, f"tp {wires} (one rank per wire of the abacus)")

    def available(self, settings, store):
        with (store.home / "toy-probes").open("a") as probes:  # in the run's home: counted by a test
            probes.write("probed\\n")
        return ftx_triton.Availability(True, "the abacus is here")

    def describe(self, plan):
        return [f"toy       would serve {plan.family.name} at tp {plan.settings.convert.tp} on an abacus"]

    def tune_key(self, family, spec, settings):
        return {"device": "abacus"}

    def tune(self, family, spec, dest, ctx):
        (dest / "gemm_config.in").write_text("toy tuning\\n")
        return GemmConfig(dest / "gemm_config.in", True, "tuned on an abacus")

    def write_ft_model(self, model_dir, options, family):
        from ftx_triton.repository.writer import write_backend_ft_model

        backend = write_backend_ft_model(model_dir, options, family)
        (model_dir / "toy.txt").write_text("written by the toy runtime\\n")
        return backend

    def serve(self, repository, gemm, ctx):
        (ctx.home / "toy-served.json").write_text(json.dumps({
            "repository": str(repository.path), "runtime": repository.runtime, "gemm": str(gemm.path),
            "tuned": gemm.tuned, "namespace": ctx.settings.plugin_option("namespace"),
            "beads": ctx.settings.options(AbacusOptions).beads, "tp": ctx.settings.convert.tp,
            "store": str(ctx.store.home)}))
        return Endpoint("127.0.0.1:9", "127.0.0.1:10", model="ensemble", handle=ToyHandle(ctx.home / "toy-handle"))


@ftx_triton.hookimpl
def ftx_register_runtimes():
    return [Toy]


@ftx_triton.hookimpl
def ftx_add_options():
    return [click.Option(["--namespace"], default="default", show_default=True,
                         help="Abacus namespace the toy runtime serves in.")]


@ftx_triton.hookimpl
def ftx_register_commands(cli, kit):
    @cli.command("toyctl")
    @click.argument("what")
    @options_of(AbacusOptions, only=("beads",))
    def toyctl(what, beads):
        """Talk to the abacus."""
        settings = kit.settings("toy-model", beads=beads)
        click.echo(f"abacus says {what} with {settings.options(AbacusOptions).beads} beads")
'''


@pytest.fixture
def toy_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An installed-looking distribution `ftx-toy` registering the `toy` runtime (outside core)."""
    site = make_dist(tmp_path / "site", "ftx-toy", "ftx_toy", TOY_RUNTIME, entry_point="toy")
    monkeypatch.syspath_prepend(str(site))
    yield site
    sys.modules.pop("ftx_toy", None)


def test_a_third_party_runtime_serves_through_ftx_run(
    toy_plugin: Path, ftx_cli: Any, ftx_home: Path, tiny_gptj_dir: Path
) -> None:
    # --no-openai: a detached OpenAI front would outlive the test, as it outlives `ftx run` for a real server
    result = ftx_cli("run", str(tiny_gptj_dir), "--runtime", "toy", "--detach", "--no-openai")
    assert result.exit_code == 0, result.stderr + repr(result.exception)
    served = json.loads((ftx_home / "toy-served.json").read_text())
    repository = Path(served["repository"])
    assert served["runtime"] == "toy" and served["tuned"] is True
    assert Path(served["gemm"]).read_text() == "toy tuning\n"
    assert (repository / "fastertransformer" / "toy.txt").is_file()  # its contribution to the repository
    assert json.loads((repository / "ftx-deployment.json").read_text())["runtime"] == "toy"
    assert (ftx_home / "toy-handle").read_text() == "detached"
    assert served["namespace"] == "default" and served["store"] == str(ftx_home)  # the run's store, not its own
    assert "runtime   toy (requested with --runtime toy)" in result.stderr
    assert "toy runtime" in result.stdout and "toyctl down toy-1" in result.stdout


def test_a_third_party_runtime_adds_an_option_and_a_command(
    toy_plugin: Path, ftx_cli: Any, ftx_home: Path, tiny_gptj_dir: Path
) -> None:
    """`--namespace` (ftx_add_options) reaches the runtime through the settings; `ftx toyctl` (ftx_register_commands)
    is a command of ftx; both are listed in the help."""
    result = ftx_cli("run", str(tiny_gptj_dir), "--runtime", "toy", "--namespace", "team-a", "--detach", "--no-openai")
    assert result.exit_code == 0, result.stderr + repr(result.exception)
    assert json.loads((ftx_home / "toy-served.json").read_text())["namespace"] == "team-a"
    command = ftx_cli("toyctl", "hello")
    assert command.exit_code == 0 and command.stdout.strip() == "abacus says hello with 10 beads"
    help_text = ftx_cli("run", "--help").stdout
    assert "Plugin options" in help_text and "--namespace" in help_text and "FTX_RUN_NAMESPACE" in help_text
    assert "toyctl" in ftx_cli("--help").stdout


def test_a_third_party_runtime_declares_its_layout_options_and_command(
    toy_plugin: Path, ftx_cli: Any, ftx_home: Path, tiny_gptj_dir: Path, tmp_path: Path
) -> None:
    """The toy runtime's option section (`--wires`, `--beads`) is an option of `ftx run`, a setting of ftx.toml and a
    typed value in its stages; its `layout` decides `--tp auto` (two wires: tp 2); its command takes the section's
    options; and it serves through the same pipeline as core's launchers."""
    result = ftx_cli(
        "run", str(tiny_gptj_dir), "--runtime", "toy", "--wires", "2", "--beads", "20", "--detach", "--no-openai"
    )
    assert result.exit_code == 0, result.stderr + repr(result.exception)
    served = json.loads((ftx_home / "toy-served.json").read_text())
    assert (served["tp"], served["beads"]) == (2, 20)
    assert "place     --tp auto: tp 2 (one rank per wire of the abacus)" in result.stderr
    assert (Path(served["repository"]) / "fastertransformer" / "config.pbtxt").read_text().count("tensor_para_size")
    help_text = ftx_cli("run", "--help").stdout
    assert "Abacus runtime:" in help_text and "--wires" in help_text and "FTX_RUN_BEADS" in help_text
    assert "abacus says hi with 7 beads" in ftx_cli("toyctl", "hi", "--beads", "7").stdout
    refused = ftx_cli("run", str(tiny_gptj_dir), "--runtime", "toy", "--beads", "0", "--dry-run")
    assert refused.exit_code == 2 and "--beads" in refused.stderr  # the declared range, checked by click
    lock = tmp_path / "ftx.toml"
    lock.write_text(f'[model]\nsource = "{tiny_gptj_dir}"\n[settings]\nruntime = "toy"\nwires = 2\nbeads = 30\n')
    replay = ftx_cli("run", "--lock", str(lock), "--detach", "--no-openai")
    assert replay.exit_code == 0, replay.stderr + repr(replay.exception)
    assert json.loads((ftx_home / "toy-served.json").read_text())["beads"] == 30
    wrong = tmp_path / "wrong.toml"
    wrong.write_text(f'[model]\nsource = "{tiny_gptj_dir}"\n[settings]\nruntime = "toy"\nbeads = "many"\n')
    bad = ftx_cli("run", "--lock", str(wrong), "--dry-run")
    assert bad.exit_code == 1 and "beads must be an integer in 1-1000" in bad.stderr


def test_without_the_plugin_its_option_and_command_are_unknown(ftx_cli: Any, tiny_gptj_dir: Path) -> None:
    assert ftx_cli("run", str(tiny_gptj_dir), "--namespace", "x", "--dry-run").exit_code == 2
    assert ftx_cli("toyctl", "hello").exit_code == 2


def test_a_plugin_option_named_like_a_core_one_is_an_error() -> None:
    from types import SimpleNamespace

    import click
    from ftx_triton import hookimpl
    from ftx_triton.errors import PluginError
    from ftx_triton.plugins import PluginHost

    host = PluginHost()
    host.register(SimpleNamespace(ftx_add_options=hookimpl(lambda: [click.Option(["--tp"])]), __name__="clash"))
    with pytest.raises(PluginError, match="adds an option 'tp' to `ftx run`"):
        host.run_options(taken={"tp"})
    host.register(
        SimpleNamespace(
            ftx_register_commands=hookimpl(lambda cli: cli.add_command(click.Command("run"))), __name__="clash2"
        )
    )
    with pytest.raises(PluginError, match="command 'run' is added by both ftx core and clash2"):
        host.commands(command_kit(), taken={"run": None})


def test_core_runtimes_bring_their_own_commands(plugin_host: Any) -> None:
    """`ftx image`/`tune`/`package` and `ftx backend` are not core's commands: they come through the hook."""
    from ftx_triton.cli import cli

    commands = plugin_host.commands(command_kit())
    assert {"image", "tune", "package", "backend"} <= set(commands)
    assert not {"image", "tune", "package", "backend"} & set(cli.commands)


@pytest.mark.parametrize("dry_run", [False, True], ids=["run", "dry-run"])
def test_a_run_asks_whether_its_runtime_is_available_once(
    toy_plugin: Path, ftx_cli: Any, ftx_home: Path, tiny_gptj_dir: Path, dry_run: bool
) -> None:
    """The plan chooses the runtime once: one availability probe (for Docker, one daemon round trip) per run."""
    result = ftx_cli(
        "run", str(tiny_gptj_dir), "--runtime", "abacus", "--until", "configure", *(["--dry-run"] if dry_run else [])
    )
    assert result.exit_code == 0, result.stderr + repr(result.exception)
    assert "runtime   toy (requested with --runtime abacus)" in result.stdout + result.stderr
    assert (ftx_home / "toy-probes").read_text().splitlines() == ["probed"]


@pytest.mark.parametrize(
    ("named", "probed"),
    [
        (["--tp", "1", "--weight-dtype", "fp16"], False),  # `ftx convert`'s case: the files are the same on any runtime
        (["--tp", "1"], True),  # --weight-dtype auto: the runtime may convert to its compute type
        (["--weight-dtype", "fp16"], True),  # --tp auto: the runtime lays the model out
    ],
    ids=["both-named", "dtype-auto", "tp-auto"],
)
def test_a_conversion_probes_for_a_runtime_only_where_the_runtime_decides_its_files(
    toy_plugin: Path, ftx_cli: Any, ftx_home: Path, tiny_gptj_dir: Path, named: list[str], probed: bool
) -> None:
    """A run that stops at convert with its weight dtype and tp named does not ask any runtime whether it can serve
    here (on a GPU host: nvidia-smi, Docker's daemon, compilers); where a runtime decides either, it is chosen."""
    result = ftx_cli("run", str(tiny_gptj_dir), "--runtime", "abacus", "--until", "convert", *named)  # an alias: probed
    assert result.exit_code == 0, result.stderr + repr(result.exception)
    assert (ftx_home / "toy-probes").exists() is probed
    assert ("runtime   toy" in result.stderr) is probed


def test_a_third_party_runtime_describes_its_dry_run(toy_plugin: Path, ftx_cli: Any, tiny_gptj_dir: Path) -> None:
    result = ftx_cli("run", str(tiny_gptj_dir), "--runtime", "toy", "--tp", "2", "--dry-run")
    assert result.exit_code == 0, result.stderr
    assert "toy       would serve gptj at tp 2 on an abacus" in result.stdout


def test_ftx_plugins_lists_the_runtime_and_its_owner(toy_plugin: Path, ftx_cli: Any) -> None:
    result = ftx_cli("plugins", "--json")
    assert result.exit_code == 0, result.stderr
    records = {r["name"]: r for r in json.loads(result.stdout)}
    assert records["toy"]["runtimes"] == ["toy"]
    table = ftx_cli("plugins")
    assert "ftx-toy" in table.stdout and "for tests" in table.stdout  # the runtimes table (rich wraps cells)


def test_unknown_runtime_lists_the_registered_ones(ftx_cli: Any, tiny_gptj_dir: Path) -> None:
    result = ftx_cli("run", str(tiny_gptj_dir), "--runtime", "kubernetes", "--until", "tune")
    assert result.exit_code == 1
    assert "unknown runtime 'kubernetes'" in result.stderr
    assert "python" in result.stderr and "fastertransformer" in result.stderr


# --------------------------------------------------------------------------- choosing


STORE: Any = None
"""The fakes below answer `available` without looking at a store."""


def _runtime(name: str, priority: int, ok: bool, aliases: tuple[str, ...] = ()) -> Any:
    from ftx_triton.runtime.api import Availability, Runtime

    class Fake(Runtime):
        def available(self, settings: Any, store: Any) -> Availability:
            return Availability(ok, f"{name} {'is here' if ok else 'is missing'}")

    Fake.name, Fake.priority, Fake.selects_as = name, priority, aliases
    return Fake()


def test_auto_takes_the_available_runtime_of_highest_priority() -> None:
    """Fakes that only answer `available` (no serving involved): the choice itself is what is tested."""
    from ftx_triton.plan.settings import RunSettings
    from ftx_triton.runtime.select import choose_runtime

    runtimes = {
        r.name: r for r in (_runtime("a", 30, False, ("x",)), _runtime("b", 20, True, ("x",)), _runtime("c", 10, True))
    }
    chosen, why = choose_runtime(runtimes, RunSettings.of("m"), STORE)
    assert chosen.name == "b" and "a: a is missing" in why and "b is here" in why
    chosen, why = choose_runtime(runtimes, RunSettings.of("m", runtime="x"), STORE)
    assert chosen.name == "b" and "requested with --runtime x" in why
    chosen, _ = choose_runtime(runtimes, RunSettings.of("m", runtime="c"), STORE)
    assert chosen.name == "c"


def test_an_alias_with_nothing_available_plans_for_its_best_runtime() -> None:
    from ftx_triton.plan.settings import RunSettings
    from ftx_triton.runtime.select import choose_runtime

    runtimes = {r.name: r for r in (_runtime("a", 30, False, ("x",)), _runtime("b", 20, False, ("x",)))}
    chosen, why = choose_runtime(runtimes, RunSettings.of("m", runtime="x"), STORE)
    assert chosen.name == "a" and "a is missing" in why and "b is missing" in why


def test_auto_with_nothing_available_is_an_error() -> None:
    from ftx_triton.errors import ConfigError
    from ftx_triton.plan.settings import RunSettings
    from ftx_triton.runtime.select import choose_runtime

    with pytest.raises(ConfigError, match="no runtime can serve"):
        choose_runtime({"a": _runtime("a", 1, False)}, RunSettings.of("m"), STORE)


def test_two_plugins_registering_one_runtime_name_is_an_error() -> None:
    from types import SimpleNamespace

    from ftx_triton import hookimpl
    from ftx_triton.errors import PluginError
    from ftx_triton.plugins import PluginHost
    from ftx_triton.runtime.python.plugin import PythonRuntime

    class Again(PythonRuntime):
        pass

    host = PluginHost()
    host.register(SimpleNamespace(ftx_register_runtimes=hookimpl(lambda: [Again]), __name__="again"))
    with pytest.raises(PluginError, match="runtime 'python' is registered by both"):
        host.collect_runtimes()


def test_core_registers_its_runtimes_through_the_hook(plugin_host: Any) -> None:
    assert plugin_host.runtime_owner["python"] == "ftx_triton.runtime.python.plugin"
    assert plugin_host.runtime_owner["fastertransformer-docker"] == "ftx_triton.runtime.fastertransformer.docker.plugin"
