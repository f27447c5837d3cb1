"""Fuzzing the engine: random torch.fx graphs, the bundled rule library, invariants.

A Hypothesis strategy draws a *spec* (plain data: a shape, a list of operations with
the values they read, the outputs, a seed) and :func:`build` turns it into a
``torch.fx.GraphModule`` written with ``fx.Graph`` directly (no tracing), so the
graphs contain spellings a tracer never produces: double transposes of placeholders,
literal ``0``/``1``/``0.0`` operands on either side, ``get_attr`` of all-zero
parameters and buffers (float and int), ``torch.cat`` + ``torch.split`` with
``operator.getitem``, in-place mutations of intermediate values that are read again
afterwards, modules (Linear, ReLU, Dropout in eval, Identity, Conv2d/Conv1d +
BatchNorm in eval, nested under a container), and several outputs.

Every value of a graph has one shape: ``(3, 8)`` or ``(8, 8)`` ("2d") or
``(2, 4, 4, 4)`` ("4d"). In-place operations only write *fresh* tensors (results of
ops that allocate) that no other value aliases yet: the engine documents that it does
not track mutations through views, so the fuzzer does not generate them; it never
writes placeholders or parameters either, so running a graph is repeatable.

Invariants, for the whole library and for random subsets of it in random order,
checked after ``apply_rules(gm, rules, example_inputs=...)``:

* the result's graph lints and the result runs;
* its outputs equal the original's (``assert_close`` defaults; bit for bit when every
  rule of the set is ``[exact]``); the library has no ``[changes]`` rules;
* the input GraphModule is unchanged: code, state_dict values, the identity of its
  parameters and buffers;
* no in-place call disappeared (their count never drops);
* applying the same rules to ``result.module`` rewrites nothing (a fixpoint);
* in place (``inplace=True``), the caller's module gets the copying run's code, report,
  state_dict keys and outputs; interrupted at a drawn call of one of the primitives an in-place
  run edits with, it is left exactly as it was (``test_inplace.deep_snapshot``) and runs again.

The number of graphs comes from the Hypothesis profile (tests/conftest.py): ``ci``
(default) runs 100 per test, ``HYPOTHESIS_PROFILE=thorough`` 2,000 per test.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch import fx, nn
from torch.testing import assert_close

import fxrules
from fxrules.engine import driver
from fxrules.engine.program import compile_rules
from tests.engine.test_inplace import GRAPH_EDITS, Interrupting, assert_same_deep, deep_snapshot

RULES_DIR = Path(__file__).resolve().parents[2] / "rules"
LIBRARY = fxrules.load_rules(RULES_DIR).select(contracts=["exact", "approx"])  # not the [changes] swaps
NAMES = tuple(LIBRARY.names)

SHAPES = {"2d": ((3, 8), (8, 8)), "4d": ((2, 4, 4, 4),)}

# ---------------------------------------------------------------------------
# The catalogue
# ---------------------------------------------------------------------------

# The operations a graph is made of. Each reads values chosen by "picks" (the k-th most
# recent value of the pool: small picks make deep chains, large ones wide graphs).
UNARY_FRESH = ("torch.relu", "torch.sigmoid", "torch.tanh", "torch.neg", "operator.neg", "F.relu", "F.sigmoid",
               "F.tanh", "method.relu", "method.sigmoid", "method.tanh", "method.neg", "module.ReLU",
               "module.Sigmoid", "module.Tanh", "torch.abs")
DOUBLES = ("relu2", "neg2", "transpose2", "contiguous2", "sigmoid_relu")
BINARY = ("add", "mul", "torch.add", "add_self", "sub")
LITERAL = ("add_lit", "mul_lit", "radd_lit", "method.add_lit", "method.mul_lit", "torch.add_lit")
ALIASING = ("F.dropout", "flatten", "reshape", "reshape_flat", "view", "transpose", "contiguous", "module.Identity",
            "module.Dropout", "getattr_value")
OTHER = ("bias_add", "cat_split", "cat_chunk", "size_arith", "module_again", "module_attr")
INPLACE = ("add_", "mul_", "relu_", "torch.relu_", "F.relu_inplace", "module.ReLU_inplace", "iadd", "sigmoid_")
COMMON = UNARY_FRESH + DOUBLES + BINARY + LITERAL + ALIASING + OTHER + INPLACE

OPS_2D = COMMON + ("matmul", "linear", "linear_bn", "bn", "conv1d_bn")
OPS_4D = COMMON + ("matmul", "linear", "conv", "conv_bn", "bn")

LITERALS = (0, 1, 0, 1, 0.0, 1.0, -1, 2, 0.5, True)
ZERO_BIAS = ("zeros_param_last", "zeros_buffer_full", "zeros_param_row", "random_param_last", "zeros_int_buffer",
             "zeros_param_channel")


@dataclass(frozen=True)
class Op:
    name: str
    picks: tuple  # which values it reads: k-th most recent, modulo the pool size
    choice: int  # a free parameter (literal, dims, variant), interpreted per op
    keep: bool  # for in-place ops: put the (aliasing) result in the pool too


@dataclass(frozen=True)
class Spec:
    kind: str
    shape: tuple
    inputs: int
    ops: tuple
    outputs: tuple
    seed: int


# Spellings the rules match are drawn more often.
FAVOURED = ("relu2", "neg2", "transpose2", "contiguous2", "add_lit", "mul_lit", "bias_add", "add_self",
            "module.Dropout", "module.Identity", "F.dropout", "flatten", "linear_bn", "conv_bn", "add_", "relu_",
            "module_again", "module_attr")


def _op(kind: str) -> st.SearchStrategy:
    names = OPS_2D if kind == "2d" else OPS_4D
    names = names + tuple(n for n in FAVOURED if n in names)
    pick = st.one_of(st.integers(0, 2), st.integers(0, 30))  # mostly recent values: depth
    return st.builds(Op, name=st.sampled_from(names), picks=st.tuples(pick, pick), choice=st.integers(0, 63),
                     keep=st.booleans())


@st.composite
def graph_specs(draw) -> Spec:
    kind = draw(st.sampled_from(sorted(SHAPES)))
    shape = draw(st.sampled_from(SHAPES[kind]))
    ops = draw(st.one_of(st.lists(_op(kind), min_size=1, max_size=8), st.lists(_op(kind), min_size=8, max_size=32)))
    outputs = draw(st.lists(st.integers(0, 40), min_size=1, max_size=3))
    return Spec(kind, shape, draw(st.integers(1, 2)), tuple(ops), tuple(outputs), draw(st.integers(0, 2 ** 16)))


# ---------------------------------------------------------------------------
# Building a GraphModule from a spec
# ---------------------------------------------------------------------------

_FROZEN = "frozen"  # the storage of placeholders and parameters: never written


class _ModelSpecBuilder:
    """Builds the graph and the root module; tracks which values may be written in place."""

    def __init__(self, spec: Spec):
        self.spec = spec
        self.shape = spec.shape
        self.last = spec.shape[-1]
        self.graph = fx.Graph()
        self.root = nn.Module()
        self.root.add_module("block", nn.Module())  # a container: nested call_module targets
        self.pool: list = []  # (node, base): base is the node owning the storage, or _FROZEN
        self.aliases: dict = {}  # base node -> number of other pool values sharing its storage
        self.counter = 0
        self.modules: list = []  # (target, module) of every module created, in order
        self.biases: list = []  # get_attr nodes made by bias_add
        self.generator = torch.Generator().manual_seed(spec.seed)

    # -- the pool ----------------------------------------------------------------
    def fresh(self, node: fx.Node) -> fx.Node:
        self.pool.append((node, node))
        self.aliases.setdefault(node, 0)
        return node

    def alias(self, node: fx.Node, of: Any) -> fx.Node:
        base = self.base(of)
        self.pool.append((node, base))
        if base is not _FROZEN:
            self.aliases[base] = self.aliases.get(base, 0) + 1
        return node

    def frozen(self, node: fx.Node) -> fx.Node:
        self.pool.append((node, _FROZEN))
        return node

    def base(self, node: fx.Node) -> Any:
        for value, base in self.pool:
            if value is node:
                return base
        raise AssertionError(node)  # pragma: no cover

    def pick(self, k: int) -> fx.Node:
        return self.pool[-1 - (k % len(self.pool))][0]

    def writable(self, k: int) -> Optional[fx.Node]:
        """A fresh value nothing else aliases, searching back from the k-th most recent."""
        n = len(self.pool)
        for i in range(n):
            node, base = self.pool[-1 - ((k + i) % n)]
            if base is node and self.aliases.get(node, 0) == 0:
                return node
        return None

    # -- modules and attributes ------------------------------------------------
    def name(self, base: str) -> str:
        self.counter += 1
        return f"{base}{self.counter}"

    def module(self, base: str, module: nn.Module, nested: bool = False) -> str:
        name = self.name(base)
        if nested:
            self.root.block.add_module(name, module)
            name = f"block.{name}"
        else:
            self.root.add_module(name, module)
        self.modules.append((name, module))
        return name

    def randn(self, *shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=self.generator) * scale

    def seeded(self, build):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(torch.randint(0, 2 ** 30, (1,), generator=self.generator)))
            return build()

    def batch_norm(self, cls, features: int) -> nn.Module:
        bn = cls(features)
        with torch.no_grad():
            bn.running_mean.copy_(self.randn(features, scale=0.3))
            bn.running_var.copy_(torch.rand(features, generator=self.generator) + 0.5)
            bn.weight.copy_(torch.rand(features, generator=self.generator) + 0.5)
            bn.bias.copy_(self.randn(features, scale=0.3))
        return bn.eval()

    def get_attr(self, base: str, value: torch.Tensor, buffer: bool = False) -> fx.Node:
        name = self.name(base)
        if buffer:
            self.root.register_buffer(name, value)
        else:
            self.root.register_parameter(name, nn.Parameter(value, requires_grad=False))
        return self.graph.get_attr(name)

    # -- the graph ---------------------------------------------------------------
    def build(self) -> fx.GraphModule:
        g = self.graph
        for i in range(self.spec.inputs):
            self.frozen(g.placeholder(f"x{i}"))
        for op in self.spec.ops:
            self.emit(op)
        outputs = tuple(self.pick(k) for k in self.spec.outputs)
        g.output(outputs[0] if len(outputs) == 1 else outputs)
        gm = fx.GraphModule(self.root, g, class_name="Fuzzed")
        return gm.eval()

    def emit(self, op: Op) -> None:  # noqa: C901 - one branch per catalogue entry
        g, c, shape = self.graph, op.choice, self.shape
        a, b = self.pick(op.picks[0]), self.pick(op.picks[1])
        name = op.name
        fn = {"torch.relu": torch.relu, "torch.sigmoid": torch.sigmoid, "torch.tanh": torch.tanh,
              "torch.neg": torch.neg, "operator.neg": operator.neg, "F.relu": F.relu, "F.sigmoid": F.sigmoid,
              "F.tanh": F.tanh, "torch.abs": torch.abs}
        if name in fn:
            self.fresh(g.call_function(fn[name], (a,)))
        elif name.startswith("method.") and name in UNARY_FRESH:
            self.fresh(g.call_method(name.split(".")[1], (a,)))
        elif name in ("module.ReLU", "module.Sigmoid", "module.Tanh"):
            cls = getattr(nn, name.split(".")[1])
            self.fresh(g.call_module(self.module(cls.__name__.lower(), cls(), nested=c % 2 == 1), (a,)))
        elif name == "relu2":
            spellings = (lambda v: g.call_function(torch.relu, (v,)), lambda v: g.call_function(F.relu, (v,)),
                         lambda v: g.call_method("relu", (v,)),
                         lambda v: g.call_module(self.module("relu", nn.ReLU()), (v,)))
            inner = spellings[c % 4](a)
            self.fresh(spellings[(c // 4) % 4](inner))
        elif name == "sigmoid_relu":
            self.fresh(g.call_function(torch.relu, (g.call_function(torch.sigmoid, (a,)),)))
        elif name == "neg2":
            neg = (operator.neg, torch.neg)[c % 2]
            self.fresh(g.call_function(operator.neg, (g.call_function(neg, (a,)),)))
        elif name == "transpose2":
            dims = self.dims(c)
            second = dims if c % 5 else dims[::-1]  # sometimes (1, 2) then (2, 1): the same, spelt differently
            inner = g.call_method("transpose", (a, *dims))
            self.alias(g.call_method("transpose", (inner, *second)), a)
        elif name == "contiguous2":
            self.alias(g.call_method("contiguous", (g.call_method("contiguous", (a,)),)), a)
        elif name in ("add", "mul", "torch.add", "sub"):
            target = {"add": operator.add, "mul": operator.mul, "torch.add": torch.add, "sub": operator.sub}[name]
            self.fresh(g.call_function(target, (a, b)))
        elif name == "add_self":
            self.fresh(g.call_function(operator.add, (a, a)))
        elif name in LITERAL:
            lit = LITERALS[c % len(LITERALS)]
            if name == "add_lit":
                node = g.call_function(operator.add, (a, lit))
            elif name == "mul_lit":
                node = g.call_function(operator.mul, (a, lit))
            elif name == "radd_lit":
                node = g.call_function(operator.add, (lit, a))
            elif name == "torch.add_lit":
                node = g.call_function(torch.add, (a, lit))
            else:
                node = g.call_method(name.split(".")[1][:3], (a, lit))
            self.fresh(node)
        elif name == "F.dropout":
            args, kwargs = [((a, 0.5, False), {}), ((a,), {"p": 0.3, "training": False}),
                            ((a, 0.2), {"training": False})][c % 3]
            self.alias(g.call_function(F.dropout, args, kwargs), a)
        elif name == "flatten":
            flat = g.call_function(torch.flatten, (a, 1))
            if len(shape) == 2:
                self.alias(flat, a)
            else:
                self.alias(g.call_method("reshape", (flat, *shape)), a)
        elif name == "reshape":
            self.alias(g.call_method("reshape", (a, *shape)), a)
        elif name == "reshape_flat":
            self.alias(g.call_method("reshape", (g.call_method("reshape", (a, -1)), shape)), a)
        elif name == "view":
            self.alias(g.call_method("view", (g.call_method("contiguous", (a,)), *shape)), a)
        elif name == "transpose":
            if len(shape) == 4 or shape[0] == shape[1]:
                dims = self.dims(c)
                if c % 3 == 0:
                    self.alias(g.call_function(torch.transpose, (a, *dims)), a)
                else:
                    self.alias(g.call_method("transpose", (a, *dims)), a)
        elif name == "contiguous":
            self.alias(g.call_method("contiguous", (a,)), a)
        elif name == "module.Identity":
            self.alias(g.call_module(self.module("identity", nn.Identity(), nested=c % 2 == 1), (a,)), a)
        elif name == "module.Dropout":
            cls = (nn.Dropout, nn.AlphaDropout, nn.Dropout2d if len(shape) == 4 else nn.Dropout1d)[c % 3]
            self.alias(g.call_module(self.module("drop", cls(0.5).eval(), nested=c % 2 == 1), (a,)), a)
        elif name == "getattr_value":
            value = torch.zeros(shape) if c % 4 == 0 else self.randn(*shape)
            self.frozen(self.get_attr("const", value, buffer=c % 2 == 1))
        elif name == "matmul":
            w = self.get_attr("w", self.randn(self.last, self.last, scale=1 / math.sqrt(self.last)))
            self.fresh(g.call_function((torch.matmul, operator.matmul)[c % 2], (a, w)))
        elif name == "linear":
            lin = self.seeded(lambda: nn.Linear(self.last, self.last, bias=c % 3 != 0))
            self.fresh(g.call_module(self.module("fc", lin, nested=c % 2 == 1), (a,)))
        elif name == "linear_bn":
            lin = self.seeded(lambda: nn.Linear(self.last, self.last, bias=c % 3 != 0))
            inner = g.call_module(self.module("fc", lin, nested=c % 2 == 1), (a,))
            bn = self.batch_norm(nn.BatchNorm1d, self.last)
            self.fresh(g.call_module(self.module("bn", bn, nested=c % 2 == 1), (inner,)))
        elif name in ("conv", "conv_bn"):
            conv = self.seeded(lambda: nn.Conv2d(4, 4, 3, padding=1, bias=c % 3 != 0))
            node = g.call_module(self.module("conv", conv, nested=c % 2 == 1), (a,))
            if name == "conv_bn":
                node = g.call_module(self.module("bn", self.batch_norm(nn.BatchNorm2d, 4), nested=c % 2 == 1),
                                     (node,))
            self.fresh(node)
        elif name == "conv1d_bn":
            # an unbatched Conv1d on a (C, L) tensor, then BatchNorm1d(L), which reads the same
            # tensor as (N, C): the channel axes differ, so folding is wrong even when C == L
            rows = shape[0]
            conv = self.seeded(lambda: nn.Conv1d(rows, rows, 3, padding=1))
            node = g.call_module(self.module("conv", conv), (a,))
            self.fresh(g.call_module(self.module("bn", self.batch_norm(nn.BatchNorm1d, self.last)), (node,)))
        elif name == "bn":
            cls, features = (nn.BatchNorm1d, self.last) if len(shape) == 2 else (nn.BatchNorm2d, 4)
            self.fresh(g.call_module(self.module("bn", self.batch_norm(cls, features)), (a,)))
        elif name == "bias_add":
            if self.biases and c % 5 == 4:  # the same get_attr node again
                bias = self.biases[c % len(self.biases)]
            elif self.biases and c % 5 == 3:  # another get_attr node of the same attribute
                bias = g.get_attr(self.biases[c % len(self.biases)].target)
            else:
                bias = self.bias(ZERO_BIAS[c % len(ZERO_BIAS)])
            self.biases.append(bias)
            self.fresh(g.call_function(operator.add, (a, bias)))
        elif name == "module_again":  # a module called a second time, elsewhere
            callable_again = [(t, m) for t, m in self.modules if not getattr(m, "inplace", False)]
            if callable_again:
                target, module = callable_again[c % len(callable_again)]
                node = g.call_module(target, (a,))
                if isinstance(module, (nn.Identity, nn.modules.dropout._DropoutNd)):
                    self.alias(node, a)
                else:
                    self.fresh(node)
        elif name == "module_attr":  # a parameter or buffer of a called module, read with get_attr
            sources = [(f"{t}.{n}", v) for t, m in self.modules
                       for n, v in list(m.named_parameters()) + list(m.named_buffers())
                       if tuple(v.shape) in ((), (self.last,), (self.last, self.last))]
            if sources:
                target, value = sources[c % len(sources)]
                attr = g.get_attr(target)
                if value.ndim == 2:
                    self.fresh(g.call_function(torch.matmul, (a, attr)))
                else:
                    self.fresh(g.call_function(operator.add, (a, attr)))
        elif name in ("cat_split", "cat_chunk"):
            variant = c % 4
            dim = (0, 0, -1, len(shape) - 1)[variant]
            args, kwargs = [(([a, b],), {}), (([a, b], 0), {}), (([a, b],), {"dim": -1}),
                            (((a, b),), {"dim": dim})][variant]
            cat = g.call_function(torch.cat, args, kwargs)  # another shape: the owner of the pieces, not a value
            size = shape[dim]
            if name == "cat_chunk":
                parts = g.call_function(torch.chunk, (cat, 2, dim))
            elif c % 5:
                parts = g.call_function(torch.split, (cat, size, dim))
            else:
                parts = g.call_method("split", (cat, size), {"dim": dim})
            for index in (0, 1):
                self.pool.append((g.call_function(operator.getitem, (parts, index)), cat))
                self.aliases[cat] = self.aliases.get(cat, 0) + 1
        elif name == "size_arith":
            # scalar arithmetic on sizes, as traced models do: x.reshape(x.size(0) * 1, ...)
            size = g.call_method("size", (a, c % len(shape)))
            lit = (1, 0)[c % 2]
            n = g.call_function((operator.mul, operator.add)[c % 2], (size, lit))
            dims = list(shape)
            dims[c % len(shape)] = n
            self.alias(g.call_method("reshape", (a, *dims)), a)
        elif name in INPLACE:
            target = self.writable(op.picks[0])
            if target is None:
                return
            if name in ("add_", "mul_", "relu_", "sigmoid_"):
                args = (target,) if name in ("relu_", "sigmoid_") else (target, (1, 2, 0.5)[c % 3])
                node = g.call_method(name, args)
            elif name == "torch.relu_":
                node = g.call_function(torch.relu_, (target,))
            elif name == "F.relu_inplace":
                node = g.call_function(F.relu, (target,), {"inplace": True})
            elif name == "module.ReLU_inplace":
                node = g.call_module(self.module("relu_inplace", nn.ReLU(inplace=True)), (target,))
            else:
                node = g.call_function(operator.iadd, (target, 1))
            if op.keep:
                self.alias(node, target)
        else:  # pragma: no cover
            raise AssertionError(name)

    def dims(self, c: int) -> tuple:
        if len(self.shape) == 2:
            return ((0, 1), (1, 0), (-1, -2), (0, -1))[c % 4]
        return ((1, 2), (2, 3), (1, 3), (-1, -2), (3, 1), (-3, -1))[c % 6]

    def bias(self, kind: str) -> fx.Node:
        last, shape = self.last, self.shape
        if kind == "zeros_param_last":
            return self.get_attr("zero_bias", torch.zeros(last))
        if kind == "zeros_buffer_full":
            return self.get_attr("zero_buf", torch.zeros(shape), buffer=True)
        if kind == "zeros_param_row":
            return self.get_attr("zero_row", torch.zeros(1, last))
        if kind == "random_param_last":
            return self.get_attr("bias", self.randn(last, scale=0.1))
        if kind == "zeros_int_buffer":
            return self.get_attr("zero_int", torch.zeros(last, dtype=torch.int64), buffer=True)
        if len(shape) == 4:  # zeros_param_channel: per-channel, broadcast over H and W
            return self.get_attr("zero_channel", torch.zeros(4, 1, 1))
        return self.get_attr("zero_col", torch.zeros(shape[0], 1), buffer=True)


def build(spec: Spec) -> fx.GraphModule:
    return _ModelSpecBuilder(spec).build()


def example_inputs(spec: Spec) -> tuple:
    generator = torch.Generator().manual_seed(spec.seed + 1)
    return tuple(torch.randn(spec.shape, generator=generator) for _ in range(spec.inputs))


# ---------------------------------------------------------------------------
# Invariants
# ---------------------------------------------------------------------------


def is_inplace(node: fx.Node, gm: fx.GraphModule) -> bool:
    """An in-place call: a method or function whose name ends in `_`, iadd & co, inplace=True."""
    if node.op == "call_method":
        return node.target.endswith("_") and not node.target.endswith("__")
    if node.op == "call_function":
        name = getattr(node.target, "__name__", "")
        if name.endswith("_") and not name.endswith("__"):
            return True
        if node.target in (operator.iadd, operator.imul, operator.isub, operator.setitem):
            return True
        return node.kwargs.get("inplace") is True
    if node.op == "call_module":
        return getattr(gm.get_submodule(node.target), "inplace", False) is True
    return False


_VIEWS = frozenset({"view", "view_as", "transpose", "t", "permute", "reshape", "flatten", "unflatten", "unsqueeze",
                    "squeeze", "expand", "expand_as", "narrow", "select", "getitem", "contiguous", "detach", "split",
                    "chunk", "unbind", "as_strided", "diagonal", "movedim", "swapaxes", "type", "to", "float"})


_METADATA_METHODS = frozenset({"size", "dim", "ndimension", "numel", "nelement", "stride", "is_contiguous"})
"""Methods that read a tensor's metadata only: an in-place write of its values (relu_, add_) is not seen there."""


