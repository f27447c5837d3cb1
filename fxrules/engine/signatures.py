"""Argument normalization: positional and keyword spellings of a call are the same call.

For a call target we find its signatures (several for overloaded torch ops),
bind the pattern's arguments to them once, at compile time, and bind each
graph node's arguments at match time. Two calls agree when their bound
parameters agree; a parameter the pattern does not mention must be at its
default value (or absent), unless the pattern ends with ``...``.

Sources of signatures, in order: aten ``OpOverload`` schemas, torch's own
operator schemas (``torch.fx.operator_schemas``), ``inspect.signature`` for
Python functions, the ``forward`` of module classes; for ``call_method NAME``
the signature of ``torch.NAME`` (its first parameter is ``self``). Targets with
no signature are compared positionally, as written.
"""

from __future__ import annotations

import inspect
import threading
from typing import Any, Optional

_EMPTY = inspect.Parameter.empty
_cache: dict[Any, tuple[inspect.Signature, ...]] = {}
_lock = threading.Lock()


def _cached(key: Any, compute) -> tuple[inspect.Signature, ...]:
    with _lock:
        found = _cache.get(key)
    if found is not None:
        return found
    value = compute()
    with _lock:
        _cache[key] = value
    return value


def _usable(sig: inspect.Signature) -> bool:
    return all(p.kind is not inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())


def for_function(target: Any) -> tuple[inspect.Signature, ...]:
    def compute() -> tuple[inspect.Signature, ...]:
        from torch.fx import operator_schemas

        from fxrules.engine import fxaccess

        if fxaccess.is_op_overload(target):
            try:
                return (fxaccess.op_signature(target),)
            except Exception:
                return ()
        try:
            sigs = operator_schemas.get_signature_for_torch_op(target)
        except Exception:
            sigs = None
        if sigs:
            return tuple(s for s in sigs if _usable(s))
        branches = fxaccess.boolean_dispatched(target)
        if branches:
            return _dispatched_signature(branches)
        try:
            sig = inspect.signature(target)
        except (TypeError, ValueError):
            return ()
        return (sig,) if _usable(sig) else ()

    try:
        key = ("function", target)
        hash(key)
    except TypeError:
        return ()
    return _cached(key, compute)


def _dispatched_signature(branches: tuple) -> tuple[inspect.Signature, ...]:
    """The signature of a ``boolean_dispatch`` wrapper (``F.max_pool2d``): its branches' parameters,
    when they agree (names, kinds and defaults; the flag is one of them), as torch.fx's own argument
    normalisation takes it. symbolic_trace records every keyword of such a call, so without it a
    pattern leaving one at its default never matched. Return annotations differ and are dropped."""
    sigs = []
    for branch in branches:
        try:
            sig = inspect.signature(branch)
        except (TypeError, ValueError):
            return ()
        sigs.append(sig.replace(parameters=[p.replace(annotation=inspect.Parameter.empty)
                                            for p in sig.parameters.values()],
                                return_annotation=inspect.Signature.empty))
    if any(s != sigs[0] for s in sigs[1:]) or not _usable(sigs[0]):
        return ()
    return (sigs[0],)


def for_method(name: str) -> tuple[inspect.Signature, ...]:
    def compute() -> tuple[inspect.Signature, ...]:
        import torch

        function = getattr(torch, name, None)
        if function is None or not callable(function):
            return ()
        return for_function(function)

    return _cached(("method", name), compute)


def for_module(cls: type) -> tuple[inspect.Signature, ...]:
    def compute() -> tuple[inspect.Signature, ...]:
        try:
            sig = inspect.signature(cls.forward)
        except (TypeError, ValueError):
            return ()
        params = [p for name, p in sig.parameters.items() if name != "self"]
        sig = sig.replace(parameters=params)
        return (sig,) if _usable(sig) else ()

    return _cached(("module", cls), compute)


class _Shape:
    """What binding a call to one signature needs to know, worked out once per signature."""

    __slots__ = ("positional", "names", "required")

    def __init__(self, sig: inspect.Signature):
        kinds = inspect.Parameter
        params = list(sig.parameters.values())
        positional = []
        for p in params:
            if p.kind not in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD):
                break
            positional.append(p.name)
        # Only plain signatures take the shortcut: positional(-or-keyword) parameters, then
        # keyword-only ones, and no *args.
        plain = all(p.kind not in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD) for p in params)
        self.positional = tuple(positional) if plain else None
        self.names = frozenset(p.name for p in params if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY))
        self.required = tuple(p.name for p in params if p.default is _EMPTY
                              and p.kind not in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD))


_shapes: dict[int, tuple] = {}  # id(signature) -> (signature, _Shape); the signature keeps the id valid


def _shape(sig: inspect.Signature) -> _Shape:
    found = _shapes.get(id(sig))
    if found is None or found[0] is not sig:
        found = (sig, _Shape(sig))
        with _lock:
            _shapes[id(sig)] = found
    return found[1]


def bind(sig: inspect.Signature, args: tuple, kwargs: dict, *, partial: bool = False) -> Optional[dict[str, Any]]:
    """Parameter name -> value, as the call would bind, or None when it does not bind.

    Plain signatures (no ``*args``) are bound directly: positional arguments fill the leading
    parameters, keywords the rest by name, and every parameter without a default must be
    given. That is what ``Signature.bind`` decides for them, at a fraction of its cost (it is
    the matcher's most frequent call); anything else goes through ``Signature.bind``.
    """
    if not partial:
        shape = _shape(sig)
        positional = shape.positional
        if positional is not None and len(args) <= len(positional):
            bound = dict(zip(positional, args))
            if kwargs:
                names = shape.names
                for key, value in kwargs.items():
                    if key in bound or key not in names:
                        return None  # given twice, positional-only, or no such parameter
                    bound[key] = value
                bound = {name: bound[name] for name in sig.parameters if name in bound}  # parameter order
            for name in shape.required:
                if name not in bound:
                    return None
            return bound
    try:
        bound = sig.bind_partial(*args, **kwargs) if partial else sig.bind(*args, **kwargs)
    except TypeError:
        return None
    return dict(bound.arguments)


def default(sig: inspect.Signature, name: str) -> Any:
    """The default of parameter ``name``, or ``inspect.Parameter.empty``."""
    param = sig.parameters.get(name)
    if param is None:
        return _EMPTY
    if param.kind is inspect.Parameter.VAR_POSITIONAL:
        return ()
    return param.default


EMPTY = _EMPTY
