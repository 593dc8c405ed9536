"""The FasterTransformer image is built from pinned commits: the backend fetched at the native build's pin
(``git clone --branch`` takes no commit, so it was ``main``), and FasterTransformer, which the backend's
CMakeLists fetches at ``main``, edited to the pinned commit inside the image."""

from __future__ import annotations

import subprocess
from pathlib import Path

from ftx_triton.runtime.fastertransformer.docker import DEFAULT_BACKEND_REF, FT_COMMIT
from ftx_triton.runtime.fastertransformer.docker.image import FT_PIN_SED, clone_commands, patch_dockerfile
from ftx_triton.runtime.fastertransformer.pins import component

UPSTREAM_FT_BLOCK = """\
else()
  FetchContent_Declare(
    repo-ft
    GIT_REPOSITORY https://github.com/NVIDIA/FasterTransformer.git{space}
    GIT_TAG main
    GIT_SHALLOW ON
  )
endif()
""".replace("{space}", " ")  # upstream's line ends with a space
"""The block of fastertransformer_backend's CMakeLists.txt (at the pinned commit) that fetches FasterTransformer."""


def test_the_image_pins_are_the_native_builds() -> None:
    assert DEFAULT_BACKEND_REF == component("fastertransformer_backend").ref and len(DEFAULT_BACKEND_REF) == 40
    assert FT_COMMIT == component("FasterTransformer").ref and len(FT_COMMIT) == 40


def test_the_dockerfile_edit_pins_fastertransformer(tmp_path: Path) -> None:
    dockerfile = "FROM base\nADD . /workspace/build/fastertransformer_backend\nRUN cmake \\\n  ..\n"
    patched = patch_dockerfile(dockerfile, ())
    lines = patched.splitlines()
    assert lines[1] == "ADD . /workspace/build/fastertransformer_backend"
    assert lines[2].startswith("RUN sed -i -e ") and lines[2].endswith(
        "/workspace/build/fastertransformer_backend/CMakeLists.txt"
    )
    cmake = tmp_path / "CMakeLists.txt"
    cmake.write_text(UPSTREAM_FT_BLOCK)
    subprocess.run(["sed", "-i", "-e", FT_PIN_SED, str(cmake)], check=True)  # what the RUN line does
    text = cmake.read_text()
    assert f"GIT_TAG {FT_COMMIT}" in text and "GIT_SHALLOW OFF" in text and "GIT_TAG main" not in text


def test_a_commit_is_checked_out_not_the_branch_tip(tmp_path: Path) -> None:
    """A real git repository whose branch moved on after the pinned commit."""
    origin = tmp_path / "origin"
    git = ["git", "-C", str(origin), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(origin)], check=True)
    subprocess.run([*git, "config", "uploadpack.allowAnySHA1InWant", "true"], check=True)  # as GitHub allows
    (origin / "f").write_text("pinned")
    subprocess.run([*git, "add", "f"], check=True)
    subprocess.run([*git, "commit", "-qm", "pinned"], check=True)
    pinned = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    (origin / "f").write_text("moved on")
    subprocess.run([*git, "commit", "-qam", "later"], check=True)
    dest = tmp_path / "checkout"
    for argv in clone_commands(f"file://{origin}", pinned, str(dest)):
        subprocess.run(argv, check=True, capture_output=True)
    assert (dest / "f").read_text() == "pinned"