def _live(gm: fx.GraphModule) -> set:
    """The nodes whose values the output or an in-place call reads, transitively (and those themselves)."""
    live: set = set()
    stack = [n for n in gm.graph.nodes if n.op == "output" or is_inplace(n, gm)]
    while stack:
        node = stack.pop()
        if node not in live:
            live.add(node)
            stack.extend(node.all_input_nodes)
    return live


def _private_temporary(value: object, live: set) -> bool:
    """A value whose values only one in-place call reads, made by a call that is not (or may not be) a
    view: the engine may remove that call with a match (docs/language.md, in-place calls on a matched
    temporary), since its write cannot be observed. Readers that see no values do not count: a metadata
    read (``x.size(0)``) and a reader nothing live depends on (a dead ``x.reshape(...)``). Conservative:
    any name that may alias counts as a view."""
    if not isinstance(value, fx.Node) or value.op not in ("call_function", "call_method", "call_module"):
        return False
    name = value.target if isinstance(value.target, str) else getattr(value.target, "__name__", "")
    readers = [u for u in value.users if u in live and not (u.op == "call_method" and u.target in _METADATA_METHODS)]
    return len(readers) == 1 and name.rsplit(".", 1)[-1] not in _VIEWS


def inplace_count(gm: fx.GraphModule, *, observable_only: bool = False) -> int:
    """In-place calls; with ``observable_only``, those whose write is observable (a rewrite must keep
    those): not those writing a private temporary, which a rule may match and replace (fuse_linear_relu
    on `F.relu(linear(x), inplace=True)`). The invariant compares the observable ones before with all
    of them after: a rewrite may also make a write private (by removing the written value's other users)."""
    live = _live(gm) if observable_only else set()
    return sum(is_inplace(n, gm) and not (observable_only and n.args and _private_temporary(n.args[0], live))
               for n in gm.graph.nodes)


