"""Option sections: settings declared once (name, type, help, default) as fields of a frozen dataclass.

A runtime (or any plugin) declares the options it reads as an :class:`OptionSection` subclass and lists it in
``Runtime.option_sections``; ``ftx run`` gets one command-line option per field (``--shm-size`` for
``shm_size``), ``ftx.toml``'s ``[settings]`` take the same names through the same types, and the runtime gets the
values back, typed, as ``ctx.settings.options(TheSection)``. Nothing here imports click: the CLI turns a
:class:`Declared` into a click option.

    @dataclass(frozen=True)
    class AbacusOptions(OptionSection):
        title: ClassVar[str] = "Abacus runtime"
        beads: int = option(10, help="Beads per wire.", low=1, high=1000)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

S = TypeVar("S", bound="OptionSection")

META_KEY = "ftx"


@dataclass(frozen=True)
class Declared:
    """How one field of a section appears on the command line: what it takes and its help line."""

    help: str
    kind: type = str
    """What the value is: ``str``, ``int``, ``float`` (finite), ``bool`` (a ``--x/--no-x`` pair) or ``Path``."""
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    multiple: bool = False
    """Repeatable (``--env A=1 --env B=2``): a tuple of values."""
    must_exist: bool = False
    """A path that must exist (a file)."""
    show_default: bool = False
    flag: str | None = None
    """The long flag, when it is not ``--`` + the field name with ``-`` for ``_``."""
    envvar: tuple[str, ...] = ()
    """Environment variables besides the ``FTX_<COMMAND>_<OPTION>`` twin every option has."""
    group: str | None = None
    """The --help section it is listed under, when not its section's ``title``."""
    pair: bool = True
    """A ``bool``: ``--x/--no-x`` (else a plain flag, ``--detach``)."""


def option(default: Any, *, help: str, kind: type = str, **declared: Any) -> Any:  # noqa: A002 - click's word
    """A section field with its command-line declaration (``default`` is the field's default)."""
    return dataclasses.field(default=default, metadata={META_KEY: Declared(help=help, kind=kind, **declared)})


class OptionSection:
    """Base of a frozen dataclass of options; its ``title`` heads its options in ``ftx run --help``."""

    title: ClassVar[str] = "Runtime options"
    registry: ClassVar[dict[str, type[OptionSection]]] = {}
    """Field name -> the section declaring it, for every section defined so far (a name is declared once)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # the dataclass decorator runs after this hook: the fields are read from the annotations
        for name in getattr(cls, "__annotations__", {}):
            if name in ("title", "registry"):
                continue
            owner = OptionSection.registry.setdefault(name, cls)
            if owner is not cls and owner.__qualname__ != cls.__qualname__:
                raise TypeError(f"option {name!r} is declared by both {owner.__qualname__} and {cls.__qualname__}")

    @classmethod
    def declarations(cls) -> list[tuple[str, Any, Declared]]:
        """(name, default, declaration) of every field, in order."""
        out = []
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            declared = f.metadata.get(META_KEY)
            if declared is not None:
                out.append((f.name, f.default, declared))
        return out

    @classmethod
    def from_values(cls: type[S], values: Mapping[str, object]) -> S:
        """The section from flat values (names it does not declare are left out; None keeps the default)."""
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        return cls(**{k: v for k, v in values.items() if k in names and v is not None})


def normalise(value: object) -> object:
    """A value as a frozen section keeps it: lists as tuples."""
    if isinstance(value, list):
        return tuple(value)
    return value


__all__ = ["Declared", "OptionSection", "normalise", "option"]
