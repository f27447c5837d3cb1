"""Users that only inspect a value: they do not keep an interior node of a match alive.

A match's interior node (matched, not a root) goes away with the rewrite, so a user outside the
match refuses it (``interior-used-outside``). Some users only read a value's metadata: export's
``aten._assert_tensor_metadata`` (inserted for every ``.to``/``.type`` call), ``getattr(x, "dtype")``
and the other metadata attributes, ``x.size()``/``x.dim()``/``x.numel()``, ``aten.sym_size.int`` and
``aten.sym_numel``. transformers' GPT-2, exported, asserts the dtype of its attention weights, an
interior node of the attention fusion. Such a user is settled instead of refusing the match:

* an **assertion** is *dropped* when it is implied: the inspected node's recorded metadata
  (``meta['val']``: what the engine's guards and the rules' conditions already rely on) has every
  property it asserts (dtype, device, layout, sizes, strides; sizes and strides compared as the guards
  compare them, symbolic ones by their expression). It can then only pass for the inputs the rewrite
  is made for, and it computes nothing. Without metadata it is not implied, and the match is refused;
* a **read** (its value is the metadata) is *re-pointed* to a root of the match whose recorded
  metadata has the same value for what it reads (the same dtype, the same size of that dim, ...), so
  it reads the replacement's value (the guards keep a root's shape, dtype and device under
  ``[exact]``/``[approx]``). It must come after every node of the match and every value the
  replacement reads, so that it can read the replacement without moving; otherwise, or when no root
  has the same value, the match is refused as before.

Only users whose one node argument is the inspected node count, every other argument a literal.
:func:`settle` is the planner's decision (pure); :func:`apply_settlement` is the transaction's edit.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import fx

aten = torch.ops.aten

ASSERTIONS = frozenset({aten._assert_tensor_metadata.default})
"""Calls that check a value's metadata and return nothing."""

_ATTRIBUTES = frozenset({"dtype", "device", "layout", "shape", "ndim", "is_cuda", "is_sparse", "is_quantized",
                         "is_meta", "is_floating_point"})
"""Attributes of a tensor ``getattr`` may read that are metadata (the same for the replacement's value
when they are equal on the recorded metadata)."""

_METHOD_READS = frozenset({"size", "dim", "numel"})
_FUNCTION_READS = frozenset({aten.sym_size.int, aten.sym_numel.default, aten.sym_size.default, aten.dim.default,
                             aten.numel.default})


@dataclass(frozen=True, slots=True)
class Settlement:
    """What the rewrite does with the inspecting users of a match's interior nodes: the assertions it
    drops, and the reads it re-points to a root (pairs ``(user, interior node, root)``)."""

    dropped: tuple = ()
    repointed: tuple = ()


NOTHING = Settlement()


def _only_node(user: fx.Node, node: fx.Node) -> bool:
    return user.all_input_nodes == [node]


def _tensor_val(node: fx.Node) -> Optional[torch.Tensor]:
    val = node.meta.get("val")
    return val if isinstance(val, torch.Tensor) else None


def _same(a: Any, b: Any) -> bool:
    """Equality as the guards compare sizes: symbolic values by their expression."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)) or \
            isinstance(b, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return str(a) == str(b)
    return bool(a == b)


def assertion_implied(user: fx.Node, node: fx.Node) -> bool:
    """Whether ``user`` is an assertion about ``node`` that its recorded metadata satisfies."""
    if user.op != "call_function" or user.target not in ASSERTIONS or user.users or not _only_node(user, node):
        return False
    val = _tensor_val(node)
    if val is None or user.args[:1] != (node,):
        return False
    names = ("size", "stride", "dtype", "device", "layout")
    given = dict(zip(names, user.args[1:]))
    given.update({k: v for k, v in user.kwargs.items() if k in names})
    if set(user.kwargs) - set(names):
        return False
    actual = {"size": list(val.shape), "stride": list(val.stride()), "dtype": val.dtype, "device": val.device,
              "layout": val.layout}
    return all(value is None or _same(list(value) if isinstance(value, (list, tuple)) else value, actual[name])
               for name, value in given.items())


def read_of(user: fx.Node, node: fx.Node) -> Optional[Any]:
    """What a reading user reads of ``node``, as a function of a tensor's metadata; None when ``user``
    is not a metadata read of ``node`` alone."""
    if not _only_node(user, node) or user.args[:1] != (node,):
        return None
    args, kwargs = user.args[1:], user.kwargs
    if user.op == "call_function" and user.target is builtins.getattr and len(args) == 1 and not kwargs \
            and args[0] in _ATTRIBUTES:
        name = args[0]
        return lambda t: (list(t.shape) if name == "shape" else getattr(t, name)() if name == "is_floating_point"
                          else getattr(t, name))
    if kwargs:
        return None
    method = user.target if user.op == "call_method" else None
    function = user.target if user.op == "call_function" and user.target in _FUNCTION_READS else None
    if method == "size" or function in (aten.sym_size.int, aten.sym_size.default):
        if not args:
            return lambda t: list(t.shape)
        if len(args) == 1 and isinstance(args[0], int):
            dim = args[0]
            return lambda t: t.shape[dim] if -t.ndim <= dim < t.ndim else None
        return None
    if args:
        return None
    if method == "dim" or function is aten.dim.default:
        return lambda t: t.ndim
    if method == "numel" or function in (aten.sym_numel.default, aten.numel.default):
        return lambda t: t.numel()
    return None


def settle(interior: fx.Node, user: fx.Node, roots: tuple, after: Any) -> Optional[Settlement]:
    """How the rewrite settles ``user`` (outside the match) of the interior node ``interior``; None when
    it cannot (the match is then refused). ``after``: the last node the replacement needs before it
    (a user re-pointed to a root must come later)."""
    if user.op == "call_function" and user.target in ASSERTIONS:
        return Settlement(dropped=(user,)) if assertion_implied(user, interior) else None
    read = read_of(user, interior)
    val = _tensor_val(interior)
    if read is None or val is None or (after is not None and not (after < user)):
        return None
    wanted = read(val)
    for root in roots:
        root_val = _tensor_val(root)
        if root_val is not None and wanted is not None and _same(read(root_val), wanted):
            return Settlement(repointed=((user, interior, root),))
    return None


def merge(settlements: list) -> Settlement:
    if not settlements:
        return NOTHING
    return Settlement(tuple(u for s in settlements for u in s.dropped),
                      tuple(r for s in settlements for r in s.repointed))


def apply_settlement(work: Any, settlement: Settlement) -> set:
    """Drop the implied assertions and re-point the reads (before the roots are replaced, so the
    replacement's ``replace_all_uses_with`` carries the reads to the new value), through the
    workpiece (:class:`fxrules.engine.transaction.Workpiece`: its ``erase`` and ``repoint`` keep its
    indexes and, in place, the journal). Returns the nodes touched."""
    touched: set = set()
    for user in settlement.dropped:
        work.erase(user)
    for user, interior, root in settlement.repointed:
        work.repoint(user, interior, root)
        touched.add(user)
    return touched