def snapshot(gm: fx.GraphModule) -> dict:
    return {
        "code": gm.code,
        "graph": str(gm.graph),
        "state": {k: v.detach().clone() for k, v in gm.state_dict().items()},
        "ids": [(k, id(v)) for k, v in gm.named_parameters(remove_duplicate=False)]
        + [(k, id(v)) for k, v in gm.named_buffers(remove_duplicate=False)],
        "modules": [(k, id(m)) for k, m in gm.named_modules(remove_duplicate=False)],
    }


def assert_unchanged(before: dict, gm: fx.GraphModule) -> None:
    after = snapshot(gm)
    assert after["code"] == before["code"], "apply_rules changed the input GraphModule's code"
    assert after["graph"] == before["graph"], "apply_rules changed the input GraphModule's graph"
    assert after["ids"] == before["ids"], "apply_rules replaced a parameter or buffer of the input"
    assert after["modules"] == before["modules"], "apply_rules replaced a submodule of the input"
    assert after["state"].keys() == before["state"].keys()
    for key, value in before["state"].items():
        assert torch.equal(after["state"][key], value), f"apply_rules changed {key} of the input"


def run(gm: fx.GraphModule, inputs: tuple) -> Any:
    with torch.no_grad():
        return gm(*(t.clone() for t in inputs))


