"""Host graphs for verification: a random model that contains a rule's pattern.

Given a compiled pattern (:mod:`fxrules.engine.program`) and hypothesis' ``draw``, a
:class:`HostGraphWriter` writes a torch.fx graph bottom up: every free capture and
``_`` becomes a model input (sometimes behind an upstream computation) or, in a
non-tensor position, a value drawn by the op's sampler (a valid dim, a
permutation, a probability ...); literals are used as written; every module
pattern becomes an instance of its type with constructor arguments and weights
drawn by the catalogue (:mod:`fxrules.verifier.samplers`) within the pattern's attribute
constraints. Each node is evaluated as it is added, so samplers see real shapes.
A combination that does not fit (an op raises, a module does not suit its input)
discards the host (``hypothesis.reject``), as do hosts the rule then declines.

:func:`missing_samplers` says up front which ops of a pattern the catalogue cannot
draw, so verification can report "no sampler for ..." instead of guessing.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import operator
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from hypothesis import reject
from hypothesis import strategies as st
from torch import fx, nn

from fxrules.engine import fxaccess
from fxrules.verifier import variadic_hosts
from fxrules.verifier.variadic_hosts import drawn_arguments
from fxrules.engine.program import (PAlt, PBind, PCall, PCapture, PConst, PGetAttr, PLiteral, PRef, PSeq, PVariadic,
                                   PWildcard)
from fxrules.verifier.samplers import TENSOR_KINDS, Catalogue, OpSampler, Param, describe_target

TENSOR = Param("input", "tensor")
_SEQUENCE_KINDS = frozenset({"perm", "dims", "shape", "stride", "padding", "dilation"})
_NUMBERS = (0, 1, -1, 2, 0.5, 1.0, 0.0, -2.5, 3)
_CONVERSIONS = (torch.float32, torch.float64, torch.float16, torch.int64, torch.int32, torch.bool, torch.complex64)

FILLS = ("randn", "randn", "randn", "uniform", "zeros", "ones", "large", "special", "special")
"""How an input's values are drawn (repeats weigh the draw). ``special`` mixes signed zeros,
subnormals, NaN, infinities and the dtype's huge and tiny magnitudes into normal values."""
ATTRIBUTE_FILLS = ("zeros", "ones", "randn", "randn", "special")
"""How a parameter's or buffer's values are drawn."""
LAYOUTS = ("contiguous", "contiguous", "contiguous", "transposed", "channels_last", "strided")
"""An input's memory layout: ``transposed`` (the last two dims swapped in memory), ``channels_last``
(4-D), ``strided`` (every other row of a buffer twice as long); the values are the same."""
SOURCES = ("input", "input", "input", "input", "parameter", "frozen parameter", "buffer")
"""Where a free tensor lives: a model input, a trainable parameter, a parameter with
``requires_grad=False``, or a buffer of the host (read with ``get_attr``)."""


def user_consumers(conditions: tuple, aliases: Any, resolver: Any) -> dict[str, tuple]:
    """For each ``used_only_by(NAME, T, ...)`` in a rule's conditions: NAME -> the targets T that can
    be called on a tensor alone (Tensor method names other than "output", and functions), so hosts can
    give a root the users its rule asks for (hosts returning the root only would never satisfy it)."""
    import fxrules.lang.ast as A
    from fxrules.lang.names import expand

    found: dict[str, tuple] = {}

    def dotted(cond: Any) -> Optional[tuple]:
        if isinstance(cond, A.CName):
            return (cond.name,)
        if isinstance(cond, A.CAttr):
            head = dotted(cond.value)
            return None if head is None else head + (cond.attr,)
        return None

    def visit(cond: Any) -> None:
        if isinstance(cond, A.CCall) and isinstance(cond.func, A.CName) and cond.func.name == "used_only_by" \
                and cond.args and isinstance(cond.args[0], (A.CName, A.CCapture)):
            targets = []
            for arg in cond.args[1:]:
                if isinstance(arg, A.CLiteral) and isinstance(arg.value, str) and arg.value != "output":
                    targets.append(arg.value)
                    continue
                chain = dotted(arg)
                if chain is None:
                    continue
                resolution = resolver.resolve(expand(chain, aliases) or ".".join(chain))
                if resolution.ok and callable(resolution.value) and not isinstance(resolution.value, type):
                    targets.append(resolution.value)
            found[cond.args[0].name] = tuple(targets)
        if dataclasses.is_dataclass(cond):
            for field in dataclasses.fields(cond):
                value = getattr(cond, field.name)
                for item in value if isinstance(value, tuple) else (value,):
                    if dataclasses.is_dataclass(item):
                        visit(item)

    for cond in conditions:
        visit(cond)
    return found


def missing_samplers(roots: tuple, catalogue: Catalogue) -> list[str]:
    """The ops (readable names) of a pattern that no sampler covers, and constructs hosts cannot hold."""
    missing: list[str] = []

    def visit(p: Any) -> None:
        if isinstance(p, PCall):
            target = p.targets[0]
            if p.op == "call_module":
                found = catalogue.module(target) is not None
            elif p.op == "call_method":
                found = catalogue.method(target) is not None
            else:
                found = catalogue.function(target) is not None
            if not found:  # functions by their name as written (an alias reads as the user wrote it)
                missing.append(p.label if p.op == "call_function" else describe_target(p.op, target))
            for arg in drawn_arguments(p, catalogue):
                visit(arg)
            for _, value in p.kwargs:
                visit(value)
            for sig_map in p.overloads[:1]:
                for value in sig_map[1].values():
                    visit(value)
        elif isinstance(p, PGetAttr) and p.capture is None:
            missing.append(f"get_attr {p.qualname} (a fixed attribute path)")
        elif isinstance(p, PVariadic):
            missing.append(f"*${p.name} (a variadic capture: hosts hold fixed argument lists)")
        elif isinstance(p, (PSeq, PAlt)):
            for item in (p.items if isinstance(p, PSeq) else p.options):
                visit(item)
        elif isinstance(p, PBind):
            visit(p.inner)

    for root in roots:
        visit(root)
    return list(dict.fromkeys(missing))


