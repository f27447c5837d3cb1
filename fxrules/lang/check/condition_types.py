"""Conditions that cannot be evaluated, found where the types are knowable (``bad-condition``).

A condition's values are mostly known only at a match (a capture may bind a node or a literal),
and one that raises there refuses that match (``condition-raised``, fxrules.engine.conditions).
Some types are known from the text alone: a literal's, and what tensor metadata reads give
(``.shape`` a tuple of ints, ``.dtype`` a dtype, ``.device`` a device, ``.ndim`` an int). An
operation that Python refuses for every value of those types (``$x.dtype * 2``,
``$x.shape * 1.0``, ``$x.shape - 1``, ``$x.dtype < torch.float32``) is reported here instead,
since it could never hold. Anything whose type is not known is left to the engine.
"""

from __future__ import annotations

from typing import Optional

import fxrules.lang.ast as A
from fxrules.lang.check.reporter import Reporter

SHAPE, DTYPE, DEVICE, INT, FLOAT, BOOL, STR, NONE, LIST = (
    "a shape (tuple)", "a dtype", "a device", "an int", "a float", "a bool", "a string", "None", "a list")

_ARITHMETIC = frozenset({"+", "-", "*", "/", "//", "%"})
_ORDERING = frozenset({"<", "<=", ">", ">="})
_METADATA_KINDS = {"shape": SHAPE, "dtype": DTYPE, "device": DEVICE, "ndim": INT, "numel": INT,
                   "requires_grad": BOOL}
_NUMBERS = frozenset({INT, FLOAT, BOOL})
_NO_ARITHMETIC = frozenset({DTYPE, DEVICE, NONE})
_LITERAL_KINDS = {bool: BOOL, int: INT, float: FLOAT, str: STR, type(None): NONE}


def report_type_errors(reporter: Reporter, cond: A.Cond) -> None:
    """Report the first operation of ``cond`` that raises for every value of its operands' known types."""
    found = _first_error(cond)
    if found is not None:
        span, message = found
        reporter.error(span, "bad-condition", message,
                       notes=["it would raise a TypeError at every match; a condition that raises refuses the match"])


def kind(cond: A.Cond) -> Optional[str]:
    """What ``cond`` evaluates to, when that is known from the text; None when it is not."""
    if isinstance(cond, A.CLiteral):
        return _LITERAL_KINDS.get(type(cond.value))
    if isinstance(cond, A.CList):
        return LIST
    if isinstance(cond, A.CAttr) and cond.attr in _METADATA_KINDS and A.name_chain(cond) is None \
            or isinstance(cond, A.CAttr) and cond.attr in _METADATA_KINDS and isinstance(cond.value, A.CName):
        return _METADATA_KINDS[cond.attr]
    if isinstance(cond, A.CUnary):
        return BOOL if cond.op == "not" else (kind(cond.operand) if kind(cond.operand) in (INT, FLOAT) else None)
    if isinstance(cond, A.CBinary):
        if cond.op in _ORDERING or cond.op in ("==", "!=", "in", "not in"):
            return BOOL
        return _arithmetic_kind(cond.op, kind(cond.left), kind(cond.right))
    if isinstance(cond, A.CCall) and isinstance(cond.func, A.CName) and cond.func.name == "len":
        return INT
    if isinstance(cond, A.CIndex) and isinstance(cond.index, A.CSlice) and kind(cond.value) in (SHAPE, LIST, STR):
        return kind(cond.value)  # a slice of a sequence is one of its kind
    return None


def _arithmetic_kind(op: str, left: Optional[str], right: Optional[str]) -> Optional[str]:
    if op not in _ARITHMETIC:
        return None
    if left in (INT, BOOL) and right in (INT, BOOL):
        return FLOAT if op == "/" else INT
    if left in _NUMBERS and right in _NUMBERS:
        return FLOAT
    if op == "+" and left == right == SHAPE:
        return SHAPE
    if op == "*" and {left, right} in ({SHAPE, INT}, {SHAPE, BOOL}):
        return SHAPE
    return None


def _first_error(cond: A.Cond) -> Optional[tuple]:
    """(span, message) of the first operation in ``cond`` (operands first) that always raises."""
    for part in _parts(cond):
        found = _first_error(part)
        if found is not None:
            return found
    if isinstance(cond, A.CBinary):
        left, right = kind(cond.left), kind(cond.right)
        if left is None or right is None:
            return None
        if _always_raises(cond.op, left, right):
            return cond.span, f"`{cond.op}` between {left} and {right} always raises"
    if isinstance(cond, A.CUnary) and cond.op == "-" and kind(cond.operand) in (SHAPE, LIST, STR) + tuple(
            _NO_ARITHMETIC):
        return cond.span, f"`-` of {kind(cond.operand)} always raises"
    if isinstance(cond, A.CSlice):
        for part in cond.parts():
            if kind(part) is not None and kind(part) not in (INT, BOOL, NONE):
                return part.span, f"a slice bound is an int or None; {kind(part)} always raises"
    if isinstance(cond, A.CIndex) and isinstance(cond.index, A.CSlice) and kind(cond.value) in _NUMBERS:
        return cond.span, f"slicing {kind(cond.value)} always raises"
    return None


def _always_raises(op: str, left: str, right: str) -> bool:
    if op in _ORDERING:
        return left in _NO_ARITHMETIC or right in _NO_ARITHMETIC or (left in _NUMBERS) != (right in _NUMBERS)
    if op in ("in", "not in"):
        return right in _NUMBERS or right in _NO_ARITHMETIC
    if op not in _ARITHMETIC:
        return False
    if left in _NO_ARITHMETIC or right in _NO_ARITHMETIC:
        return True
    sequences = {SHAPE, LIST, STR}
    if left in sequences or right in sequences:
        if op == "+":
            return left != right
        if op == "*":
            other = right if left in sequences else left
            return left in sequences and right in sequences or other == FLOAT
        return not (op == "%" and left == STR)  # `-`, `/`, `//`, `%` on a sequence (string formatting aside)
    return False


def _parts(cond: A.Cond) -> tuple:
    if isinstance(cond, A.CBinary):
        return (cond.left, cond.right)
    if isinstance(cond, A.CUnary):
        return (cond.operand,)
    if isinstance(cond, (A.CAttr, A.CIndex)):
        return (cond.value,) if isinstance(cond, A.CAttr) else (cond.value, cond.index)
    if isinstance(cond, A.CSlice):
        return cond.parts()
    if isinstance(cond, A.CCall):
        return cond.args
    if isinstance(cond, A.CList):
        return cond.items
    if isinstance(cond, A.CGenerator):
        return (cond.element, cond.iterable) + ((cond.filter,) if cond.filter is not None else ())
    return ()