def check_invariants(spec: Spec, rules: fxrules.RuleSet) -> None:
    gm = build(spec)
    gm.graph.lint()
    inputs = example_inputs(spec)
    expected = run(gm, inputs)
    before = snapshot(gm)
    inplace_before = inplace_count(gm, observable_only=True)

    result = fxrules.apply_rules(gm, rules, example_inputs=inputs)
    out = result.module

    assert_unchanged(before, gm)
    assert isinstance(out, fx.GraphModule) and out is not gm
    out.graph.lint()
    actual = run(out, inputs)
    contracts = {rules[name].contract for name in result.counts}
    assert contracts <= {"exact", "approx"}
    assert_close(actual, expected)
    if all(rule.contract == "exact" for rule in rules):
        assert_close(actual, expected, rtol=0, atol=0, equal_nan=True,
                     msg=lambda m: f"an [exact] rule set changed the outputs: {m}")
    assert inplace_count(out) >= inplace_before, "a rewrite dropped an in-place call whose write is observable"
    # the original still runs as it did (nothing it shares with the result was modified)
    assert_close(run(gm, inputs), expected, rtol=0, atol=0, equal_nan=True)

    again = fxrules.apply_rules(out, rules, example_inputs=inputs)
    assert not again.report.applied, (
        "the first run did not reach a fixpoint: a second run applied "
        + ", ".join(f"{a.rule} at {a.matched}" for a in again.report.applied))


