"""The hookspec file is a contract: prefixed names, every argument documented, firstresult hooks say so."""

from __future__ import annotations

import inspect

import pytest
from ftx_triton import hookspecs

HOOKS = [f for name, f in vars(hookspecs).items() if inspect.isfunction(f) and hasattr(f, "ftx_spec")]


def test_every_hook_is_an_ftx_hook() -> None:
    assert {f.__name__ for f in HOOKS} == {
        "ftx_register_families",
        "ftx_register_runtimes",
        "ftx_register_commands",
        "ftx_add_options",
        "ftx_cluster_deployments",
        "ftx_fetch",
        "ftx_convert",
        "ftx_tune",
        "ftx_configure",
        "ftx_serve",
    }


@pytest.mark.parametrize("hook", HOOKS, ids=lambda f: f.__name__)
def test_hook_documents_every_argument_and_its_result(hook) -> None:
    doc = inspect.getdoc(hook) or ""
    for name in inspect.signature(hook).parameters:
        assert f":param {name}:" in doc, f"{hook.__name__} does not document {name}"
    assert ":returns:" in doc
    if hook.ftx_spec["firstresult"]:
        assert "Stops at the first non-None result" in doc and "Default:" in doc
