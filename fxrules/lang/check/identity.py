"""Whether a rule's replacement is its pattern again (``identity-rewrite``): such a rule could only
rewrite forever.

Two expressions are the same once names are expanded (``F.relu`` is
``torch.nn.functional.relu``, ``Conv2d`` is ``torch.nn.Conv2d``), ``as`` is dropped and keyword
arguments are put in order. A bare replacement call (``call_module M``) forwards the arguments
of the pattern root it replaces, so it is compared with them filled in. A commutative call
(fxrules.lang.commutative) with its two operands exchanged is the same call: the engine would
match the replacement in the other order.
"""

from __future__ import annotations

from typing import Callable, Optional

import fxrules.lang.ast as A
from fxrules.lang.check.scope import Aliases, unwrap
from fxrules.lang.commutative import commutation


def is_identity(patterns: tuple[A.Expr, ...], replacements: tuple[A.Expr, ...], aliases: Aliases) -> bool:
    """Whether each replacement root is the same as the pattern root it replaces (as many of each)."""
    return all(same(pattern, _filled(replacement, pattern), aliases)
               for pattern, replacement in zip(patterns, replacements))


def is_identity_as_written(patterns: tuple[A.Expr, ...], replacements: tuple[A.Expr, ...], aliases: Aliases) -> bool:
    """:func:`is_identity` without exchanging a commutative call's operands: False for a rule that is its
    own pattern only through such an exchange (``add($x, $y) -> add($y, $x)``), whose error says so."""
    return all(same(pattern, _filled(replacement, pattern), aliases, _not_commuted)
               for pattern, replacement in zip(patterns, replacements))


def same(a: A.Expr, b: A.Expr, aliases: Aliases, commuted: Optional[Callable[[A.Call, A.Call, Aliases], bool]] = None) -> bool:
    """Stops at the first difference: most rules differ from their pattern near the root, and this
    runs for every rule. ``commuted`` decides whether two calls are the same with their operands
    exchanged (:func:`_same_commuted` unless given)."""
    if commuted is None:
        commuted = _same_commuted
    while type(a) is A.Bind:
        a = a.expr
    while type(b) is A.Bind:
        b = b.expr
    kind = type(a)
    if kind is not type(b):
        return False
    if kind is A.Call:
        return (a.op == b.op and call_target(a, aliases) == call_target(b, aliases)
                and (_same_items(a.args, b.args, aliases, commuted) or commuted(a, b, aliases))
                and _same_keywords(a.kwargs, b.kwargs, aliases, commuted)
                and _same_keywords(a.attrs, b.attrs, aliases, commuted)
                and _same_items(a.builder_args, b.builder_args, aliases, commuted))
    if kind is A.ListExpr or kind is A.TupleExpr:
        return _same_items(a.items, b.items, aliases, commuted)
    if kind is A.Alt:
        return _same_items(a.options, b.options, aliases, commuted)
    if kind is A.Name and (len(a.dotted.parts) > 1 or len(b.dotted.parts) > 1):
        return (len(a.dotted.parts) > 1 and len(b.dotted.parts) > 1
                and aliases.full_path(a.dotted) == aliases.full_path(b.dotted))
    return a == b  # as written (spans aside)


def _same_commuted(a: A.Call, b: A.Call, aliases: Aliases) -> bool:
    """The same call with its two operands exchanged, where the engine matches either order
    (fxrules.lang.commutative): the pattern would match its own replacement. For ``x + y`` and
    ``x * y`` only with a literal number operand (the engine swaps those only for a known number
    or tensor, and a rule file cannot say which nodes are tensors)."""
    commutes = commutation(a.op, call_target(a, aliases))
    if commutes is None or a.args is None or b.args is None or len(a.args) != 2 or len(b.args) != 2:
        return False
    if commutes.numeric and not any(isinstance(x, A.Literal) and _is_number(x.value) for x in a.args):
        return False
    return same(a.args[0], b.args[1], aliases) and same(a.args[1], b.args[0], aliases)


def _not_commuted(a: A.Call, b: A.Call, aliases: Aliases) -> bool:
    """For :func:`is_identity_as_written`: no call is the same with its operands exchanged."""
    return False


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def call_target(call: A.Call, aliases: Aliases) -> str:
    """The full path of a call's target (a method's name as written)."""
    if call.op == "call_method":
        return call.target.text
    if call.op == "call_module" and len(call.target.parts) == 1 and call.target.parts[0] not in aliases.paths:
        return "torch.nn." + call.target.parts[0]
    return aliases.full_path(call.target)


def _same_items(a: Optional[tuple], b: Optional[tuple], aliases: Aliases, commuted: Callable) -> bool:
    if a is None or b is None:
        return a is b
    return len(a) == len(b) and all(same(x, y, aliases, commuted) for x, y in zip(a, b))


def _same_keywords(a: Optional[tuple], b: Optional[tuple], aliases: Aliases, commuted: Callable) -> bool:
    """Keyword arguments (or attributes) by name, whatever their order."""
    if a is None or b is None:
        return a is b
    if len(a) != len(b):
        return False
    a, b = sorted(a, key=_name), sorted(b, key=_name)
    return all(x.name == y.name and same(x.value, y.value, aliases, commuted) for x, y in zip(a, b))


def _name(keyword: A.Keyword) -> str:
    return keyword.name


def _filled(replacement: A.Expr, pattern: A.Expr) -> A.Expr:
    """A bare replacement call (``call_module M``) with the arguments of the pattern root it forwards."""
    root = unwrap(pattern)
    if (isinstance(replacement, A.Call) and replacement.args is None and isinstance(root, A.Call)
            and root.op == replacement.op):
        return A.Call(replacement.op, replacement.target, root.args, root.kwargs, replacement.attrs,
                      replacement.builder_args)
    return replacement