def test_library_has_no_changes_rules():
    assert NAMES
    assert {rule.contract for rule in LIBRARY} <= {"exact", "approx"}
    assert len(fxrules.load_rules(RULES_DIR)) > len(LIBRARY)  # the [changes] swaps were left out


def test_the_builder_makes_valid_graphs():
    """Every catalogue entry builds, lints and runs on both kinds of shape."""
    for kind, shapes in SHAPES.items():
        for shape in shapes:
            names = OPS_2D if kind == "2d" else OPS_4D
            for choice in (0, 1, 2, 3, 5, 7):
                ops = tuple(Op(n, (0, 1), choice, True) for n in names)
                spec = Spec(kind, shape, 2, ops, (0, 1, 2), choice)
                gm = build(spec)
                gm.graph.lint()
                out = run(gm, example_inputs(spec))
                assert all(t.shape == shape for t in out)


@given(spec=graph_specs())
@pytest.mark.slow
def test_library_on_random_graphs(spec):
    check_invariants(spec, LIBRARY)


@st.composite
def rule_subsets(draw, names: tuple = NAMES) -> fxrules.RuleSet:
    names = draw(st.lists(st.sampled_from(names), min_size=1, max_size=len(names), unique=True))
    if draw(st.booleans()):
        return LIBRARY.select(names=names)  # library order
    ordered = LIBRARY.select(names=[names[0]])  # the drawn order: other priorities
    for name in names[1:]:
        ordered = ordered + LIBRARY.select(names=[name])
    return ordered


