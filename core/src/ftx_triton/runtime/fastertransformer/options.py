"""Launch choices both FasterTransformer launchers read the same way: GPU indices and extra environment."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ftx_triton.errors import ConfigError


def parse_gpus(value: str | Iterable[int | str]) -> tuple[int, ...]:
    items = value.split(",") if isinstance(value, str) else list(value)
    try:
        return tuple(int(str(i).strip()) for i in items if str(i).strip())
    except ValueError:
        raise ConfigError(f"--gpus {value!r} is not a list of GPU indices", hint="e.g. --gpus 0,1,2,3") from None


def parse_env(value: Mapping[str, str] | Iterable[str] | str) -> dict[str, str]:
    if isinstance(value, Mapping):
        return {str(k): str(v) for k, v in value.items()}
    items = [value] if isinstance(value, str) else list(value)
    out = {}
    for item in items:
        key, sep, val = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--env {item!r} is not KEY=VALUE", hint="e.g. --env FT_LOG_LEVEL=DEBUG")
        out[key] = val
    return out