@dataclass
class Host:
    """A built host: the model, its inputs, and a description for counterexamples."""

    module: fx.GraphModule
    inputs: tuple
    dtype: torch.dtype
    training: bool
    lines: list  # human-readable facts: modules and their hyperparameters, inputs
    seed: int = 0  # the random state its runs start from (drawn, so a replay runs it the same)
    roots: tuple = ()  # the nodes (or values) the pattern's roots were written as, in order


class HostGraphWriter:
    """Writes one host graph for the pattern roots; see the module docstring."""

    def __init__(self, draw: Callable, catalogue: Catalogue, dtype: torch.dtype, training: bool):
        self.draw, self.catalogue, self.dtype, self.training = draw, catalogue, dtype, training
        self.consumers: dict[str, tuple] = {}  # root name -> users its rule allows (user_consumers)
        self.graph = fx.Graph()
        self.root = nn.Module()
        self.values: dict[fx.Node, Any] = {}
        self.captures: dict[str, Any] = {}
        self.names: dict[str, Any] = {}
        self.inputs: list[torch.Tensor] = []
        self.placeholders: list[fx.Node] = []
        self.calls: list[fx.Node] = []
        self.lines: list[str] = []
        self.module_calls: list[fx.Node] = []
        self.dressing: dict = {}
        self.perms: list[list] = []  # permutations drawn so far (a later one may undo one of them)
        self.seed = draw(st.integers(0, 2**31 - 1), label="input seed")
        self.generator = torch.Generator().manual_seed(self.seed)

    # -- the whole host ----------------------------------------------------------------
    def build(self, roots: tuple) -> Host:
        outputs = [self.pattern(root, TENSOR, {}) for root in roots]
        extra = [n for n in self.calls if n not in outputs and isinstance(self.values.get(n), torch.Tensor)]
        if extra and self.draw(st.booleans(), label="also output an inner value"):
            outputs.append(self.draw(st.sampled_from(extra), label="inner output"))
        if not any(isinstance(o, fx.Node) for o in outputs):
            reject()
        pattern_roots = tuple(outputs[:len(roots)])
        for index, root in enumerate(roots):  # only for rules reading their roots' users: other draws replay
            if isinstance(root, PBind) and self.consumers.get(root.name) and isinstance(outputs[index], fx.Node):
                outputs[index] = self.consumer(outputs[index], self.consumers[root.name])
        # sampled_from, not integers(0, n) == n: hypothesis rarely draws an integer range's far end
        if isinstance(outputs[0], fx.Node) and self.draw(st.sampled_from([False, True]), label="a view of the result"):
            outputs[0] = self.view_user(outputs[0])
        if self.module_calls and self.draw(st.sampled_from([False, False, True]), label="a module called twice"):
            outputs.append(self.shared_use(self.draw(st.sampled_from(self.module_calls), label="shared module")))
        outputs += self.view_write(list(pattern_roots))  # drawn last: the draws before it replay as they did
        self.graph.output(outputs[0] if len(outputs) == 1 else tuple(outputs))
        module = fx.GraphModule(self.root, self.graph, class_name="Host")
        module.training = self.training  # not train(): each submodule has its mode, a pattern's {training=...} too
        if any("written in place through" in line for line in self.lines):
            self.values = self.rerun(module)  # a write changed values computed before it (and their views)
        return Host(module, tuple(self.inputs), self.dtype, self.training, self.lines, self.seed, pattern_roots)

    def consumer(self, node: fx.Node, targets: tuple) -> fx.Node:
        """A user of a pattern root drawn from the targets its rule's ``used_only_by(name, T, ...)``
        allows (a function or method called on the root alone), or none (the root is returned
        as it is, so the condition is false and the rule must decline). Returns the new output."""
        choice = self.draw(st.sampled_from((None,) + targets), label="the result's user")
        if choice is None:
            return node
        if isinstance(choice, str):
            user = self.graph.call_method(choice, (node,))
            self.values[user] = self.evaluate(lambda: getattr(_clone(self.values[node]), choice)())
        else:
            user = self.graph.call_function(choice, (node,))
            self.values[user] = self.evaluate(lambda: choice(_clone(self.values[node])))
        self.lines.append(f"the result is read by {_target_name(choice)}")
        return user

    def view_write(self, outputs: list) -> list:
        """Sometimes an in-place write through a view (``x.transpose(0, 1).mul_(2)``, ``x[0].zero_()``,
        ``x.view(-1).add_(1)``) of a value the pattern reads or of its result: *before* the pattern
        (written before the first node that reads a captured input or inner value: what a condition
        reads must be the value at the match), or *after* it (of a capture: a rule replacing its result
        by that capture would carry the write; of the result: a rule making the result share storage
        with the capture would write the capture, so the capture is then an output too). Model inputs
        and inner values only: a write to a parameter or buffer would change the host's state between
        the runs that are compared. Returns the outputs to add."""
        choice = self.draw(st.sampled_from(["none"] * 5 + ["before", "after capture", "after result"]),
                           label="a write through a view")
        if choice == "none":
            return []
        captured = [v for v in self.captures.values() if isinstance(v, fx.Node) and v.op != "get_attr"
                    and isinstance(self.values.get(v), torch.Tensor)]
        if choice == "after result":
            result = outputs[0] if outputs and isinstance(outputs[0], fx.Node) else None
            if result is None or not captured or not isinstance(self.values.get(result), torch.Tensor):
                return []
            self.write_through_view(result, None)
            return [self.draw(st.sampled_from(captured), label="written capture is output")]
        if not captured:
            return []
        target = self.draw(st.sampled_from(captured), label="written value")
        if choice == "after capture":
            self.write_through_view(target, None)
            return []
        first_reader = min((user for user in target.users), default=None)
        if first_reader is None:
            return []
        self.write_through_view(target, first_reader)
        return []

    def write_through_view(self, node: fx.Node, before: Optional[fx.Node]) -> None:
        """Write ``node`` in place through a drawn view of it, after it or just before ``before``."""
        value = self.values[node]
        views = [v for v, ok in (("transpose", value.ndim >= 2), ("select", value.ndim >= 1 and value.shape[0] > 0),
                                 ("view", value.is_contiguous() and value.numel() > 0)) if ok]
        if not views:
            return
        view = self.draw(st.sampled_from(views), label="view written")
        write = self.draw(st.sampled_from(["add_", "mul_", "zero_"]), label="in-place write")
        # before a reader; or at the end (the graph's insertion point: its output is not written yet)
        with self.graph.inserting_before(before) if before is not None else contextlib.nullcontext():
            if view == "transpose":
                viewed = self.graph.call_method("transpose", (node, 0, 1))
            elif view == "select":
                viewed = self.graph.call_function(operator.getitem, (node, 0))
            else:
                viewed = self.graph.call_method("view", (node, -1))
            args = {"add_": (viewed, 1), "mul_": (viewed, 2), "zero_": (viewed,)}[write]
            self.graph.call_method(write, args)
        probe = _clone(value)
        self.evaluate(lambda: getattr({"transpose": lambda t: t.transpose(0, 1), "select": lambda t: t[0],
                                       "view": lambda t: t.view(-1)}[view](probe), write)(*args[1:]))
        text = {"transpose": ".transpose(0, 1)", "select": "[0]", "view": ".view(-1)"}[view]
        when = f"before %{before.name} reads it" if before is not None else "after the pattern"
        self.lines.append(f"%{node.name} is written in place through {node.name}{text}.{write} {when}")

    def rerun(self, module: fx.GraphModule) -> dict:
        """Every node's value after a run of the finished host on copies of its inputs (what its outputs are)."""
        by_name: dict = {}

        class Recorder(fx.Interpreter):
            def run_node(self, n: fx.Node) -> Any:
                by_name[n.name] = result = super().run_node(n)
                return result

        # on a copy (a train-mode batch norm's statistics stay as drawn), with the generators forked
        try:
            with torch.random.fork_rng(devices=[]), torch.no_grad():
                Recorder(copy.deepcopy(module)).run(*[fresh(t) for t in self.inputs])
        except Exception:
            return self.values  # the run decides (the host is discarded there if it does not run)
        return {n: by_name[n.name] for n in module.graph.nodes if n.name in by_name}

    def view_user(self, node: fx.Node) -> fx.Node:
        """``node.view(-1)``: a user that needs ``node``'s strides (a rewrite that changes them breaks it)."""
        value = self.values.get(node)
        if not isinstance(value, torch.Tensor):
            return node
        view = self.graph.call_method("view", (node, -1))
        self.values[view] = self.evaluate(lambda: value.view(-1))
        self.lines.append("the result is read by .view(-1)")
        return view

    def shared_use(self, node: fx.Node) -> fx.Node:
        """A second call of a pattern's module, on a new input: a shared module a rule must not change."""
        value = self.values.get(node.args[0])
        if not isinstance(value, torch.Tensor):
            reject()
        x = self.new_input(tuple(value.shape))
        second = self.graph.call_module(node.target, (x,))
        module = getattr(self.root, node.target)
        self.values[second] = self.evaluate(lambda: copy.deepcopy(module)(_clone(self.values[x])))
        self.lines.append(f"module {node.target} is called again, on {x.name}")
        return second

    # -- patterns -------------------------------------------------------------------------
    def pattern(self, p: Any, param: Param, ctx: dict, ranks: Optional[tuple] = None) -> Any:
        if isinstance(p, PCapture):
            if p.name not in self.captures:
                self.captures[p.name] = self.free(param, ctx, ranks)
            return self.captures[p.name]
        if isinstance(p, PWildcard):
            return self.free(param, ctx, ranks)
        if isinstance(p, (PLiteral, PConst)):
            return p.value
        if isinstance(p, PRef):
            if p.name not in self.names:
                reject()  # a reference before its binding: another host shape will do
            return self.names[p.name]
        if isinstance(p, PSeq):
            if param.kind in _SEQUENCE_KINDS:
                return self.sequence(list(p.items), param, ctx)
            item_param = Param(param.name, "tensor") if param.kind == "tensor_list" else Param(param.name, "number")
            return [self.pattern(item, item_param, ctx) for item in p.items]
        if isinstance(p, PAlt):
            option = self.draw(st.integers(0, len(p.options) - 1), label="alternative")
            return self.pattern(p.options[option], param, ctx, ranks)
        if isinstance(p, PBind):
            value = self.pattern(p.inner, param, ctx, ranks)
            self.names[p.name] = value
            return value
        if isinstance(p, PGetAttr):
            if p.capture is not None and p.capture in self.captures:
                return self.captures[p.capture]
            node = self.attribute(param, ctx, ranks)
            if p.capture is not None:
                self.captures[p.capture] = node
            return node
        if isinstance(p, PCall):
            if p.op == "call_module":
                return self.module_call(p)
            return self.op_call(p)
        raise TypeError(f"cannot build {p!r}")  # pragma: no cover - every pattern kind is handled

    # -- free values ------------------------------------------------------------------------
    def free(self, param: Param, ctx: dict, ranks: Optional[tuple]) -> Any:
        draw, kind = self.draw, param.kind
        of = self.value_of(ctx.get(param.of)) if param.of else None
        if kind in TENSOR_KINDS:
            return self.free_tensor(param, ctx, ranks, of)
        if kind == "number":
            return draw(st.sampled_from(_NUMBERS) | st.floats(-4, 4, allow_nan=False, width=32), label=param.name)
        if kind in ("dim", "dim_or_none", "dims", "perm", "shape") and not isinstance(of, (torch.Tensor, list)):
            reject()
        rank = of.ndim if isinstance(of, torch.Tensor) else (of[0].ndim if of else 0)
        if kind == "dim_or_none" and draw(st.booleans(), label=f"{param.name} is None"):
            return None
        if kind in ("dim", "dim_or_none"):
            if rank == 0:
                reject()
            return draw(st.integers(-rank, rank - 1), label=param.name)
        if kind == "dims":
            return sorted(draw(st.sets(st.integers(0, max(rank - 1, 0)), min_size=1, max_size=max(rank, 1)),
                               label=param.name))
        if kind == "perm":
            return self.permutation(rank, param.name)
        if kind == "shape":
            return self.reshape_target(of)
        if kind == "prob":
            return draw(st.sampled_from([0.0, 0.1, 0.5]), label=param.name)
        if kind == "bool":
            return draw(st.booleans(), label=param.name)
        if kind == "positive":
            return draw(st.sampled_from([0.01, 0.1, 0.5, 1.0, 2.0]), label=param.name)
        if kind == "gelu_approx":
            return draw(st.sampled_from(["none", "tanh"]), label=param.name)
        if kind == "dtype":
            return draw(st.sampled_from(_CONVERSIONS), label=param.name)
        if kind == "index_or_none":
            return draw(st.sampled_from([None, 0, 1, 2, -1, -2, 10]), label=param.name)
        if kind == "step":
            return draw(st.integers(1, 2), label=param.name)
        if kind == "length":
            return draw(st.integers(1, 5), label=param.name)
        if kind in ("index", "index_list"):
            node = self.index_input(of, ctx, param.name)
            return [node] if kind == "index_list" else node
        if kind == "index_source":
            return self.index_source(of, ctx, param)
        if kind == "false":
            return False
        if kind == "end_dim":
            if rank == 0:
                reject()
            start = ctx.get("start_dim", 0)
            start = start + rank if isinstance(start, int) and start < 0 else start
            end = draw(st.integers(start if isinstance(start, int) else 0, rank - 1), label=param.name)
            return end - rank if draw(st.booleans(), label=f"{param.name} negative") else end
        if kind in ("stride", "padding", "dilation"):
            low, high = {"stride": (1, 2), "padding": (0, 1), "dilation": (1, 2)}[kind]
            spatial = max(rank - 2, 1)
            return draw(st.lists(st.integers(low, high), min_size=spatial, max_size=spatial), label=param.name)
        if kind == "groups":
            x = self.value_of(ctx.get("input", ctx.get("self")))
            if not isinstance(x, torch.Tensor) or not isinstance(of, torch.Tensor) or x.ndim < 2 or of.ndim < 2 \
                    or x.shape[1] % of.shape[1]:
                reject()
            return x.shape[1] // of.shape[1]
        if kind == "tensor_list":
            shape = tuple(of.shape) if isinstance(of, torch.Tensor) else self.shape(ranks)
            return [self.new_input(shape) for _ in range(draw(st.integers(1, 3), label="list length"))]
        raise AssertionError(kind)  # pragma: no cover - Param checks kinds

    def free_tensor(self, param: Param, ctx: dict, ranks: Optional[tuple], of: Any) -> Any:
        """A tensor for one of the tensor kinds (``TENSOR_KINDS``): its shape from the kind, its
        home (input, parameter, buffer) drawn; None where the kind allows it and it was drawn."""
        draw, kind = self.draw, param.kind
        dtype = torch.bool if kind == "mask" else None
        if kind in ("tensor_like", "tensor_partner", "mask"):
            if not isinstance(of, torch.Tensor):
                return self.tensor(self.shape(ranks), param, dtype=dtype)
            choices = ["same", "same", "suffix", "scalar", "expand", "stretch"]
            if kind == "tensor_like":
                choices.append("number")
            choice = draw(st.sampled_from(choices), label="broadcast")
            if choice == "number":
                return draw(st.sampled_from(_NUMBERS), label=param.name)
            return self.tensor(self.partner_shape(tuple(of.shape), choice), param, dtype=dtype)
        if kind == "tensor":
            return self.tensor(self.shape(ranks), param)
        if not isinstance(of, torch.Tensor):
            reject()
        shape = self.kind_shape(kind, of, ctx)
        if shape is None:
            return None
        return self.tensor(shape, param, positive=kind == "variance")

    def index_input(self, of: Any, ctx: dict, label: str) -> fx.Node:
        """An int64 input of distinct row indices into ``of`` along the ``dim`` drawn before it (0
        without one): as ``x[i]`` and ``index_add`` take them, in bounds and unique."""
        dim = ctx.get("dim", 0)
        if not isinstance(of, torch.Tensor) or of.ndim == 0 or not isinstance(dim, int):
            reject()
        size = of.shape[dim]
        rows = self.draw(st.permutations(range(size)), label=label)[:self.draw(st.integers(1, size), label="rows")]
        node = self.new_input((len(rows),), dtype=torch.int64)
        self.values[node].copy_(torch.tensor(rows, dtype=torch.int64))
        return node

    def index_source(self, of: Any, ctx: dict, param: Param) -> fx.Node:
        """What ``index_add`` adds: ``self``'s shape with the indexed dim as long as the index ``of``."""
        x, dim = self.value_of(ctx.get("self")), ctx.get("dim", 0)
        if not isinstance(x, torch.Tensor) or not isinstance(of, torch.Tensor) or not isinstance(dim, int) \
                or x.ndim == 0:
            reject()
        shape = list(x.shape)
        shape[dim] = of.numel()
        return self.tensor(tuple(shape), param)

    def partner_shape(self, shape: tuple, choice: str) -> tuple:
        """A shape that broadcasts with ``shape``: the same, a suffix, a scalar, or one that
        *expands* it (``expand``: more leading dims; ``stretch``: its 1s made larger), so a rule that
        keeps one operand and drops the other is drawn with the kept one the smaller."""
        draw = self.draw
        if choice == "scalar":
            return ()
        if choice == "suffix" and shape:
            return shape[draw(st.integers(0, len(shape)), label="suffix start"):]
        if choice == "expand":
            lead = draw(st.lists(st.integers(2, 3), min_size=1, max_size=max(1, 4 - len(shape))), label="lead dims")
            return tuple(lead) + shape
        if choice == "stretch":
            if 1 not in shape:
                reject()
            return tuple(draw(st.integers(2, 3), label="stretched") if d == 1 else d for d in shape)
        return shape

    def kind_shape(self, kind: str, of: torch.Tensor, ctx: dict) -> Optional[tuple]:
        """The shape of the tensor a shape-bound kind draws (None: the kind drew None)."""
        draw = self.draw
        if kind == "matmul_rhs":
            if of.ndim == 0:
                reject()
            inner, columns = of.shape[-1], draw(st.integers(1, 4), label="columns")
            shape = (inner,) if draw(st.booleans(), label="vector rhs") else (inner, columns)
            if of.ndim > 2 and draw(st.booleans(), label="batched rhs"):
                shape = tuple(of.shape[:-2]) + (inner, columns)
            return shape
        if kind == "matrix_rhs":
            if of.ndim != 2:
                reject()
            return (of.shape[-1], draw(st.integers(1, 4), label="columns"))
        if kind == "bmm_rhs":
            if of.ndim != 3:
                reject()
            return (of.shape[0], of.shape[2], draw(st.integers(1, 4), label="columns"))
        if kind == "addmm_mat1":
            rows = of.shape[0] if of.ndim == 2 else draw(st.integers(1, 4), label="rows")
            return (rows, draw(st.integers(1, 4), label="inner"))
        if kind == "addmm_mat2":
            bias = self.value_of(ctx.get("input", ctx.get("self")))
            columns = bias.shape[-1] if isinstance(bias, torch.Tensor) and bias.ndim else 1
            return (of.shape[-1], columns)
        if kind == "conv_weight":
            if of.ndim < 3:
                reject()
            channels, size = of.shape[1], min(of.shape[2:])
            groups = draw(st.sampled_from([g for g in (1, 2) if channels % g == 0]), label="groups")
            out = draw(st.integers(1, 3), label="out channels") * groups
            kernel = draw(st.integers(1, max(1, min(3, size))), label="kernel")
            return (out, channels // groups) + (kernel,) * (of.ndim - 2)
        if kind == "conv_bias":
            return None if draw(st.booleans(), label="no bias") else (of.shape[0],)
        if of.ndim < 2:
            reject()
        if kind == "channels_or_none" and draw(st.booleans(), label="none"):
            return None
        return (of.shape[1],)  # channels, channels_or_none, variance

    def tensor(self, shape: tuple, param: Param, *, dtype: Optional[torch.dtype] = None,
               positive: bool = False) -> fx.Node:
        """A tensor value of the host: an input, or a parameter (trainable or frozen) or a buffer."""
        source = self.draw(st.sampled_from(SOURCES), label=f"{param.name} is")
        if source == "input" or dtype is torch.bool:
            return self.new_input(shape, dtype=dtype, positive=positive)
        return self.new_attribute(shape, source, positive=positive)

    def sequence(self, items: list, param: Param, ctx: dict) -> list:
        """A dims/permutation/shape argument written item by item (``permute($x, $a, $b)``): the
        whole value is drawn by its kind and its open items take their part of it; a variadic
        capture last (``permute($x, *$dims)``) takes the rest (:func:`fxrules.verifier.variadic_hosts.rest_of`)."""
        def is_open(item: Any) -> bool:
            return isinstance(item, PWildcard) or (isinstance(item, PCapture) and item.name not in self.captures)

        if items and isinstance(items[-1], PVariadic):
            return variadic_hosts.rest_of(self, items, param, ctx)
        full = None
        if param.kind in _SEQUENCE_KINDS and any(is_open(i) for i in items):
            full = self.free(param, ctx, None)
            if len(full) != len(items):
                reject()
        out = []
        for index, item in enumerate(items):
            if full is not None and is_open(item):
                if isinstance(item, PCapture):
                    self.captures[item.name] = full[index]
                out.append(full[index])
            else:
                out.append(self.pattern(item, Param(param.name, "number"), ctx))
        return out

    def permutation(self, rank: int, label: str) -> list:
        """A permutation of ``rank`` dims; sometimes the inverse of one drawn earlier in this host, so
        that ``permute(permute(x, p), q)`` with q undoing p (1 in 24 pairs for 4 dims) is drawn often
        enough for a rule about it to be checked on several hosts."""
        earlier = [p for p in self.perms if len(p) == rank]
        if earlier and self.draw(st.sampled_from([False, True]), label=f"{label} undoes an earlier one"):
            undone = self.draw(st.sampled_from(earlier), label=f"{label} undoes")
            perm = [undone.index(i) for i in range(rank)]
        else:
            perm = list(self.draw(st.permutations(list(range(rank))), label=label))
        self.perms.append(perm)
        return perm

    def shape(self, ranks: Optional[tuple]) -> tuple:
        low, high = ranks or (1, 4)
        rank = self.draw(st.integers(low, high), label="rank")
        return tuple(self.draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank), label="shape"))

    def reshape_target(self, of: torch.Tensor) -> list:
        n = of.numel()
        options = [[n], [-1], list(of.shape), list(reversed(of.shape))]
        if of.ndim >= 1:
            options += [[of.shape[0], -1], [-1, of.shape[-1]]]
        if of.ndim >= 2:
            options.append([of.shape[0] * of.shape[1]] + list(of.shape[2:]))
        # back to the shape of an input with as many elements (a chain of reshapes that returns to x's
        # shape: on a strided x the last reshape may then be a view of x where the chain made a copy)
        options += [list(t.shape) for t in self.inputs if t.numel() == n and list(t.shape) not in options]
        target = self.draw(st.sampled_from(options), label="reshape to")
        if -1 not in target and _product(target) != n:
            reject()
        return target

    def new_input(self, shape: tuple, *, dtype: Optional[torch.dtype] = None, positive: bool = False) -> fx.Node:
        dtype = dtype or self.dtype
        fill = self.draw(st.sampled_from(self.fills(FILLS)), label="input values")
        layout = self.draw(st.sampled_from(LAYOUTS), label="layout")
        tensor = _laid_out(_values(fill, shape, dtype, self.generator, positive), layout)
        if tensor is None:
            layout, tensor = "contiguous", _values(fill, shape, dtype, self.generator, positive)
        name = f"x{len(self.inputs)}"
        anchor = next((n for n in self.graph.nodes if n.op != "placeholder"), None)
        if anchor is None:
            node = self.graph.placeholder(name)
        else:
            with self.graph.inserting_before(anchor):
                node = self.graph.placeholder(name)
        self.values[node] = tensor
        self.inputs.append(tensor)
        where = "" if layout == "contiguous" else f", {layout}"
        self.lines.append(f"input {name}: {_dtype_name(dtype)}{list(shape)} ({fill}{where})")
        if self.draw(st.integers(0, 3), label="upstream computation") == 3 and dtype is not torch.bool:  # shrinks to none
            up = self.graph.call_function(torch.add, (node, 0.25))
            self.values[up] = self.evaluate(lambda: tensor + 0.25)
            return up
        return node

    def fills(self, fills: tuple) -> tuple:
        """The fills the next tensor's values are drawn from (a subclass narrows them for some tensors)."""
        return fills

    def new_attribute(self, shape: tuple, source: str, *, positive: bool = False) -> fx.Node:
        """A parameter (``source``: "parameter", "frozen parameter") or buffer of the host, read with get_attr."""
        fill = self.draw(st.sampled_from(self.fills(ATTRIBUTE_FILLS)), label="attribute values")
        name = f"attr{len(self.lines)}"
        value = _values(fill, shape, self.dtype, self.generator, positive)
        if source == "buffer" or not (value.is_floating_point() or value.is_complex()):
            source = "buffer"
            self.root.register_buffer(name, value)
        else:
            self.root.register_parameter(name, nn.Parameter(value, requires_grad=source == "parameter"))
        node = self.graph.get_attr(name)
        self.values[node] = getattr(self.root, name).detach()
        self.lines.append(f"{source} {name}: {_dtype_name(self.dtype)}{list(shape)} ({fill})")
        return node

    def attribute(self, param: Param, ctx: dict, ranks: Optional[tuple]) -> fx.Node:
        """A parameter or buffer of the host model, read with get_attr (a pattern's ``get_attr $w``)."""
        of = self.value_of(ctx.get(param.of)) if param.of else None
        if param.kind in ("tensor_like", "tensor_partner") and isinstance(of, torch.Tensor):
            choice = self.draw(st.sampled_from(["same", "suffix", "scalar", "expand", "stretch"]),
                               label="attribute broadcasts")
            shape = self.partner_shape(tuple(of.shape), choice)
        elif param.kind in TENSOR_KINDS and param.kind not in ("tensor", "mask") and isinstance(of, torch.Tensor):
            shape = self.kind_shape(param.kind, of, ctx)
            if shape is None:
                reject()
        else:
            shape = self.shape(ranks)
        source = self.draw(st.sampled_from(["parameter", "frozen parameter", "buffer"]), label="attribute is")
        return self.new_attribute(shape, source, positive=param.kind == "variance")

    # -- calls ---------------------------------------------------------------------------------
    def module_call(self, p: PCall) -> fx.Node:
        cls = p.targets[0]
        sampler = self.catalogue.module(cls)
        args = list(p.args or ())
        if not args:
            for _, mapping in p.overloads[:1]:
                args = list(mapping.values())
        x = self.pattern(args[0], TENSOR, {}, sampler.input_rank) if args else self.new_input(
            self.shape(sampler.input_rank))
        if len(args) > 1:
            reject()  # modules with several inputs have no samplers yet
        value = self.value_of(x)
        if not isinstance(value, torch.Tensor):
            reject()
        overrides, free_attrs, training = {}, [], None
        for name, attr in p.attrs:
            if name == "training":
                if isinstance(attr, PLiteral):
                    training = bool(attr.value)
                continue
            if isinstance(attr, (PLiteral, PConst)):
                overrides[name] = attr.value
            elif isinstance(attr, PSeq) and all(isinstance(i, PLiteral) for i in attr.items):
                overrides[name] = tuple(i.value for i in attr.items)
            else:
                free_attrs.append((name, attr))
        module = sampler.build(self.draw, value, overrides)
        if module is None or _crashes_torch(cls.__name__, value, getattr(module, "dilation", 1)):
            reject()
        if self.dtype.is_floating_point or self.dtype.is_complex:
            module = module.to(self.dtype)
        module.train(self.training if training is None else training)
        module = self.dress(module, cls)
        for name, attr in free_attrs:  # `Conv2d{kernel_size=$k}` binds what was drawn
            if isinstance(attr, PCapture) and attr.name not in self.captures:
                self.captures[attr.name] = getattr(module, name, None)
        target = f"m{len(fxaccess.children(self.root))}"  # one submodule per module call
        self.root.add_module(target, module)
        self.lines.append(f"module {target}: {module!r}" + (" (training)" if module.training else " (eval)")
                          + self.dressing.pop(module, ""))
        node = self.graph.call_module(target, (x,))
        self.values[node] = self.evaluate(lambda: copy.deepcopy(module)(_clone(value)))
        self.calls.append(node)
        self.module_calls.append(node)
        return node

    def dress(self, module: nn.Module, cls: type) -> nn.Module:
        """What a real model's module may be beyond its type: an instance of the pattern's subclass
        (its nearest base's sampler built it), of a drawn subclass that overrides a method its
        ``forward`` calls, or one with a forward hook, frozen parameters, or parameters tied to an
        earlier module's. Each is written into the facts."""
        notes = []
        if type(module) is not cls and issubclass(cls, type(module)):
            module.__class__ = cls
        kind = self.draw(st.sampled_from(["plain"] * 6 + ["hooked", "subclass", "frozen", "tied"]), label="module is")
        if kind == "subclass":
            sub = _overriding_subclass(type(module))
            if sub is not None:
                module.__class__ = sub
                notes.append(f"a subclass {sub.__name__} whose {', '.join(sub.overrides)} scales its result")
        elif kind == "hooked":
            module.register_forward_hook(_scale_output)
            notes.append("a forward hook doubles its output")
        elif kind == "frozen":
            module.requires_grad_(False)
            notes.append("parameters frozen")
        elif kind == "tied":
            earlier = next((m for m in fxaccess.children(self.root).values() if type(m) is type(module)), None)
            tied = _tie(module, earlier) if earlier is not None else []
            if tied:
                notes.append(f"{', '.join(tied)} tied to an earlier module's")
        if notes:
            self.dressing[module] = " [" + "; ".join(notes) + "]"
        return module

    def op_call(self, p: PCall) -> Any:
        target = p.targets[0]
        sampler = self.catalogue.method(target) if p.op == "call_method" else self.catalogue.function(target)
        mapping = self.bind(p, sampler)
        ctx: dict = {}
        for index, param in enumerate(sampler.params):
            ranks = (sampler.min_rank, sampler.max_rank) if index == 0 else None
            if param.name in mapping:
                given = mapping[param.name]
                if param.var and isinstance(given, list):
                    if len(given) == 1 and isinstance(given[0], PSeq):  # x.permute([1, 0]) as x.permute(1, 0)
                        given = list(given[0].items)
                    ctx[param.name] = self.sequence(given, param, ctx)
                else:
                    ctx[param.name] = self.pattern(given, param, ctx, ranks)
            elif not param.optional and (p.args is None or p.rest or index >= len(mapping)):
                ctx[param.name] = self.free(param, ctx, ranks)
        if sampler.at_least_one and not any(name in ctx for name in sampler.at_least_one):
            first = next(param for param in sampler.params if param.name == sampler.at_least_one[0])
            ctx[first.name] = self.free(first, ctx, None)  # clamp() with no bound raises
        args, kwargs, skipped = [], {}, False
        keyword_only = _keyword_only(p)
        for param in sampler.params:
            if param.name not in ctx:
                skipped = True
                continue
            value = ctx[param.name]
            if param.var:
                args.extend(value if isinstance(value, (list, tuple)) else [value])
            elif skipped or param.name in keyword_only:
                kwargs[param.name] = value
            else:
                args.append(value)
        if _crashes_torch(_target_name(target), self.value_of(args[:1]), ctx.get("dilation", 1)):
            reject()
        if p.op == "call_method":
            node = self.graph.call_method(target, tuple(args), kwargs)
            method = target

            def run():
                values = [self.value_of(a) for a in args]
                return getattr(_clone(values[0]), method)(*values[1:], **self.concrete(kwargs))
        else:
            node = self.graph.call_function(target, tuple(args), kwargs)

            def run():
                return target(*[_clone(self.value_of(a)) for a in args], **self.concrete(kwargs))
        self.values[node] = self.evaluate(run)
        self.calls.append(node)
        return node

    def bind(self, p: PCall, sampler: OpSampler) -> dict:
        """Parameter name -> pattern, by the signature the compiler bound, else positionally."""
        names = {param.name for param in sampler.params}
        if p.op != "call_method":
            for _, mapping in p.overloads:
                if set(mapping) <= names:
                    return dict(mapping)
        mapping: dict = {}
        positional = list(p.args or ())
        for param in sampler.params:
            if not positional:
                break
            if param.var:
                mapping[param.name], positional = positional, []
            else:
                mapping[param.name] = positional.pop(0)
        if positional:
            reject()  # more arguments than the sampler knows
        for name, value in p.kwargs:
            if name not in names:
                reject()
            mapping[name] = value
        return mapping

    # -- values ----------------------------------------------------------------------------------
    def value_of(self, item: Any) -> Any:
        if isinstance(item, fx.Node):
            return self.values.get(item)
        if isinstance(item, (list, tuple)):
            return type(item)(self.value_of(i) for i in item)
        return item

    def concrete(self, kwargs: dict) -> dict:
        return {k: _clone(self.value_of(v)) for k, v in kwargs.items()}

    def evaluate(self, run: Callable[[], Any]) -> Any:
        try:
            with torch.no_grad():
                return run()
        except Exception:  # an op that does not accept this combination: draw another host
            reject()


