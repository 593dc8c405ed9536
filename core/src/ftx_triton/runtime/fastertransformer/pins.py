"""The upstream sources FasterTransformer is built from, pinned (the native build and the Docker image both).

Each :class:`Component` names its public home and commit (or tag), where it goes in the source
layout the build expects, which of its files the build uses (``used`` path prefixes, minus
``exclude``) and the sha256 of that file tree (:func:`ftx_triton.runtime.fastertransformer.native.sources.tree_digest`). The tree
digest, not an archive checksum, is what is checked: GitHub makes its archives on the fly (their
bytes are not stable), and the offline source bundle is trimmed to what the build uses; the files
the build reads are the same either way.

The source layout (a ``--sources`` directory or archive has it too)::

    FasterTransformer/                 NVIDIA/FasterTransformer
    FasterTransformer/3rdparty/cutlass NVIDIA/cutlass (include/ only is used)
    fastertransformer_backend/         triton-inference-server/fastertransformer_backend
    triton/{common,core,backend}/      triton-inference-server/{common,core,backend}
    rapidjson/                         Tencent/rapidjson (include/ only is used)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Component:
    """One upstream repository at a pinned revision."""

    name: str
    repository: str
    """``owner/name`` on GitHub."""
    ref: str
    """A commit (full or short sha) or, with ``tag=True``, a tag."""
    folder: str
    """Where it goes in the source layout."""
    used: tuple[str, ...]
    """Path prefixes (``dir/``) or file names, relative to ``folder``, of the files the build reads."""
    tree_sha256: str
    exclude: tuple[str, ...] = ()
    tag: bool = False

    @property
    def archive_url(self) -> str:
        """The public archive of this revision (its top-level folder is stripped on extraction)."""
        path = f"refs/tags/{self.ref}" if self.tag else self.ref
        return f"https://github.com/{self.repository}/archive/{path}.tar.gz"

    @property
    def display(self) -> str:
        return f"{self.repository}@{self.ref}"

    def uses(self, relative: str) -> bool:
        """Whether the file at ``relative`` (posix, inside ``folder``) is one the build reads."""
        if any(relative == e.rstrip("/") or relative.startswith(e) for e in self.exclude):
            return False
        return any(relative == u or (u.endswith("/") and relative.startswith(u)) for u in self.used)


TRITON_TAG = "r22.12"
"""The Triton common/core/backend tag the backend's CMake fetches (its default)."""

COMPONENTS: tuple[Component, ...] = (
    Component(
        "FasterTransformer",
        "NVIDIA/FasterTransformer",
        "df4a7534860137e060e18d2ebf019906120ea204",
        "FasterTransformer",
        used=("CMakeLists.txt", "cmake/", "src/", "3rdparty/", "examples/CMakeLists.txt", "examples/cpp/"),
        exclude=("3rdparty/cutlass/",),
        tree_sha256="ff80f21e05411d758b94ca146c047ca97a0855d928700c73acc8e6c12c707d9c",
    ),
    Component(
        # The submodule commit FasterTransformer pins; a GitHub archive of FasterTransformer lacks it.
        "cutlass",
        "NVIDIA/cutlass",
        "cc85b64",
        "FasterTransformer/3rdparty/cutlass",
        used=("include/",),
        tree_sha256="8e4ef9b0d3ed00cd8a748ab3a3a2992e570f622392b40baaf6487cef1724e5b9",
    ),
    Component(
        "fastertransformer_backend",
        "triton-inference-server/fastertransformer_backend",
        "c6936c39be6fc57c161db34cfe5c45d1bef81ee2",
        "fastertransformer_backend",
        used=("CMakeLists.txt", "cmake/", "src/"),
        tree_sha256="20958bab7a60fcea160bcd8edb4fa9c908252299439064287f9f30661830a7bc",
    ),
    *(
        Component(
            f"triton-{part}",
            f"triton-inference-server/{part}",
            TRITON_TAG,
            f"triton/{part}",
            used=("CMakeLists.txt", "cmake/", "include/", "src/", *extra),
            tree_sha256=digest,
            tag=True,
        )
        for part, extra, digest in (
            ("common", ("protobuf/",), "ef7744e1234632c2a0f49b993c3cb501d115ff2d4da3235f81a8d4686592a111"),
            ("core", (), "59900103f1a699054ea38f7f252fe64ddd58aba52c128579f26ea59bb0d5c652"),
            ("backend", (), "858cff719b4691e15aac9129242b765e3f1c73f67fbf3cb1c25b44d9348d8d17"),
        )
    ),
    Component(
        "rapidjson",
        "Tencent/rapidjson",
        "v1.1.0",
        "rapidjson",
        used=("include/",),
        tree_sha256="a854f3aa1c3b7a863ffe4011d27ef2ba002c1aa8ae6d7f2f73659beed51b2478",
        tag=True,
    ),
)


def component(name: str) -> Component:
    """The component called ``name``."""
    for c in COMPONENTS:
        if c.name == name:
            return c
    raise KeyError(name)


def pins_fingerprint(components: tuple[Component, ...] = COMPONENTS) -> dict[str, str]:
    """Each component's revision and tree digest, for the build's cache key."""
    return {c.name: f"{c.display}#{c.tree_sha256}" for c in components}


def pins_digest(components: tuple[Component, ...] = COMPONENTS) -> str:
    """One short digest of every pin (revision and tree digest): what a lock records of the sources."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps(pins_fingerprint(components), sort_keys=True).encode()).hexdigest()[:16]


__all__ = ["COMPONENTS", "TRITON_TAG", "Component", "component", "pins_digest", "pins_fingerprint"]