@given(spec=graph_specs(), rules=rule_subsets())
@pytest.mark.slow
def test_rule_subsets_on_random_graphs(spec, rules):
    check_invariants(spec, rules)


def _reads_no_capture(program) -> bool:
    """A single-root rule whose conditions are all module flags (``not d.training``): a set of such rules
    is revisited one level less deep after each rewrite (``engine.driver._revisit_reach``)."""
    return len(program.roots) == 1 and all(flag is not None for flag in program.flags)


LOCAL_NAMES = tuple(p.name for p in compile_rules(LIBRARY).programs if _reads_no_capture(p))


def test_the_library_has_rules_revisited_one_level_less():
    depths = {name: max(driver._pattern_depth(r) for r in compile_rules(LIBRARY.select(names=[name])).programs[0].roots)
              for name in LOCAL_NAMES}
    assert len(LOCAL_NAMES) >= 20 and max(depths.values()) >= 2  # nested patterns among them


@given(spec=graph_specs(), rules=rule_subsets(LOCAL_NAMES))
@pytest.mark.slow
def test_rules_reading_no_capture_on_random_graphs(spec, rules):
    """Sets of those rules (nested patterns, no condition on a capture) reach a fixpoint, revisiting one
    level less: the invariants, the fixpoint's included."""
    check_invariants(spec, rules)


