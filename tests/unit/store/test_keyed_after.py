"""A build keyed once it is done (a local source converted while its digest is computed): what only the record
needs is asked for after the build, so none of it delays the build's start."""

from __future__ import annotations

from pathlib import Path

from ftx_triton.store.artifact_store import ArtifactStore


def test_the_producer_record_is_asked_for_once_the_build_is_done(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "home")
    order: list[str] = []

    def build(tmp: Path) -> dict[str, object]:
        order.append("built")
        (tmp / "w.bin").write_bytes(b"x")
        return {}

    def keyed() -> tuple[str, dict[str, object]]:
        order.append("keyed")
        return "k" * 24, {"source": "digest"}

    def producer() -> dict[str, object]:
        order.append("producer")
        return {"family": {"fingerprint": "f"}}

    artifact, cached = store.build_keyed_after("convert", build, keyed, producer=producer)
    assert not cached and order == ["built", "keyed", "producer"]
    assert artifact.provenance["producer"] == {"family": {"fingerprint": "f"}}
    assert artifact.provenance["inputs"] == {"source": "digest"}
