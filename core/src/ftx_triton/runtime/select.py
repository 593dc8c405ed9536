"""``--runtime``: pick a registered runtime by name, by alias, or (``auto``) by availability and priority."""

from __future__ import annotations

from collections.abc import Mapping

from ftx_triton.errors import ConfigError
from ftx_triton.plan.settings import RunSettings
from ftx_triton.runtime.api import Runtime, runtime_names
from ftx_triton.store.artifact_store import ArtifactStore


def check_runtime_name(runtimes: Mapping[str, Runtime], requested: str) -> None:
    """Refuse a ``--runtime`` that names no runtime, alias or ``auto`` (a cheap check, run before anything is
    fetched), suggesting the closest name."""
    import difflib

    names = runtime_names(list(runtimes.values()))
    if requested == "auto" or requested in runtimes or any(requested in r.selects_as for r in runtimes.values()):
        return
    close = difflib.get_close_matches(requested, names, n=1)
    raise ConfigError(
        f"unknown runtime {requested!r}" + (f" (did you mean {close[0]!r}?)" if close else ""),
        hint=f"use one of: {', '.join(names)} (see `ftx plugins`)",
    )


def choose_runtime(runtimes: Mapping[str, Runtime], settings: RunSettings, store: ArtifactStore) -> tuple[Runtime, str]:
    """The runtime for ``settings.runtime`` and why it was chosen.

    A runtime's own name selects it. ``auto`` and an alias (``fastertransformer``) rank their
    candidates by priority and take the first available one; an alias whose candidates are all
    unavailable still selects its highest-priority runtime (it was asked for by name: planning and
    ``--dry-run`` work anywhere, and the runtime itself reports what is missing when it runs).
    """
    requested = settings.runtime
    origin = settings.runtime_origin
    asked = f"requested with --runtime {requested}" if origin is None else f"{requested} from {origin}"
    if requested in runtimes:
        return runtimes[requested], asked
    if requested == "auto":
        candidates = list(runtimes.values())
    else:
        candidates = [r for r in runtimes.values() if requested in r.selects_as]
    if not candidates:
        raise ConfigError(
            f"unknown runtime {requested!r}",
            hint=f"use one of: {', '.join(runtime_names(list(runtimes.values())))} (see `ftx plugins`)",
        )
    unavailable: list[str] = []
    for runtime in sorted(candidates, key=lambda r: (-r.priority, r.name)):
        availability = runtime.available(settings, store)
        if availability.ok:
            why = availability.reason if requested == "auto" else asked
            return runtime, "; ".join([*unavailable, why])
        unavailable.append(f"{runtime.name}: {availability.reason}")
    if requested == "auto":
        raise ConfigError(
            "no runtime can serve on this machine: " + "; ".join(unavailable),
            hint="install what the runtime you want needs, or pick one with --runtime",
        )
    best = max(candidates, key=lambda r: (r.priority, r.name))
    return best, f"{asked} ({'; '.join(unavailable)})"