def _outcome(gm: fx.GraphModule, rules: fxrules.RuleSet, inputs: Optional[tuple], *, shortcuts: bool) -> tuple:
    """What a run gives: its code, every rewrite (rule, matched, created, replaced by) in order and the refusals,
    or its error. ``shortcuts=False``: without direct matchers, with revisits to the full depth, and with the
    nodes that only lost users revisited through their users as touched nodes are (the interpreter and the
    revisits before them), switched for this run only."""
    saved = driver.direct_matcher, driver._revisit_reach, driver.apply_match
    if not shortcuts:
        apply_match = driver.apply_match

        def lost_revisited(work, match, plan):
            outcome = apply_match(work, match, plan)
            if not isinstance(outcome, tuple):  # a refusal
                return outcome
            entry, touched, lost = outcome
            return entry, touched | lost, set()

        driver.direct_matcher = lambda program: None
        driver._revisit_reach = lambda programs, depth: depth
        driver.apply_match = lost_revisited
    try:
        result = fxrules.apply_rules(gm, rules, example_inputs=inputs)
    except fxrules.RewriteError as exc:  # (no metadata for a condition, without inputs: both runs alike)
        return ("error", str(exc))
    finally:
        driver.direct_matcher, driver._revisit_reach, driver.apply_match = saved
    return (result.module.code, [(a.rule, a.matched, a.created, a.replaced_by) for a in result.report.applied],
            sorted((r.rule, r.matched, r.code) for r in result.report.rejected))


@given(spec=graph_specs(), rules=st.one_of(st.just(LIBRARY), rule_subsets(), rule_subsets(LOCAL_NAMES)),
       with_inputs=st.booleans())
@pytest.mark.slow
def test_direct_matchers_and_shallower_revisits_change_no_rewrite(spec, rules, with_inputs):
    """The same rewrites, in the same order, the same refusals and the same code with the direct matchers,
    the reach of ``_revisit_reach`` and the matches a node that lost users sends back, as with the
    interpreter alone, revisits to the full depth and those nodes' users revisited."""
    gm = build(spec)
    inputs = example_inputs(spec) if with_inputs else None
    assert _outcome(gm, rules, inputs, shortcuts=True) == _outcome(gm, rules, inputs, shortcuts=False)


# ---------------------------------------------------------------------------
# In place (apply_rules(..., inplace=True)): what a copying run gives, and all or nothing
# ---------------------------------------------------------------------------