def _target_name(target: Any) -> str:
    if isinstance(target, str):
        return target
    return getattr(target, "__name__", None) or str(target)


def _crashes_torch(name: str, values: Any, dilation: Any) -> bool:
    """Whether running op ``name`` on ``values`` would crash the process rather than raise. torch's CPU
    convolution (2.13) segfaults with a dilation above 1 on:

    - a channels_last input (seen with a 1x1 kernel, stride 2, padding 1 and width 1, in every floating
      and complex dtype);
    - a float16 input, contiguous too (seen with a 1x1 kernel, width 1, stride 2 and padding 1 along the
      dilated dimension, groups 1 and 2; bfloat16, float32 and float64 run).

    Both found by the verifier's draws. Such a host is discarded unrun, as one whose op raises is: a
    dilated convolution is still drawn in every other case, and these inputs without dilation."""
    if "conv" not in name.lower():
        return False
    dilated = any(d > 1 for d in (dilation if isinstance(dilation, (list, tuple)) else (dilation,))
                  if isinstance(d, int))
    return dilated and any(isinstance(v, torch.Tensor) and v.ndim == 4 and (
        v.dtype == torch.float16
        or (not v.is_contiguous() and v.is_contiguous(memory_format=torch.channels_last)))
        for v in _flatten_values(values))


