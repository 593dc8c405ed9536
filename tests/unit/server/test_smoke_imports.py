"""The smoke generation's imports, made in a thread while tritonserver loads its models."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest
from ftx_triton.server import smoke


def test_the_smoke_generation_modules_are_imported_in_the_background() -> None:
    """In a fresh interpreter (this one has them already): none is imported by ``ftx_triton.server.smoke``
    itself, all are once the thread ends."""
    code = (
        "import sys\n"
        "from ftx_triton.server import smoke\n"
        "before = [m for m in smoke.SMOKE_MODULES if m in sys.modules]\n"
        "smoke.import_while_loading().join(60)\n"
        "print(before, [m for m in smoke.SMOKE_MODULES if m not in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["[]", "[]"], out.stdout + out.stderr


def test_grpcs_client_is_imported_ahead_only_for_a_decoupled_model() -> None:
    """A model that answers in one piece is smoke-tested over HTTP (the standard library): its run imports neither
    gRPC's client nor numpy while the models load; a decoupled one's run imports gRPC's client ahead as before."""
    code = (
        "import json, sys\n"
        "from ftx_triton.server import smoke\n"
        "smoke.import_while_loading(decoupled=False).join(60)\n"
        "whole = [m for m in ('tritonclient.grpc', 'numpy', 'grpc') if m in sys.modules]\n"
        "smoke.import_while_loading(decoupled=True).join(60)\n"
        "print(json.dumps([whole, [m for m in smoke.STREAMED_SMOKE_MODULES if m not in sys.modules]]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(out.stdout) == [[], []], out.stdout + out.stderr


def test_the_raw_models_inputs_say_its_kind() -> None:
    """From the config as the server answers it (JSON)."""
    decoder = {"input": [{"name": "input_ids"}, {"name": "input_lengths"}, {"name": "request_output_len"}]}
    t5 = {"input": [{"name": "input_ids"}, {"name": "sequence_length"}, {"name": "max_output_len"}]}
    assert (smoke.io_kind_of(decoder), smoke.io_kind_of(t5)) == ("decoder", "encoder-decoder")


def test_a_module_that_fails_to_import_is_left_to_the_smoke_generation(monkeypatch: pytest.MonkeyPatch) -> None:
    """The thread swallows the failure (the smoke generation imports the module again and reports it) and still
    imports what follows."""
    failures: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: failures.append(args.exc_value))
    monkeypatch.setattr(smoke, "SMOKE_MODULES", ("ftx_triton_no_such_module", "ftx_triton.repository.io"))
    monkeypatch.delitem(sys.modules, "ftx_triton.repository.io")
    thread = smoke.import_while_loading()
    thread.join(30)
    assert not thread.is_alive() and failures == []
    assert "ftx_triton.repository.io" in sys.modules
