"""The plugin host: entry-point discovery, broken-plugin records, the family registry.

Plugins are distributions registering a module in the ``ftx`` entry-point group. A plugin that
fails to import (or implements an unknown hook) is recorded with its error and left out;
every command keeps working and ``ftx plugins`` shows what broke. ``FTX_DISABLE_PLUGINS``
(names, comma-separated) blocks plugins; ``FTX_LOAD_PLUGINS`` loads only the listed ones.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

import pluggy

from ftx_triton import PLUGIN_API_VERSION, hookspecs
from ftx_triton.errors import FamilyResolutionError, PluginError
from ftx_triton.runtime.api import Runtime
from ftx_triton.terminal import lazylog

if TYPE_CHECKING:
    import click

    from ftx_triton.conversion.family import Family

log = lazylog.get_logger(__name__)

ENTRY_POINT_GROUP = "ftx"
CORE_DISTRIBUTION = "ftx-triton"  # the PyPI name of core (import package ftx_triton)
DEFAULT_PLUGINS = (
    "ftx_triton.engine.default_plugins.fetch",
    "ftx_triton.engine.default_plugins.convert",
    "ftx_triton.engine.default_plugins.tune",
    "ftx_triton.engine.default_plugins.configure",
    "ftx_triton.engine.default_plugins.serve",
    "ftx_triton.runtime.python.plugin",
    "ftx_triton.runtime.fastertransformer.docker.plugin",
    "ftx_triton.runtime.fastertransformer.docker.commands",
    "ftx_triton.runtime.fastertransformer.native.plugin",
    "ftx_triton.runtime.fastertransformer.native.commands",
    "ftx_triton.cluster.slurm.plugin",
    "ftx_triton.cluster.export",
)
"""Core's own plugins: the stage defaults (``trylast``), the runtimes it ships and, beside each launcher, its
commands (the Docker launcher's ``ftx image``/``tune``/``package``, the native one's ``ftx backend``, built from
:mod:`ftx_triton.commandkit`), and the cluster launchers (``ftx slurm``, ``ftx export``). Core never imports them
for logic; they are registered and called through the hooks like any third-party plugin."""


@dataclass
class PluginRecord:
    """One plugin as discovered: where it comes from, what it implements, what went wrong."""

    name: str
    distribution: str
    version: str
    module: str
    hooks: list[str] = field(default_factory=list)
    families: list[str] = field(default_factory=list)
    runtimes: list[str] = field(default_factory=list)
    error: str | None = None
    status: str = "loaded"  # loaded | broken | disabled | skipped

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "module": self.module,
            "hooks": self.hooks,
            "families": self.families,
            "runtimes": self.runtimes,
            "status": self.status,
            "error": self.error,
        }


def _env_list(name: str) -> set[str] | None:
    raw = os.environ.get(name)
    if raw is None:
        return None
    return {item.strip() for item in raw.split(",") if item.strip()}


class PluginHost:
    """A pluggy manager with ftx's hookspecs, core defaults and discovered plugins."""

    def __init__(self, *, defaults: bool = True) -> None:
        self.pm = pluggy.PluginManager("ftx")
        self.pm.add_hookspecs(hookspecs)
        self.records: list[PluginRecord] = []
        self._families: dict[str, Family] | None = None
        self.family_owner: dict[str, str] = {}
        self.runtimes: dict[str, Runtime] = {}
        self.runtime_owner: dict[str, str] = {}
        for module_name in DEFAULT_PLUGINS if defaults else ():
            self.pm.register(importlib.import_module(module_name), name=module_name)

    @property
    def hook(self) -> Any:
        return self.pm.hook

    @property
    def families(self) -> dict[str, Family]:
        """The registered families by name, collected from the plugins when first asked for (so a command that
        needs none, ``ftx --help``, imports no family and no numpy)."""
        if self._families is None:
            self.collect_families()
        assert self._families is not None
        return self._families

    # -- loading ---------------------------------------------------------------------------

    def load_entry_points(self, entry_points: Iterable[metadata.EntryPoint] | None = None) -> None:
        """Load every plugin of the ``ftx`` group, honouring the allow and block lists."""
        blocked = _env_list("FTX_DISABLE_PLUGINS") or set()
        allowed = _env_list("FTX_LOAD_PLUGINS")
        eps = entry_points if entry_points is not None else metadata.entry_points(group=ENTRY_POINT_GROUP)
        for ep in sorted(eps, key=lambda e: e.name):
            dist = ep.dist.name if ep.dist else "?"
            version = ep.dist.version if ep.dist else "?"
            record = PluginRecord(ep.name, dist, version, ep.value)
            self.records.append(record)
            if ep.name in blocked or dist in blocked:
                record.status = "disabled"
                continue
            if allowed is not None and ep.name not in allowed and dist not in allowed:
                record.status = "skipped"
                continue
            try:
                module = ep.load()
            except Exception as exc:  # a broken plugin must not break the host
                self._mark_broken(record, f"{type(exc).__name__}: {exc}")
                continue
            self.register(module, record)

    def register(self, module: ModuleType | object, record: PluginRecord | None = None) -> None:
        """Register one plugin object, validating its hooks and its declared API range."""
        name = record.name if record else getattr(module, "__name__", repr(module))
        record = record or PluginRecord(name, name, "0", name)
        if record not in self.records:
            self.records.append(record)
        api_error = _check_api_range(module)
        if api_error:
            self._mark_broken(record, api_error)
            return
        try:
            self.pm.register(module, name=name)
            self.pm.check_pending()
        except (pluggy.PluginValidationError, ValueError) as exc:
            if self.pm.is_registered(module):
                self.pm.unregister(module)
            self._mark_broken(record, f"invalid hook implementation: {exc}")
            return
        record.hooks = sorted(caller.name for caller in self.pm.get_hookcallers(module) or [])

    def _mark_broken(self, record: PluginRecord, error: str) -> None:
        record.status, record.error = "broken", error
        log.info("plugin.failed", plugin=record.name, distribution=record.distribution, error=error)

    def collect_families(self) -> None:
        """Ask every plugin for its families (once); a duplicate name is an error naming both."""
        if self._families is not None:
            return
        collected: dict[str, Family] = {}
        for impl in self.pm.hook.ftx_register_families.get_hookimpls():
            owner = self._record_for(impl.plugin_name)
            families = cast(Iterable[type["Family"]], impl.function() or ())
            for cls in families:
                family = cls()
                if family.name in collected:
                    raise PluginError(
                        f"family {family.name!r} is registered by both {self.family_owner[family.name]} "
                        f"and {owner.distribution}",
                        hint=f"uninstall one of them, or block one with FTX_DISABLE_PLUGINS={owner.name}",
                    )
                collected[family.name] = family
                self.family_owner[family.name] = owner.distribution
                owner.families.append(family.name)
        self._families = collected

    def collect_runtimes(self) -> None:
        """Ask every plugin for its runtimes; a duplicate name is an error naming both."""
        for impl in self.pm.hook.ftx_register_runtimes.get_hookimpls():
            owner = self._record_for(impl.plugin_name)
            runtimes = cast(Iterable[type[Runtime]], impl.function() or ())
            for cls in runtimes:
                runtime = cls()
                if not isinstance(runtime, Runtime) or not runtime.name:
                    raise PluginError(
                        f"{owner.distribution} registered {cls!r}, which is not a named ftx Runtime",
                        hint="subclass ftx_triton.Runtime and set its name",
                    )
                if runtime.name in self.runtimes:
                    raise PluginError(
                        f"runtime {runtime.name!r} is registered by both {self.runtime_owner[runtime.name]} "
                        f"and {owner.distribution}",
                        hint=f"uninstall one of them, or block one with FTX_DISABLE_PLUGINS={owner.name}",
                    )
                self.runtimes[runtime.name] = runtime
                self.runtime_owner[runtime.name] = owner.distribution
                owner.runtimes.append(runtime.name)

    def commands(self, kit: object, taken: Iterable[str] = ()) -> dict[str, click.Command]:
        """The commands plugins add (``ftx_register_commands``, handed ``kit``, the CLI's
        :class:`~ftx_triton.commandkit.CommandKit`, when they name it), by name; one ``taken`` by core or by two
        plugins is an error naming both."""
        import click

        commands: dict[str, click.Command] = {}
        owners = dict.fromkeys(taken, "ftx core")
        for impl in self.pm.hook.ftx_register_commands.get_hookimpls():
            owner = self._record_for(impl.plugin_name).distribution
            group = click.Group()
            given = {"cli": group, "kit": kit}
            impl.function(**{name: given[name] for name in impl.argnames if name in given})
            for name, command in group.commands.items():
                if name in owners:
                    raise PluginError(
                        f"command {name!r} is added by both {owners[name]} and {owner}",
                        hint=f"uninstall one of them, or block one with FTX_DISABLE_PLUGINS={owner}",
                    )
                owners[name] = owner
                commands[name] = command
        return commands

    def run_options(self, taken: Iterable[str] = ()) -> list[click.Option]:
        """The options plugins add to ``ftx run`` (``ftx_add_options``); a name ``ftx run`` already has (or
        two plugins add) is an error naming it."""
        options: list[click.Option] = []
        seen = set(taken)
        for impl in self.pm.hook.ftx_add_options.get_hookimpls():
            owner = self._record_for(impl.plugin_name).distribution
            for option in cast(Sequence["click.Option"], impl.function() or ()):
                if option.name is None or option.name in seen:
                    raise PluginError(
                        f"{owner} adds an option {option.name!r} to `ftx run`, which already has one of that name",
                        hint=f"rename it, or block the plugin with FTX_DISABLE_PLUGINS={owner}",
                    )
                seen.add(option.name)
                options.append(option)
        return options

    def _record_for(self, plugin_name: str) -> PluginRecord:
        for record in self.records:
            if record.name == plugin_name:
                return record
        return PluginRecord(plugin_name, plugin_name, "0", plugin_name)

    # -- queries ---------------------------------------------------------------------------

    @property
    def broken(self) -> list[PluginRecord]:
        return [r for r in self.records if r.status == "broken"]

    def family(self, name: str) -> Family:
        """The family registered as ``name``, or an error listing those that exist."""
        try:
            return self.families[name]
        except KeyError:
            if hidden := self.hidden_family(name):
                raise hidden from None
            raise FamilyResolutionError(
                f"unknown family {name!r}; installed families: {', '.join(sorted(self.families)) or 'none'}",
                hint=self._broken_hint() or "see `ftx models`, or install the plugin (pip install ftx-<family>)",
            ) from None

    def hidden_family(self, name: str) -> FamilyResolutionError | None:
        """The error for a family whose plugin is installed but not loaded by the user's choice (its entry point
        is the family's slug): named as hidden, not as unknown."""
        record = next(
            (r for r in self.records if r.status in ("skipped", "disabled") and name in (r.name, r.distribution)), None
        )
        if record is None:
            return None
        if record.status == "skipped":
            why, fix = "FTX_LOAD_PLUGINS does not list it", f"add {record.name} to FTX_LOAD_PLUGINS (or unset it)"
        else:
            why, fix = "FTX_DISABLE_PLUGINS lists it", f"remove {record.name} from FTX_DISABLE_PLUGINS"
        return FamilyResolutionError(
            f"family {name!r} is hidden: its plugin {record.distribution} {record.version} is installed but not "
            f"loaded ({why})",
            hint=fix,
        )

    def resolve_family(self, hf_config: Mapping[str, Any], explicit: str | None = None) -> Family:
        """Pick the family for a config.json: ``explicit`` wins, else the unique match."""
        if explicit:
            return self.family(explicit)
        matches = [f for f in self.families.values() if f.matches(hf_config)]
        if len(matches) == 1:
            return matches[0]
        model_type = hf_config.get("model_type")
        arch = ", ".join(hf_config.get("architectures") or []) or "none"
        if not matches:
            raise FamilyResolutionError(
                f"no installed family handles model_type {model_type!r} (architectures: {arch}); "
                f"families: {', '.join(sorted(self.families)) or 'none'}",
                hint=self._broken_hint() or "pick one with --family, or install the plugin for this model",
            )
        raise FamilyResolutionError(
            f"several families claim this checkpoint (model_type {model_type!r}, architectures: {arch}): "
            f"{', '.join(f.name for f in matches)}",
            hint="pick one with --family, or fix config.json if its model_type and architectures disagree",
        )

    def family_for_source(self, path: Path, explicit: str | None = None) -> tuple[Family, dict[str, Any]]:
        """The family of a fetched checkpoint directory and its (HF-style) config."""
        if explicit:
            family = self.family(explicit)
            return family, family.read_hf_config(path)
        for family in self.families.values():
            if family.claims_source(path):
                return family, family.read_hf_config(path)
        from ftx_triton.conversion.family import read_config_json

        hf_config = read_config_json(path)
        return self.resolve_family(hf_config), hf_config

    def presets(self) -> dict[str, tuple[Family, Any]]:
        """Every preset name -> (family, Preset)."""
        return {name: (fam, preset) for fam in self.families.values() for name, preset in fam.presets.items()}

    def _broken_hint(self) -> str:
        if not self.broken:
            return ""
        names = ", ".join(f"{r.name} ({r.error})" for r in self.broken)
        return f"some plugins failed to load: {names}; run `ftx plugins`"