def _flatten_values(values: Any) -> list:
    if isinstance(values, (list, tuple)):
        return [leaf for item in values for leaf in _flatten_values(item)]
    return [values]


def _scale_output(module: nn.Module, args: tuple, output: Any) -> Any:
    """A forward hook that doubles a tensor output (a rule that drops or replaces the module drops it too)."""
    return output * 2 if isinstance(output, torch.Tensor) else output


_SUBCLASSES: dict = {}


def _overriding_subclass(cls: type) -> Optional[type]:
    """A subclass of ``cls`` overriding the methods its ``forward`` calls on ``self`` (``Conv2d._conv_forward``)
    so they scale their tensor result: a rule that matches it and computes what ``cls`` would is wrong.
    None when ``forward`` calls no method of the class."""
    if cls in _SUBCLASSES:
        return _SUBCLASSES[cls]
    names = []
    forward = getattr(cls, "forward", None)
    for name in getattr(getattr(forward, "__code__", None), "co_names", ()):
        static = inspect.getattr_static(cls, name, None)
        if name != "forward" and not name.startswith("__") and inspect.isfunction(static):
            names.append(name)
    sub = None
    if names:
        body = {name: _scaling(getattr(cls, name)) for name in names}
        body["overrides"] = tuple(names)
        sub = type(f"Overriding{cls.__name__}", (cls,), body)
    _SUBCLASSES[cls] = sub
    return sub


