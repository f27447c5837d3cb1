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
        import torch
        from torch.fx import operator_schemas

        if isinstance(target, torch._ops.OpOverload):
            try:
                return (operator_schemas._torchscript_schema_to_signature(target._schema),)
            except Exception:
                return ()
        try:
            sigs = operator_schemas.get_signature_for_torch_op(target)
        except Exception:
            sigs = None
        if sigs:
            return tuple(s for s in sigs if _usable(s))
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


def bind(sig: inspect.Signature, args: tuple, kwargs: dict, *, partial: bool = False) -> Optional[dict[str, Any]]:
    """Parameter name -> value, as the call would bind, or None when it does not bind."""
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