def _check_api_range(module: object) -> str | None:
    """A plugin may declare ``FTX_PLUGIN_API = (min, max)``; refuse it outside that range."""
    declared = getattr(module, "FTX_PLUGIN_API", None)
    if declared is None:
        return None
    low, high = declared
    if low <= PLUGIN_API_VERSION <= high:
        return None
    side = "ftx" if PLUGIN_API_VERSION < low else "the plugin"
    return f"supports plugin API {low}..{high} but this ftx provides API {PLUGIN_API_VERSION}; upgrade {side}"


def load_host(
    *,
    entry_points: Iterable[metadata.EntryPoint] | None = None,
    extra: Sequence[object] = (),
    families_when_asked: bool = False,
    families_only: bool = False,
) -> PluginHost:
    """Build a host with core defaults, discovered plugins and ``extra`` plugin objects; the families are
    collected now, or on first use with ``families_when_asked`` (the CLI: ``ftx --help`` needs none).
    ``families_only``: neither core's default plugins (stages, runtimes, their commands) nor runtimes, for a process
    that only reads a family (the python runtime's model in its stub, where they took 0.2 s before ready)."""
    host = PluginHost(defaults=not families_only)
    host.load_entry_points(entry_points)
    for plugin in extra:
        host.register(plugin)
    if not families_when_asked:
        host.collect_families()
    if not families_only:
        host.collect_runtimes()
    return host


def installed_distributions() -> list[tuple[str, str]]:
    """(distribution, version) for ftx and every plugin distribution, broken ones included."""
    rows = [(CORE_DISTRIBUTION, metadata.version(CORE_DISTRIBUTION))]
    seen = {CORE_DISTRIBUTION}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.dist and ep.dist.name not in seen:
            seen.add(ep.dist.name)
            rows.append((ep.dist.name, ep.dist.version))
    return rows
