"""Core names no model family in its code: the families are plugins, and core keeps only the mechanism.

Every identifier and every string of core's source (``core/src/ftx_triton``) outside its test kit
(``ftx_triton.testing``, which builds and checks families for plugin authors) is searched for a family's name
(GPT-J, NeoX, T5 in any spelling). Comments and docstrings may give examples; code may not. What must stay is
listed in :data:`ALLOWED`, each with its reason: FasterTransformer's own vocabulary (its model types, config.ini
keys and GEMM tools, which the FT reference and the native build reproduce) and examples in hints.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "core" / "src" / "ftx_triton"
FAMILY = re.compile(r"gpt[-_ ]?j|neox|(?<![a-z0-9])t5(?![0-9])", re.IGNORECASE)

FT_VOCABULARY = "FasterTransformer's own vocabulary"
ALLOWED: dict[str, str] = {
    "oracle/": "FasterTransformer's model types (GPT, GPT-J, GPT-NeoX, T5), which its CPU reference reproduces",
    "runtime/python/torch_decoder.py": "transformers' architectures (model types gptj, gpt_neox), which the python "
    "runtime's plain-torch decoders reproduce with their checkpoints' parameter names; chosen by the model type a "
    "family's config.ini gives back, never by a family's name",
    "conversion/ftini.py": f"{FT_VOCABULARY}: config.ini keys (use_gptj_residual, t5_with_bias) and their meaning",
    "runtime/fastertransformer/native/build.py": f"{FT_VOCABULARY}: the GEMM tools built (gpt_gemm, t5_gemm)",
    "runtime/fastertransformer/native/patches.py": f"{FT_VOCABULARY}: the sources the patch set edits (GptJDecoder, "
    "t5_gemm) by their file and class names",
    "repository/model_config.py:T5-Encoder": f"{FT_VOCABULARY}: the backend's encoder model type (--embeddings)",
    "runtime/fastertransformer/docker/commands.py:team/gptj:1": "an example image tag in --tag's help",
    "runtime/python/hf_model.py:GPTJForCausalLM": "an example transformers class in a hint",
    "conversion/family.py:like 'gptj'": "an example slug in a plugin author's error",
    "cli/run.py:ftx run gptj": "an example preset in a hint",
    "cli/manifest.py:ftx-triton-gptj==": "an example requirement in a hint",
    "fetching/refs.py:EleutherAI/gpt-j-6b": "an example Hub id in a hint",
}
"""What core's code may name a family in, and why: a file, a folder (ending in ``/``), or ``file:text`` for strings
of that file containing ``text``."""


def _allowed(rel: str, text: str) -> bool:
    for allowed in ALLOWED:
        path, _, part = allowed.partition(":")
        if (rel == path or (path.endswith("/") and rel.startswith(path))) and part in text:
            return True
    return False


def _docstrings(tree: ast.AST) -> set[int]:
    """Strings that are statements of their own: docstrings of modules, classes, functions and attributes."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    }


def _names(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, text) of every identifier and non-docstring string in ``tree``."""
    docstrings = _docstrings(tree)
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield line, node.value
        elif isinstance(node, ast.Name):
            yield line, node.id
        elif isinstance(node, ast.Attribute):
            yield line, node.attr
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield line, node.name
        elif isinstance(node, ast.arg):
            yield line, node.arg
        elif isinstance(node, ast.keyword) and node.arg:
            yield line, node.arg
        elif isinstance(node, ast.alias):
            yield line, node.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield line, node.module


def family_names_in_code(root: Path = CORE) -> list[str]:
    """``path:line: text`` for each family name in core's code, outside the test kit and :data:`ALLOWED`."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("testing/"):
            continue
        for line, text in _names(ast.parse(path.read_text(), str(path))):
            if FAMILY.search(text) and not _allowed(rel, text):
                found.append(f"{rel}:{line}: {text!r}")
    return found


def test_core_names_no_family() -> None:
    assert family_names_in_code() == []


def test_the_check_finds_a_family_in_code_but_not_in_docs(tmp_path: Path) -> None:
    """The check itself: a family's name in an identifier or a string is found; in a docstring or comment it is not."""
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "demo.py").write_text(
        '"""Builds a tiny GPT-J."""\n# T5 too\n'
        'def build(name):\n    """NeoX as well."""\n    if name != "tiny-gptj":\n        return T5Config\n'
    )
    (tmp_path / "testing").mkdir()
    (tmp_path / "testing" / "kit.py").write_text('FAMILY = "gptneox"\n')
    assert family_names_in_code(tmp_path) == ["engine/demo.py:5: 'tiny-gptj'", "engine/demo.py:6: 'T5Config'"]
