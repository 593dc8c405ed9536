"""Shape expressions in family tables: ``("3*H", "H")`` evaluated against a spec's dims."""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence

Dim = int | str


def eval_dim(expr: Dim, dims: Mapping[str, int]) -> int:
    """Evaluate ``expr`` (an int, a dim name, or ``+ - * //`` of those) with ``dims``."""
    if isinstance(expr, int):
        return expr
    return _eval(ast.parse(expr, mode="eval").body, dims, expr)


def eval_shape(exprs: Sequence[Dim], dims: Mapping[str, int]) -> tuple[int, ...]:
    """Evaluate every dimension of a declared shape."""
    return tuple(eval_dim(e, dims) for e in exprs)


def _eval(node: ast.AST, dims: Mapping[str, int], text: str) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in dims:
            raise KeyError(f"shape {text!r} uses {node.id!r}, which the spec does not define")
        return int(dims[node.id])
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, dims, text), _eval(node.right, dims, text)
        if isinstance(node.op, ast.Mult):
            return left * right
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.FloorDiv):
            return left // right
    raise ValueError(f"unsupported shape expression {text!r}")
