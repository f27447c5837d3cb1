"""The predicates ``where`` conditions may call by bare name, and what they compute.

The tables are plain dicts written out here (no registration side effects).
Importing this module does not import torch; the predicates import it when
called. A predicate receives evaluated condition values: tensors for
``get_attr`` captures (the parameter or buffer itself), :class:`TensorInfo`
-like metadata for captured nodes, or Python values for literals.
"""

from __future__ import annotations

from typing import Any, Callable


def _tensor(value: Any):
    import torch

    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (int, float, bool)):
        return torch.tensor(value)
    return None


def is_zero(value: Any) -> bool:
    """True when ``value`` is a constant (parameter, buffer or number) whose every element is 0."""
    t = _tensor(value)
    return t is not None and t.numel() > 0 and not t.is_meta and bool((t == 0).all())


def is_one(value: Any) -> bool:
    """True when ``value`` is a constant whose every element is 1."""
    t = _tensor(value)
    return t is not None and t.numel() > 0 and not t.is_meta and bool((t == 1).all())


def is_constant(value: Any) -> bool:
    """True for a parameter, buffer or literal: a value known before the model runs."""
    return _tensor(value) is not None


def is_scalar(value: Any) -> bool:
    """True for a Python number or a tensor with one element."""
    if isinstance(value, (int, float, bool)):
        return True
    shape = getattr(value, "shape", None)
    if shape is None:
        return False
    n = 1
    for d in shape:
        n *= int(d)
    return n == 1


def is_floating(value: Any) -> bool:
    """True when the value's dtype is a floating-point dtype."""
    dtype = getattr(value, "dtype", None)
    return bool(getattr(dtype, "is_floating_point", False))


def frozen(value: Any) -> bool:
    """True when ``value`` trains nothing: a tensor (parameter, buffer) that does not require grad, a
    module none of whose parameters requires grad, or computed-value metadata that does not
    require grad. The trainable-parameter guard (docs/semantics.md) lets a rewrite drop only
    parameters for which this holds, in a model that trains; a rule says ``where frozen(bn)`` when
    it means "only when these are not trained"."""
    parameters = getattr(value, "parameters", None)
    if callable(parameters) and not hasattr(value, "dtype"):  # a module
        return not any(p.requires_grad for p in parameters())
    requires_grad = getattr(value, "requires_grad", None)
    return requires_grad is False


PREDICATES: dict[str, Callable[..., Any]] = {
    "is_zero": is_zero,
    "is_one": is_one,
    "is_constant": is_constant,
    "is_scalar": is_scalar,
    "is_floating": is_floating,
    "frozen": frozen,
}

# The names the checker accepts (fxrules.lang.names.PREDICATE_NAMES) are these keys; a test keeps them equal.