@given(spec=graph_specs(), rules=st.one_of(st.just(LIBRARY), rule_subsets()), data=st.data())
@pytest.mark.slow
def test_in_place_on_random_graphs(spec, rules, data):
    """The whole library (most rewrites per graph) or a random subset of it in random order.
    An in-place run gives a copying run's result (code, report, state_dict keys, outputs) in the
    caller's own module. Interrupted at a drawn call of a drawn edit primitive (among the calls an
    uninterrupted run makes; test_inplace.GRAPH_EDITS), it leaves the module exactly as it was, and runs again to that result."""
    inputs = example_inputs(spec)
    copying = fxrules.apply_rules(build(spec), rules, example_inputs=inputs)
    owner, name = data.draw(st.sampled_from(GRAPH_EDITS), label="primitive")
    counting = build(spec)
    with Interrupting(owner, name) as counted:
        fxrules.apply_rules(counting, rules, example_inputs=inputs, inplace=True)
    gm = build(spec)
    if counted.calls:
        stop_at = data.draw(st.integers(1, counted.calls), label="interrupted at call")
        before = deep_snapshot(gm)
        with pytest.raises(KeyboardInterrupt), Interrupting(owner, name, stop_at, data.draw(st.booleans(), label="before")):
            fxrules.apply_rules(gm, rules, example_inputs=inputs, inplace=True)
        assert_same_deep(before, deep_snapshot(gm))
    result = fxrules.apply_rules(gm, rules, example_inputs=inputs, inplace=True)
    assert result.module is gm
    assert gm.code == copying.module.code
    assert result.report.applied == copying.report.applied
    assert gm.state_dict().keys() == copying.module.state_dict().keys()
    assert_close(run(gm, inputs), run(copying.module, inputs), rtol=0, atol=0, equal_nan=True)


# Graphs the fuzzer found that the bundled rules get wrong, kept as fixed regression cases
# (the shortest spec for each; see each id).
REGRESSIONS = {
    # fold_conv1d_bn folds a BatchNorm1d into an unbatched Conv1d on a 2-D (C, L) tensor, where the
    # batch norm's channel axis is L, not the conv's C; with C == L the builder cannot tell.
    "fold_conv1d_bn_unbatched_square": Spec("2d", (8, 8), 1, (Op("conv1d_bn", (0, 0), 0, False),), (0,), 0),
    # add_zero_bias on `0 + zero_param`: $x is the literal 0, and `$x.dtype` raises AttributeError.
    "add_zero_bias_literal_operand": Spec("4d", (2, 4, 4, 4), 1, (Op("getattr_value", (0, 0), 0, False),
                                                                   Op("radd_lit", (0, 0), 0, False)), (0,), 0),
    # mul_one on `x.size(0) * 1`: an int-valued node; with example_inputs the rule still fails,
    # claiming the graph has no shape/dtype metadata.
    "mul_one_on_size": Spec("2d", (3, 8), 1, (Op("size_arith", (0, 0), 0, False),), (0,), 0),
    "add_zero_on_size": Spec("4d", (2, 4, 4, 4), 1, (Op("size_arith", (0, 0), 1, False),), (0,), 0),
    # fold_conv2d_bn gives the folded conv the name `block.conv1`, so `get_attr block.conv1.bias`
    # elsewhere in the graph now reads the folded bias instead of the original one.
    "fold_conv2d_bn_with_get_attr_of_conv_bias": Spec("4d", (2, 4, 4, 4), 1, (Op("conv_bn", (0, 0), 1, False),
                                                                               Op("module_attr", (0, 0), 0, False)),
                                                      (0,), 0),
    # add_zero_bias made relu_1 stand in for `relu_1 + zero`; eval dropout then returned relu_1 itself
    # as the output, and the later `relu_1 += 1` changed it (found by the thorough profile).
    "alias_of_a_later_mutated_value_reaches_the_output": Spec(
        "2d", (3, 8), 1, (Op("torch.relu", (0, 0), 0, False), Op("torch.relu", (0, 0), 0, False),
                          Op("bias_add", (0, 0), 0, False), Op("F.dropout", (0, 0), 0, False),
                          Op("iadd", (0, 0), 0, False)), (0,), 0),
    # fuse_linear_relu fused `F.relu(linear(x), inplace=True)`: the in-place relu writes a temporary only it
    # reads, so removing it with the match is sound (the invariant counts observable in-place calls only;
    # found by the thorough profile after the in-place-temporaries work).
    "inplace_relu_on_a_private_linear_result_is_fused": Spec(
        "2d", (3, 8), 1, (Op("torch.relu", (0, 0), 0, False), Op("torch.relu", (0, 0), 0, False),
                          Op("linear", (0, 0), 0, False), Op("F.relu_inplace", (0, 0), 0, False)), (1,), 0),
    # The same fusion where the linear result is also read by `size(0)` (metadata: the write does not
    # change it) and by a `reshape` nothing uses: the write is still unobservable, the fusion sound and
    # the outputs equal (the invariant counted those readers as observers until the thorough profile
    # found this graph, 2026-12-06).
    "inplace_relu_on_a_linear_result_read_only_for_its_size_is_fused": Spec(
        "2d", (3, 8), 1, (Op("torch.relu", (0, 0), 0, False), Op("linear", (0, 0), 0, False),
                          Op("F.relu_inplace", (0, 0), 0, False), Op("torch.relu", (1, 0), 0, False),
                          Op("torch.relu", (0, 0), 0, False), Op("size_arith", (2, 0), 0, False)), (1,), 0),
}


@pytest.mark.parametrize("spec", list(REGRESSIONS.values()), ids=list(REGRESSIONS))
def test_regression_graphs(spec):
    check_invariants(spec, LIBRARY)
