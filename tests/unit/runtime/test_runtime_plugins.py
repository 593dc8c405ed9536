"""Runtimes are plugins: a third-party runtime is used by `ftx run --runtime NAME` with no core change,
``--runtime auto`` and aliases choose by availability and priority, and registration errors are clear."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from plugin_dists import make_dist

TOY_RUNTIME = '''
import json
from pathlib import Path

import ftx_triton
from ftx_triton.plan.artifacts import Endpoint, GemmConfig


class ToyHandle:
    """What a served toy deployment hands back: it records how it was stopped or detached."""

    def __init__(self, record: Path) -> None:
        self.record = record
        self.name = "toy-1"
        self.stop_hint = "`toyctl down toy-1` stops it"

    def stop(self) -> None:
        self.record.write_text("stopped")

    def detach(self) -> None:
        self.record.write_text("detached")


class Toy(ftx_triton.Runtime):
    name = "toy"
    priority = -1
    description = "a runtime from outside core, for tests"
    uses_gemm_config = True
    default_data_type = "fp32"

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
            "tuned": gemm.tuned}))
        return Endpoint("127.0.0.1:9", "127.0.0.1:10", model="ensemble", handle=ToyHandle(ctx.home / "toy-handle"))


@ftx_triton.hookimpl
def ftx_register_runtimes():
    return [Toy]
'''


@pytest.fixture
def toy_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An installed-looking distribution `ftx-toy` registering the `toy` runtime (outside core)."""
    site = make_dist(tmp_path / "site", "ftx-toy", "ftx_toy", TOY_RUNTIME, entry_point="toy")
    monkeypatch.syspath_prepend(str(site))
    yield site
    sys.modules.pop("ftx_toy", None)


def test_a_third_party_runtime_serves_through_ftx_run(toy_plugin: Path, ftx_cli: Any, ftx_home: Path,
                                                      tiny_gptj_dir: Path) -> None:
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
    assert "runtime   toy (requested with --runtime toy)" in result.stderr
    assert "toy runtime" in result.stdout and "toyctl down toy-1" in result.stdout


def test_a_third_party_runtime_describes_its_dry_run(toy_plugin: Path, ftx_cli: Any, tiny_gptj_dir: Path) -> None:
    result = ftx_cli("run", str(tiny_gptj_dir), "--runtime", "toy", "--tp", "2", "--dry-run")
    assert result.exit_code == 0, result.stderr
    assert "toy       would serve gptj at tp 2 on an abacus" in result.stderr


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


def _runtime(name: str, priority: int, ok: bool, aliases: tuple[str, ...] = ()) -> Any:
    from ftx_triton.runtime.api import Availability, Runtime

    class Fake(Runtime):
        def available(self, settings: Any) -> Availability:
            return Availability(ok, f"{name} {'is here' if ok else 'is missing'}")

    Fake.name, Fake.priority, Fake.selects_as = name, priority, aliases
    return Fake()


def test_auto_takes_the_available_runtime_of_highest_priority() -> None:
    """Fakes that only answer `available` (no serving involved): the choice itself is what is tested."""
    from ftx_triton.plan.settings import RunSettings
    from ftx_triton.runtime.select import choose_runtime

    runtimes = {r.name: r for r in (_runtime("a", 30, False, ("x",)), _runtime("b", 20, True, ("x",)),
                                    _runtime("c", 10, True))}
    chosen, why = choose_runtime(runtimes, RunSettings.of("m"))
    assert chosen.name == "b" and "a: a is missing" in why and "b is here" in why
    chosen, why = choose_runtime(runtimes, RunSettings.of("m", runtime="x"))
    assert chosen.name == "b" and "requested with --runtime x" in why
    chosen, _ = choose_runtime(runtimes, RunSettings.of("m", runtime="c"))
    assert chosen.name == "c"


def test_an_alias_with_nothing_available_plans_for_its_best_runtime() -> None:
    from ftx_triton.plan.settings import RunSettings
    from ftx_triton.runtime.select import choose_runtime

    runtimes = {r.name: r for r in (_runtime("a", 30, False, ("x",)), _runtime("b", 20, False, ("x",)))}
    chosen, why = choose_runtime(runtimes, RunSettings.of("m", runtime="x"))
    assert chosen.name == "a" and "a is missing" in why and "b is missing" in why


def test_auto_with_nothing_available_is_an_error() -> None:
    from ftx_triton.errors import ConfigError
    from ftx_triton.plan.settings import RunSettings
    from ftx_triton.runtime.select import choose_runtime

    with pytest.raises(ConfigError, match="no runtime can serve"):
        choose_runtime({"a": _runtime("a", 1, False)}, RunSettings.of("m"))


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
