"""Host graphs for variadic captures: ``x.permute(*$dims)``, ``x.view(*$shape)`` (issue 19).

A variadic capture last among the arguments that an op's sampler takes as one sequence (a method
whose last parameter takes the remaining positional arguments: ``permute``, ``view``,
``reshape``, ``repeat``, ...) is drawn the way the whole sequence is: by the parameter's kind (a
permutation of the input's dims, a reshape target, ...), the items the pattern writes before it
taking their places and the capture binding the rest, as a list. Anywhere else a host cannot hold
one (a list of tensors of any length, a variadic in a call with no such parameter): the verifier
says there is no sampler for it.

Used by :class:`fxrules.verifier.hosts.HostGraphWriter` (``sequence``) and ``missing_samplers``.
"""

from __future__ import annotations

from typing import Any

from hypothesis import reject

from fxrules.engine.program import PCall, PCapture, PVariadic, PWildcard
from fxrules.verifier.samplers import Catalogue, Param

DRAWN_KINDS = frozenset({"perm", "dims", "shape", "stride", "padding", "dilation"})
"""The sequence kinds a sampler draws whole (hosts.py draws the same ones item by item)."""


def drawn_arguments(p: PCall, catalogue: Catalogue) -> tuple:
    """The positional arguments of ``p`` that need a sampler of their own: all of them, except a
    variadic capture last where the op's sampler takes the remaining arguments as one drawn
    sequence (:data:`DRAWN_KINDS`)."""
    args = tuple(p.args or ())
    if not args or not isinstance(args[-1], PVariadic) or p.op != "call_method":
        return args
    sampler = catalogue.method(p.targets[0])
    last = sampler.params[-1] if sampler is not None and sampler.params else None
    if last is not None and last.var and last.kind in DRAWN_KINDS:
        return args[:-1]
    return args


def rest_of(writer: Any, items: list, param: Param, ctx: dict) -> list:
    """The sequence for ``items`` (ending in a variadic capture), drawn whole by ``param``'s kind: the
    items before the capture take their places (a literal must equal its drawn item, or another
    host is drawn), the capture binds the rest. A capture bound before must get the same rest."""
    variadic = items[-1]
    fixed = items[:-1]
    if param.kind not in DRAWN_KINDS:
        reject()
    full = list(writer.free(param, ctx, None))
    if len(full) < len(fixed):
        reject()
    out = []
    for index, item in enumerate(fixed):
        value = full[index]
        if isinstance(item, PCapture):
            if item.name in writer.captures and writer.captures[item.name] != value:
                reject()
            writer.captures[item.name] = value
        elif not isinstance(item, PWildcard):
            if writer.pattern(item, Param(param.name, "number"), ctx) != value:
                reject()
        out.append(value)
    rest = full[len(fixed):]
    if variadic.name in writer.captures and list(writer.captures[variadic.name]) != rest:
        reject()
    writer.captures[variadic.name] = list(rest)
    return out + rest
