"""Attention-shaped host graphs: what `fxrules verify` draws for a rule whose pattern is attention.

The general writer (:class:`fxrules.verifier.hosts.HostGraphWriter`) draws each capture on its own,
so for ``softmax(q @ k.transpose(-2, -1) * s [+ m]) [dropout] @ v`` it draws q, k and v of unrelated
ranks, the scale as a tensor, and the mask of any dtype: a rule with sound conditions (a literal
scale, matching float q/k/v) is almost never rewritten, and verify grades it ``weak``. This module
recognises an attention pattern (:func:`attention_roles`) and draws its captures together
(:class:`AttentionHostWriter`):

* **q, k, v** of one rank (2, 3 or 4; 3 for ``bmm``) with matching batch dims and head dims: q is
  ``(*batch, Lq, D)``, v is ``(*batch, Lk, Dv)``, and the key is laid out so that the pattern's key
  transpose or permute gives ``(*batch, D, Lk)``; their home, values and memory layout are drawn as
  for any input (so half precision, special values and strided inputs are drawn too);
* **the scale**: a Python number in the spellings models write (``0.125``, ``1 / sqrt(d)``,
  ``d ** -0.5``, ``sqrt(d)``, an int, ``1.0``, ``0``), and sometimes a 0-D tensor;
* **the mask**: floating, shaped as models shape it (``(B, 1, 1, Lk)``, ``(Lq, Lk)``, the scores'
  shape), and sometimes what a rule must refuse: a bool mask, a 1-D mask, a mask that broadcasts the
  scores larger;
* **values**: q, k, v, the scale and the mask are finite (drawn from every fill but ``special``:
  randn, uniform, zeros, ones, large). On a row of scores with no finite entry (a NaN in the
  query, an all ``-inf`` row) ``scaled_dot_product_attention`` returns 0 where the written-out
  softmax returns NaN (torch's handling of fully masked rows), and gradients through an infinite
  value differ: the SDPA fusions keep their ``[approx]`` contract on finite inputs only, the domain
  these hosts draw (``FINITE_ROLES``; docs/verify.md says so, tests/test_fuse.py shows the difference).
  Everything else in the host (upstream inputs, other captures) is drawn as usual.
* **the dropout probability**: 0.0, 0.1 or 0.5 (the pattern's training flag is used as written).
* **a bool mask** applied with ``torch.where(keep, scores, fill)`` or ``scores.masked_fill(drop, fill)``
  (``BOOL_MASK_SHAPES``: padding, square, causal, the scores' shape, or a near miss: 1-D, wider than
  the scores, floating), keeping at least one key of every query (``MASK_KEEPS_A_KEY``: the domain of
  fxrules/library/fuse/attention_bool_mask.fxr), and **the fill** (``FILL_SPELLINGS``: the dtype's
  minimum, float32's, ``-inf``, or a near miss that leaves masked keys a weight: ``-1e4``, ``0``;
  where the op takes a tensor, that value as a 0-d buffer or plain tensor attribute, read directly or,
  where the pattern says so, through the fresh copy torch.export detaches in place,
  ``detach_(lift_fresh_copy(c))``; or a 0-d input a rule must refuse).

And, so that the conditions of attention rules are tested against the spellings inductor's SDPA
fusions got wrong in 2026 (wrong outputs, silently):

* **a permuted key that is not ``key.transpose(-2, -1)``** (``KEY_NEAR_MISS``): in about one host in
  five the key position holds another permutation or transpose (``k.permute(0, 2, 3, 1)`` of a key
  laid out ``(B, Lk, H, D)``, ``k.transpose(1, 2)``, for 3-D ``bmm`` attention ``k.permute(1, 0, 2)``
  ...), with the key laid out so that the product still runs; where the pattern's permutation is a
  capture (``aten.permute.default($k, $perm)``) the capture takes that permutation, so a rule that
  treats the permutation as a wildcard is drawn with permutations it must not fuse. Sometimes the
  sizes are all equal, so that a wrong fusion runs and computes other values rather than raising.
* **the attention output reshaped** (``OUTPUT_TAILS``): the host's output is sometimes the attention
  output transposed back and reshaped to ``(*batch', Lq, H * Dv)``, or flattened, as models do; a
  rule whose match reaches into that reshape and changes the shape breaks the host's output.

Each such host is either not rewritten (and discarded, as any declined host) or rewritten and
compared like any other: a rule that fuses a near miss is graded ``wrong``. Patterns that are not
attention are drawn by the general writer (:func:`host_writer`).
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F
from hypothesis import reject
from hypothesis import strategies as st
from torch import fx

from fxrules.engine.program import PAlt, PBind, PCall, PCapture, PConst, PLiteral, PSeq, PWildcard
from fxrules.verifier.hosts import Host, HostGraphWriter
from fxrules.verifier.samplers import Param

aten = torch.ops.aten

_MATMULS = frozenset({torch.matmul, operator.matmul, "matmul", torch.bmm, "bmm", aten.matmul.default,
                      aten.bmm.default})
_BMMS = frozenset({torch.bmm, "bmm", aten.bmm.default})
_SOFTMAXES = frozenset({F.softmax, torch.softmax, "softmax", aten.softmax.int, aten._softmax.default})
_SCALES = frozenset({operator.mul, torch.mul, "mul", operator.truediv, torch.div, "div", aten.mul.Tensor,
                     aten.div.Tensor, aten.mul.Scalar, aten.div.Scalar})
_DETACHES_IN_PLACE = frozenset({aten.detach_.default})
_LIFTED_COPIES = frozenset({aten.lift_fresh_copy.default})
_ADDS = frozenset({operator.add, torch.add, "add", aten.add.Tensor})
_WHERES = frozenset({torch.where, aten.where.self, aten.where.ScalarOther})  # where(keep, scores, fill)
_MASKED_FILLS = frozenset({"masked_fill", torch.masked_fill, aten.masked_fill.Scalar,
                           aten.masked_fill.Tensor})  # (scores, drop, fill)
_DROPOUTS = frozenset({F.dropout, torch.dropout, aten.dropout.default})
_CASTS = frozenset({"to", "type", aten.to.dtype, aten._to_copy.default})
_TRANSPOSES = frozenset({"transpose", torch.transpose, aten.transpose.int})
_PERMUTES = frozenset({"permute", torch.permute, aten.permute.default})
_RESHAPES = _TRANSPOSES | _PERMUTES | frozenset({"reshape", "view", "flatten", "contiguous", torch.reshape,
                                                torch.flatten, aten.view.default, aten.reshape.default})

KEY_NEAR_MISS = (False, False, False, False, True)
"""Whether the key position holds a near miss (another permutation than the last two dims swapped)."""
OUTPUT_TAILS = ("none", "none", "none", "heads back", "flatten")
"""What reads the attention output: nothing more, ``.transpose(1, 2).reshape(*batch', Lq, -1)``
(4-D: the heads merged back into the hidden size), or ``.reshape(-1, Dv)``."""
FINITE_ROLES = ("query", "key", "value", "scale", "mask")
"""The parts drawn with finite values only (the SDPA fusions' domain: see the module docstring)."""
SCALE_SPELLINGS = ("0.125", "1/sqrt(d)", "d**-0.5", "sqrt(d)", "int", "1.0", "0", "tensor")
MASK_SHAPES = ("padding", "padding", "square", "scores", "scores", "bool", "1-D", "wider")
BOOL_MASK_SHAPES = ("padding", "square", "causal", "scores", "1-D", "wider", "float")
"""A bool mask's shapes (where's keep, masked_fill's drop): as models shape it, and near misses (1-D,
broadcasting the scores larger, a float mask: a rule must refuse each)."""
MASK_KEEPS_A_KEY = True
"""The bool-mask fusions' domain (fxrules/library/fuse/attention_bool_mask.fxr): every query keeps at
least one key; a drawn bool mask keeps one in each row (a row masking every key is averaged by the
written-out softmax with a finite fill, and is 0 in SDPA)."""
FILL_SPELLINGS = ("finfo.min", "finfo.min", "float32 min", "-inf", "-1e4", "0.0")
FILL_TENSOR_SOURCES = ("buffer", "buffer", "constant", "input")
"""Where a fill the op takes as a tensor comes from: a 0-d buffer, a 0-d plain tensor attribute (as
``torch.export``'s unlifted module keeps a constant it lifted out of forward), or an input (no constant)."""


@dataclass(frozen=True, slots=True)
class AttentionRoles:
    """Which capture of a pattern plays which part of attention (None: the pattern has no such part)."""

    query: str
    key: str
    value: str
    key_calls: tuple  # the PCall patterns that transpose or permute the key
    scale: Optional[str] = None
    mask: Optional[str] = None
    keep: Optional[str] = None  # a bool mask, True where a key is kept (torch.where's condition)
    drop: Optional[str] = None  # a bool mask, True where a key is dropped (masked_fill's mask)
    fill: Optional[str] = None  # the value where or masked_fill writes at masked keys
    dropout: Optional[str] = None
    bmm: bool = False  # a 3-D batched product: q, k and v are 3-D


def _kind(p: PCall, kinds: frozenset) -> bool:
    try:
        return p.targets[0] in kinds
    except TypeError:  # an unhashable target is none of these
        return False


def _options(p: Any) -> list:
    """The patterns ``p`` may be: the options of an alternation, through ``as`` names."""
    if isinstance(p, PBind):
        return _options(p.inner)
    if isinstance(p, PAlt):
        return [q for option in p.options for q in _options(option)]
    return [p]


def _through_lifted_copy(p: Any) -> Any:
    """``p`` with an option ``detach_(lift_fresh_copy(X))`` (how torch.export reads a constant written in
    forward) taken as ``X``: the fill is X either way. The host draws the option the pattern has
    (the copy and its detach, or X alone) and X as the fill."""
    options = []
    for option in _options(p):
        if isinstance(option, PCall) and _kind(option, _DETACHES_IN_PLACE) and len(_operands(option)) == 1:
            inner = _options(_operands(option)[0])
            if len(inner) == 1 and isinstance(inner[0], PCall) and _kind(inner[0], _LIFTED_COPIES) \
                    and len(_operands(inner[0])) == 1:
                option = _operands(inner[0])[0]
        options.extend(o for o in _options(option) if o not in options)
    return options[0] if len(options) == 1 else PAlt(tuple(options))


def _operands(p: PCall) -> list:
    """A call's positional operands as the pattern wrote them (bound to the signature where it was)."""
    if p.args is not None:
        return list(p.args)
    for _, mapping in p.overloads[:1]:
        return list(mapping.values())
    return []


class _Roles:
    """Walks a pattern from its root and records the captures' parts (see :func:`attention_roles`)."""

    def __init__(self):
        self.found: dict = {}
        self.key_calls: list = []
        self.bmm = False
        self.ok = True

    def assign(self, role: str, p: Any) -> None:
        options = _options(p)
        if options and all(isinstance(o, (PLiteral, PConst, PWildcard)) for o in options):
            return  # written as a literal (a scale of 0.125): nothing to draw
        if len(options) != 1 or not isinstance(options[0], PCapture):
            self.ok = False
            return
        name = options[0].name
        if self.found.get(role, name) != name:
            self.ok = False
        self.found[role] = name

    def output(self, p: Any) -> None:
        for option in _options(p):
            if isinstance(option, PCall) and _kind(option, _RESHAPES) and _operands(option):
                self.output(_operands(option)[0])  # the pattern reaches into the output's reshape
                continue
            if not (isinstance(option, PCall) and _kind(option, _MATMULS)) or len(_operands(option)) != 2:
                self.ok = False
                continue
            self.bmm = self.bmm or _kind(option, _BMMS)
            weights, value = _operands(option)
            self.weights(weights)
            self.assign("value", value)

    def weights(self, p: Any) -> None:
        seen = False
        for option in _options(p):
            if not isinstance(option, PCall):
                continue
            args = _operands(option)
            if _kind(option, _SOFTMAXES) and args:
                self.scores(args[0])
                seen = True
            elif (_kind(option, _DROPOUTS) or _kind(option, _CASTS)) and args:
                if _kind(option, _DROPOUTS) and len(args) > 1 and _options(args[1]) \
                        and isinstance(_options(args[1])[0], PCapture):
                    self.assign("dropout", args[1])
                self.weights(args[0])
                seen = True
        self.ok = self.ok and seen

    def scores(self, p: Any) -> None:
        for option in _options(p):
            if not isinstance(option, PCall):
                self.ok = False
                continue
            args = _operands(option)
            if _kind(option, _MATMULS) and len(args) == 2:
                self.bmm = self.bmm or _kind(option, _BMMS)
                self.query(args[0])
                self.key(args[1])
            elif _kind(option, _WHERES) and len(args) == 3:
                self.assign("keep", args[0])
                self.scores(args[1])
                self.assign("fill", _through_lifted_copy(args[2]))
            elif _kind(option, _MASKED_FILLS) and len(args) == 3:
                self.scores(args[0])
                self.assign("drop", args[1])
                self.assign("fill", _through_lifted_copy(args[2]))
            elif (_kind(option, _SCALES) or _kind(option, _ADDS)) and len(args) == 2:
                inner, other = (args[0], args[1]) if self.has_product(args[0]) else (args[1], args[0])
                self.scores(inner)
                self.assign("scale" if _kind(option, _SCALES) else "mask", other)
            else:
                self.ok = False

    def query(self, p: Any) -> None:
        for option in _options(p):
            if isinstance(option, PCall) and _kind(option, _SCALES) and len(_operands(option)) == 2:
                query, scale = _operands(option)
                self.assign("query", query)
                self.assign("scale", scale)
            else:
                self.assign("query", option)

    def key(self, p: Any) -> None:
        for option in _options(p):
            if isinstance(option, PCall) and (_kind(option, _TRANSPOSES) or _kind(option, _PERMUTES)) \
                    and _operands(option):
                self.assign("key", _operands(option)[0])
                self.key_calls.append(option)
            else:
                self.ok = False

    @staticmethod
    def has_product(p: Any) -> bool:
        for option in _options(p):
            if isinstance(option, PCall):
                if _kind(option, _MATMULS):
                    return True
                if any(_Roles.has_product(a) for a in _operands(option)):
                    return True
        return False


def attention_roles(roots: tuple) -> Optional[AttentionRoles]:
    """The parts the captures of a one-root pattern play in attention, ``matmul(W(scores(q, k)), v)``
    where W is a softmax over scores (possibly behind a dropout or a cast) and the scores are a product
    of the query (possibly scaled) and a transposed or permuted key, possibly scaled and with a mask
    added; None when the pattern is not of that shape (the general writer draws it)."""
    if len(roots) != 1:
        return None
    walk = _Roles()
    walk.output(roots[0])
    found = walk.found
    if not walk.ok or not {"query", "key", "value"} <= set(found) or len(set(found.values())) != len(found):
        return None
    return AttentionRoles(found["query"], found["key"], found["value"], tuple(walk.key_calls), found.get("scale"),
                          found.get("mask"), found.get("keep"), found.get("drop"), found.get("fill"),
                          found.get("dropout"), walk.bmm)


@dataclass(frozen=True, slots=True)
class AttentionShape:
    """The sizes of one drawn attention: q ``(*batch, lq, d)``, k ``(*batch, lk, d)``, v ``(*batch, lk, dv)``."""

    batch: tuple
    lq: int
    lk: int
    d: int
    dv: int

    @property
    def scores(self) -> tuple:
        return self.batch + (self.lq, self.lk)


class AttentionHostWriter(HostGraphWriter):
    """Writes an attention host (see the module docstring); everything else as the general writer."""

    def __init__(self, draw, catalogue, dtype, training, roles: AttentionRoles):
        super().__init__(draw, catalogue, dtype, training)
        self.roles = roles
        self.sizes = self.draw_shape()
        self.near_miss = draw(st.sampled_from(KEY_NEAR_MISS), label="key near miss")
        self.finite = False

    def fills(self, fills: tuple) -> tuple:
        return tuple(f for f in fills if f != "special") if self.finite else fills

    def finite_tensor(self, shape: tuple, param: Param) -> Any:
        """A tensor of finite values: attention's domain (see ``FINITE_ROLES``)."""
        self.finite = True
        try:
            return self.tensor(shape, param)
        finally:
            self.finite = False

    def draw_shape(self) -> AttentionShape:
        draw = self.draw
        rank = 3 if self.roles.bmm else draw(st.sampled_from([4, 4, 3, 2]), label="attention rank")
        if draw(st.sampled_from([False, False, False, True]), label="all sizes equal"):
            size = draw(st.integers(2, 4), label="size")  # a wrong fusion then runs and computes other values
            return AttentionShape((size,) * (rank - 2), size, size, size, size)
        batch = tuple(draw(st.lists(st.integers(1, 3), min_size=rank - 2, max_size=rank - 2), label="batch"))
        return AttentionShape(batch, draw(st.integers(1, 5), label="Lq"), draw(st.integers(1, 5), label="Lk"),
                              draw(st.sampled_from([1, 2, 4, 8]), label="head dim"),
                              draw(st.integers(1, 5), label="Dv"))

    # -- captures by their part -------------------------------------------------------------------
    def pattern(self, p: Any, param: Param, ctx: dict, ranks: Optional[tuple] = None) -> Any:
        if isinstance(p, PCapture) and p.name not in self.captures:
            drawn = self.by_role(p.name, param)
            if drawn is not _NONE:
                self.captures[p.name] = drawn
                return drawn
        return super().pattern(p, param, ctx, ranks)

    def by_role(self, name: str, param: Param) -> Any:
        roles, shape = self.roles, self.sizes
        if name == roles.query:
            return self.finite_tensor(shape.batch + (shape.lq, shape.d), param)
        if name == roles.value:
            return self.finite_tensor(shape.batch + (shape.lk, shape.dv), param)
        if name == roles.key:  # a key the pattern reads untransposed (its transpose call drew it otherwise)
            return self.finite_tensor(shape.batch + (shape.lk, shape.d), param)
        if name == roles.scale:
            return self.scale(param)
        if name == roles.mask:
            return self.mask(param)
        if name == roles.dropout:
            return self.draw(st.sampled_from([0.0, 0.1, 0.5]), label="dropout p")
        if name in (roles.keep, roles.drop):
            return self.bool_mask(param, keep=name == roles.keep)
        if name == roles.fill:
            return self.fill(param)
        return _NONE

    def scale(self, param: Param) -> Any:
        d = self.sizes.d
        spelling = self.draw(st.sampled_from(SCALE_SPELLINGS), label="scale")
        self.lines.append(f"scale written as {spelling}")
        if spelling == "tensor":
            return self.finite_tensor((), param)
        return {"0.125": 0.125, "1/sqrt(d)": 1 / math.sqrt(d), "d**-0.5": d ** -0.5, "sqrt(d)": math.sqrt(d),
                "int": self.draw(st.sampled_from([1, 2, 8]), label="int scale"), "1.0": 1.0, "0": 0}[spelling]

    def mask(self, param: Param) -> Any:
        shape = self.sizes
        kind = self.draw(st.sampled_from(MASK_SHAPES), label="mask")
        self.lines.append(f"mask: {kind}")
        if kind == "bool":
            return self.new_input(shape.scores, dtype=torch.bool)
        dims = {"padding": shape.batch[:1] + (1,) * (len(shape.batch) - 1) + (1, shape.lk),
                "square": (shape.lq, shape.lk), "scores": shape.scores, "1-D": (shape.lk,),
                "wider": (2,) + shape.scores}[kind]
        return self.finite_tensor(dims, param)

    def bool_mask(self, param: Param, keep: bool) -> Any:
        """A bool mask as models shape it (a padding mask ``(B, 1, 1, Lk)``, ``(Lq, Lk)``, a causal
        ``(1, 1, Lq, Lk)`` or the scores' shape), keeping at least one key of every query
        (``MASK_KEEPS_A_KEY``), or a near miss: 1-D, broadcasting the scores larger, floating."""
        shape = self.sizes
        kind = self.draw(st.sampled_from(BOOL_MASK_SHAPES), label="bool mask")
        self.lines.append(f"bool mask ({'keep' if keep else 'drop'}): {kind}")
        ones = (1,) * len(shape.batch)
        dims = {"padding": shape.batch[:1] + (1,) * (len(shape.batch) - 1) + (1, shape.lk),
                "square": (shape.lq, shape.lk), "causal": ones + (shape.lq, shape.lk), "scores": shape.scores,
                "1-D": (shape.lk,), "wider": (2,) + shape.scores, "float": shape.scores}[kind]
        if kind == "float":
            return self.finite_tensor(dims, param)
        if kind == "causal":
            kept = torch.ones(shape.lq, shape.lk, dtype=torch.bool).tril(shape.lk - shape.lq).reshape(dims)
        else:
            kept = torch.rand(dims, generator=self.generator) < 0.6
        if MASK_KEEPS_A_KEY:  # one kept key per row: the first where none was drawn
            none = ~kept.any(-1, keepdim=True)
            first = torch.zeros_like(kept)
            first[..., 0] = True
            kept = kept | (none & first)
        node = self.new_input(tuple(dims), dtype=torch.bool)
        self.inputs[-1].copy_(kept if keep else ~kept)
        self.values[node] = self.inputs[-1]
        return node

    def fill(self, param: Param) -> Any:
        """The value masked scores get: a number at most -1e30 as models write it (the dtype's min,
        float32's min, -inf), or a near miss that leaves masked keys a weight (-1e4, 0). Where the op
        takes a tensor there (``aten.where.self``, ``aten.masked_fill.Tensor``), that value as a 0-d
        tensor (``FILL_TENSOR_SOURCES``): a buffer of the host, as models keep it, or an input, whose
        value is not known when the rule is tried (a rule must refuse it)."""
        spelling = self.draw(st.sampled_from(FILL_SPELLINGS), label="fill")
        value = {"finfo.min": torch.finfo(self.dtype).min if self.dtype.is_floating_point else -1e4,
                 "float32 min": torch.finfo(torch.float32).min, "-inf": float("-inf"), "-1e4": -1e4,
                 "0.0": 0.0}[spelling]
        if param.kind == "number":
            self.lines.append(f"fill written as {spelling}")
            return value
        source = self.draw(st.sampled_from(FILL_TENSOR_SOURCES), label="fill tensor")
        self.lines.append(f"fill: a 0-d {source} holding {spelling}")
        dtype = self.dtype if self.dtype.is_floating_point else torch.float32  # -inf has no integer value
        tensor = torch.tensor(value, dtype=dtype)
        if source == "input":
            return self.new_input((), dtype=dtype)
        name = f"fill{len(self.lines)}"
        if source == "constant":
            setattr(self.root, name, tensor)
        else:
            self.root.register_buffer(name, tensor)
        node = self.graph.get_attr(name)
        self.values[node] = getattr(self.root, name)
        return node

    # -- the key -------------------------------------------------------------------------------------
    def op_call(self, p: PCall) -> Any:
        if p in self.roles.key_calls and self.roles.key not in self.captures:
            return self.key_call(p)
        return super().op_call(p)

    def key_call(self, p: PCall) -> Any:
        """The key transposed or permuted to ``(*batch, d, lk)`` for the product, as the pattern says
        (its dims literal or drawn), or, in a near-miss host, by another permutation."""
        shape = self.sizes
        rank = len(shape.batch) + 2
        target = shape.batch + (shape.d, shape.lk)
        swap = list(range(rank - 2)) + [rank - 1, rank - 2]
        operands = _operands(p)[1:]
        dims = [self.item(a) for a in operands]
        if len(dims) == 1 and isinstance(dims[0], list):
            dims = dims[0]
        if dims and all(isinstance(d, int) for d in dims):
            perm = _as_permutation(p, dims, rank)
            if perm is None:
                reject()  # the pattern's dims do not fit this rank: another host will do
            if self.near_miss:
                return self.near_miss_key(target, swap)
        elif _kind(p, _TRANSPOSES) and len(operands) == 2:
            pair = self.transpose_pair(rank)
            perm = list(range(rank))
            perm[pair[0] % rank], perm[pair[1] % rank] = perm[pair[1] % rank], perm[pair[0] % rank]
            for operand, dim in zip(operands, pair):
                if isinstance(operand, PCapture):
                    self.captures.setdefault(operand.name, dim)
                elif self.item(operand) != dim:
                    reject()
        else:
            perm = self.drawn_permutation(swap) if self.near_miss else swap
            if len(operands) == 1 and isinstance(operands[0], PCapture):  # permute($k, $perm)
                self.captures.setdefault(operands[0].name, list(perm))
            elif len(operands) == rank and all(isinstance(o, PCapture) for o in operands):
                for operand, dim in zip(operands, perm):
                    self.captures.setdefault(operand.name, dim)
            else:
                reject()
        if perm != swap:
            self.lines.append(f"the key is permuted by {perm} (a near miss)")
        self.captures[self.roles.key] = self.new_key(target, perm)
        return super().op_call(p)

    def transpose_pair(self, rank: int) -> tuple:
        """The two dims a transpose with drawn dims swaps: the last two (in either order, each written
        positive or negative, as models write them), or in a near-miss host two others."""
        draw = self.draw
        if self.near_miss and rank > 2:  # a 2-D key has no other pair of dims
            pairs = [(i, j) for i in range(rank) for j in range(i + 1, rank) if (i, j) != (rank - 2, rank - 1)]
            pair = draw(st.sampled_from(pairs), label="near-miss transpose")
        else:
            pair = (rank - 2, rank - 1)
        if draw(st.booleans(), label="transpose order"):
            pair = (pair[1], pair[0])
        return tuple(d - rank if draw(st.booleans(), label="negative dim") else d for d in pair)

    def item(self, p: Any) -> Any:
        if isinstance(p, PLiteral):
            return p.value
        if isinstance(p, PSeq) and all(isinstance(i, PLiteral) for i in p.items):
            return [i.value for i in p.items]
        return None

    def drawn_permutation(self, avoid: list) -> list:
        rank = len(avoid)
        perm = list(self.draw(st.permutations(list(range(rank))), label="key permutation"))
        if perm == avoid:
            reject()
        return perm

    def near_miss_key(self, target: tuple, swap: list) -> fx.Node:
        """Another permutation than ``swap``, written as a transpose when it swaps two dims."""
        perm = self.drawn_permutation(swap)
        key = self.new_key(target, perm)
        self.captures[self.roles.key] = key
        moved = [i for i in range(len(perm)) if perm[i] != i]
        if len(moved) == 2:
            node = self.graph.call_method("transpose", (key, moved[0], moved[1]))
        else:
            node = self.graph.call_method("permute", (key, *perm))
        value = self.values[key]
        self.values[node] = self.evaluate(lambda: value.permute(*perm))
        self.calls.append(node)
        self.lines.append(f"the key is read through {node.target}{tuple(node.args[1:])} (a near miss)")
        return node

    def new_key(self, target: tuple, perm: list) -> fx.Node:
        """A key laid out so that ``key.permute(perm)`` has shape ``target``."""
        stored = [0] * len(perm)
        for out_dim, in_dim in enumerate(perm):
            stored[in_dim] = target[out_dim]
        return self.finite_tensor(tuple(stored), Param("key", "tensor"))

    # -- the whole host -------------------------------------------------------------------------------
    def build(self, roots: tuple) -> Host:
        host = super().build(roots)
        tail = self.draw(st.sampled_from(OUTPUT_TAILS), label="attention output read by")
        root = host.roots[0] if host.roots else None
        if tail != "none" and isinstance(root, fx.Node) and isinstance(self.values.get(root), torch.Tensor):
            self.read_output(host, root, tail)
        return host

    def read_output(self, host: Host, root: fx.Node, tail: str) -> None:
        """Make the host's output ``root`` reshaped as models reshape attention's output."""
        value = self.values[root]
        output = next(n for n in self.graph.nodes if n.op == "output")
        if root not in output.all_input_nodes:
            return
        with self.graph.inserting_before(output):
            if tail == "heads back" and value.ndim == 4:
                moved = self.graph.call_method("transpose", (root, 1, 2))
                merged = self.graph.call_method("reshape", (moved, value.shape[0], value.shape[2], -1))
                self.evaluate(lambda: value.transpose(1, 2).reshape(value.shape[0], value.shape[2], -1))
            elif tail == "flatten":
                merged = self.graph.call_method("reshape", (root, -1, value.shape[-1]))
                self.evaluate(lambda: value.reshape(-1, value.shape[-1]))
            else:
                return
        output.args = fx.node.map_arg(output.args, lambda n: merged if n is root else n)
        self.lines.append(f"the attention output is read by {'.transpose(1, 2).reshape(B, Lq, -1)' if tail == 'heads back' else '.reshape(-1, Dv)'}")
        host.module.recompile()


_NONE = object()


def _as_permutation(p: PCall, dims: list, rank: int) -> Optional[list]:
    """The permutation a transpose or permute call with literal ``dims`` applies to a ``rank``-D tensor."""
    if any(not -rank <= d < rank for d in dims):
        return None
    dims = [d % rank for d in dims]
    if _kind(p, _TRANSPOSES):
        if len(dims) != 2:
            return None
        perm = list(range(rank))
        perm[dims[0]], perm[dims[1]] = perm[dims[1]], perm[dims[0]]
        return perm
    return dims if sorted(dims) == list(range(rank)) else None


def host_writer(roots: tuple):
    """The writer for a pattern: :class:`AttentionHostWriter` for attention, else the general one.
    Called as ``host_writer(roots)(draw, catalogue, dtype, training)``."""
    roles = attention_roles(roots)
    if roles is None:
        return HostGraphWriter

    def attention_writer(draw, catalogue, dtype, training):
        return AttentionHostWriter(draw, catalogue, dtype, training, roles)

    return attention_writer


__all__ = ["AttentionHostWriter", "AttentionRoles", "AttentionShape", "attention_roles", "host_writer",
           "KEY_NEAR_MISS", "OUTPUT_TAILS"]