def _scaling(method: Callable) -> Callable:
    def scaled(self, *args, **kwargs):
        out = method(self, *args, **kwargs)
        return out * 1.5 if isinstance(out, torch.Tensor) else out

    return scaled


def _tie(module: nn.Module, earlier: nn.Module) -> list:
    """Make ``module``'s parameters the same objects as ``earlier``'s where the shapes agree; the names tied."""
    tied = []
    for name, param in list(module.named_parameters(recurse=False)):
        other = getattr(earlier, name, None)
        if isinstance(other, nn.Parameter) and other.shape == param.shape and other.dtype == param.dtype:
            setattr(module, name, other)
            tied.append(name)
    return tied


def _keyword_only(p: PCall) -> frozenset:
    """The parameters the target takes by keyword only (``F.gelu``'s ``approximate``), by the signatures
    the compiler bound the pattern to: a host must pass them by name, or every call raises and every
    host is discarded."""
    return frozenset(name for sig, _ in p.overloads for name, param in sig.parameters.items()
                     if param.kind is param.KEYWORD_ONLY)


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return fresh(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_clone(v) for v in value)
    return value


def _product(values) -> int:
    total = 1
    for v in values:
        total *= v
    return total


def _values(fill: str, shape: tuple, dtype: torch.dtype, generator: torch.Generator,
            positive: bool = False) -> torch.Tensor:
    """Values of ``dtype`` drawn as ``fill`` says (see ``FILLS``); ``positive``: all above 0 (variances)."""
    if positive:
        base = torch.rand(shape, generator=generator, dtype=torch.float64) * 2 + 0.1
        return base.to(dtype)
    if fill == "zeros":
        return torch.zeros(shape, dtype=dtype)
    if fill == "ones":
        return torch.ones(shape, dtype=dtype)
    if dtype is torch.bool:
        return torch.rand(shape, generator=generator) > 0.5
    if not (dtype.is_floating_point or dtype.is_complex):
        values = torch.randint(-3, 4, shape, generator=generator)
        if fill == "special" and values.numel():
            info = torch.iinfo(dtype)
            extremes = torch.tensor([info.min, info.max, 0, -1], dtype=torch.int64)
            pick = torch.randint(0, 2, shape, generator=generator).bool()
            values = torch.where(pick, extremes[torch.randint(0, 4, shape, generator=generator)], values)
        return values.to(dtype)
    if dtype.is_complex:
        real = _values(fill, shape, torch.float64, generator)
        imag = _values(fill, shape, torch.float64, generator)
        return torch.complex(real, imag).to(dtype)
    base = torch.randn(shape, generator=generator, dtype=torch.float64)
    if fill == "uniform":
        base = torch.rand(shape, generator=generator, dtype=torch.float64)
    elif fill == "large":
        base = base * 100
    elif fill == "special" and base.numel():
        base = torch.where(torch.rand(shape, generator=generator) < 0.5,
                           _special(dtype)[torch.randint(0, len(_SPECIAL_NAMES), shape, generator=generator)], base)
    return base.to(dtype)


