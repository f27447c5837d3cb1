"""The operators whose two operands may be matched in either order (commutative matching).

A pattern ``call_function torch.add($x, call_function torch.relu($y))`` also matches
``torch.add(relu(y), x)``: the engine tries the written order first and, when that fails, the
two operands swapped (:mod:`fxrules.engine.matcher`). Swapping is sound only where the call's
value does not depend on the order, including dtype promotion, broadcasting, NaN and signed zeros:
each entry below was reviewed for that, with the conditions it needs.

Torch-free: keys are ``(opcode, full dotted path)`` for call_function (aliases expanded, aten
operators under ``torch.ops.aten``) and ``(opcode, method name)`` for call_method; the engine
resolves the paths when it compiles a rule.

Bound: each commutative call in a pattern tries at most two orders, the second only after the first
failed, and there is no backtracking into a call once matched (as for alternations). A call
nested in another doubles the work of the outer one, so only the outermost
:data:`MAX_COMMUTING_DEPTH` levels of commutative calls on any path of a pattern swap: matching a
root costs at most ``2 ** MAX_COMMUTING_DEPTH`` (16) times the written order alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

MAX_COMMUTING_DEPTH = 4
"""Commutative calls nested deeper than this (in other commutative calls) match in the written order only."""


@dataclass(frozen=True, slots=True)
class Commutation:
    """How a call commutes: parameters ``first`` and ``second`` may be exchanged when every
    parameter in ``at_default`` is absent or at its default (``alpha`` scales only ``other``) and,
    if ``numeric``, one operand is known to be a tensor or a number (``operator.add`` also
    concatenates lists and strings, which does not commute)."""

    first: str
    second: str
    at_default: tuple[str, ...] = ()
    numeric: bool = False


_TENSOR = Commutation("input", "other")
_SCALED = Commutation("input", "other", ("alpha",))
_PYTHON = Commutation("a", "b", numeric=True)

COMMUTATIVE: Mapping[tuple[str, str], Commutation] = {
    # torch functions: tensors (or a tensor and a number); promotion and broadcasting are symmetric
    ("call_function", "torch.add"): _SCALED,
    ("call_function", "torch.mul"): _TENSOR,
    ("call_function", "torch.multiply"): _TENSOR,
    ("call_function", "torch.maximum"): _TENSOR,  # NaN in either operand gives NaN
    ("call_function", "torch.minimum"): _TENSOR,
    ("call_function", "torch.fmax"): _TENSOR,  # NaN in one operand gives the other
    ("call_function", "torch.fmin"): _TENSOR,
    ("call_function", "torch.eq"): _TENSOR,
    ("call_function", "torch.ne"): _TENSOR,
    ("call_function", "torch.logical_and"): _TENSOR,
    ("call_function", "torch.logical_or"): _TENSOR,
    ("call_function", "torch.logical_xor"): _TENSOR,
    # the same as Tensor methods (`x.add(y)`: self is `input`)
    ("call_method", "add"): _SCALED,
    ("call_method", "mul"): _TENSOR,
    ("call_method", "multiply"): _TENSOR,
    ("call_method", "maximum"): _TENSOR,
    ("call_method", "minimum"): _TENSOR,
    ("call_method", "eq"): _TENSOR,
    ("call_method", "ne"): _TENSOR,
    # aten operators of torch.export graphs (their schemas name the first operand `input` here)
    ("call_function", "torch.ops.aten.add.Tensor"): _SCALED,
    ("call_function", "torch.ops.aten.mul.Tensor"): _TENSOR,
    ("call_function", "torch.ops.aten.maximum.default"): _TENSOR,
    ("call_function", "torch.ops.aten.minimum.default"): _TENSOR,
    ("call_function", "torch.ops.aten.eq.Tensor"): _TENSOR,
    ("call_function", "torch.ops.aten.ne.Tensor"): _TENSOR,
    # Python operators (what `x + y` and `x * y` trace to): only with a tensor or a number
    ("call_function", "operator.add"): _PYTHON,
    ("call_function", "operator.mul"): _PYTHON,
}
"""Reviewed: each entry's value is the same for both operand orders under its conditions. Not here,
on purpose: ``torch.add``/``sub`` with ``alpha`` (it scales one side), ``sub``/``div``/``matmul``,
``torch.max``/``min`` (overloaded with reductions), in-place methods (``add_`` writes ``self``)."""


def commutation(op: str, path: str) -> "Commutation | None":
    """How the call ``op path`` commutes, or None when it does not (or is not reviewed)."""
    return COMMUTATIVE.get((op, path))