_SPECIAL_NAMES = ("+0", "-0", "nan", "inf", "-inf", "subnormal", "-subnormal", "huge", "-huge", "tiny")


def _special(dtype: torch.dtype) -> torch.Tensor:
    """The special values of a floating dtype, in float64 (each representable in ``dtype``)."""
    info = torch.finfo(dtype)
    subnormal = info.smallest_normal / 4
    huge = info.max / 8
    values = (0.0, -0.0, float("nan"), float("inf"), float("-inf"), subnormal, -subnormal, huge, -huge,
              info.smallest_normal)
    return torch.tensor(values, dtype=torch.float64)


def _laid_out(tensor: torch.Tensor, layout: str) -> Optional[torch.Tensor]:
    """``tensor``'s values in the memory ``layout`` (see ``LAYOUTS``); None when the layout does not
    apply to its rank (the host then keeps it contiguous)."""
    if layout == "contiguous":
        return tensor
    if layout == "transposed":
        return tensor.transpose(-1, -2).contiguous().transpose(-1, -2) if tensor.ndim >= 2 else None
    if layout == "channels_last":
        return tensor.contiguous(memory_format=torch.channels_last) if tensor.ndim == 4 else None
    if tensor.ndim == 0:
        return None
    # every other row of a buffer twice as long: for 2+ dims no view can flatten it
    wide = torch.zeros((tensor.shape[0] * 2,) + tuple(tensor.shape[1:]), dtype=tensor.dtype)
    strided = wide[::2]
    strided.copy_(tensor)
    return strided


def fresh(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of ``tensor`` with its strides (``clone`` makes a non-dense tensor contiguous), so every
    run of a host sees the layout that was drawn."""
    return torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype).copy_(tensor)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")
