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

import copy
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from hypothesis import reject
from hypothesis import strategies as st
from torch import fx, nn

from fxrules.engine import fxaccess
from fxrules.engine.program import (PAlt, PBind, PCall, PCapture, PConst, PGetAttr, PLiteral, PRef, PSeq, PVariadic,
                                   PWildcard)
from fxrules.verifier.samplers import Catalogue, OpSampler, Param, describe_target

TENSOR = Param("input", "tensor")
_SEQUENCE_KINDS = frozenset({"perm", "dims", "shape"})
_NUMBERS = (0, 1, -1, 2, 0.5, 1.0, 0.0, -2.5, 3)


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
            for arg in p.args or ():
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


class HostGraphWriter:
    """Writes one host graph for the pattern roots; see the module docstring."""

    def __init__(self, draw: Callable, catalogue: Catalogue, dtype: torch.dtype, training: bool):
        self.draw, self.catalogue, self.dtype, self.training = draw, catalogue, dtype, training
        self.graph = fx.Graph()
        self.root = nn.Module()
        self.values: dict[fx.Node, Any] = {}
        self.captures: dict[str, Any] = {}
        self.names: dict[str, Any] = {}
        self.inputs: list[torch.Tensor] = []
        self.placeholders: list[fx.Node] = []
        self.calls: list[fx.Node] = []
        self.lines: list[str] = []
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
        self.graph.output(outputs[0] if len(outputs) == 1 else tuple(outputs))
        module = fx.GraphModule(self.root, self.graph, class_name="Host")
        module.training = self.training  # not train(): each submodule has its mode, a pattern's {training=...} too
        return Host(module, tuple(self.inputs), self.dtype, self.training, self.lines)

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
        if kind == "tensor":
            return self.new_input(self.shape(ranks))
        if kind == "tensor_like":
            if not isinstance(of, torch.Tensor):
                return self.new_input(self.shape(ranks))
            choice = draw(st.sampled_from(["same", "same", "suffix", "number", "scalar"]), label="broadcast")
            if choice == "number":
                return draw(st.sampled_from(_NUMBERS), label=param.name)
            if choice == "scalar":
                return self.new_input(())
            shape = tuple(of.shape)
            if choice == "suffix" and shape:
                shape = shape[draw(st.integers(0, len(shape)), label="suffix start"):]
            return self.new_input(shape)
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
            return list(draw(st.permutations(list(range(rank))), label=param.name))
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
        if kind == "matmul_rhs":
            if not isinstance(of, torch.Tensor) or of.ndim == 0:
                reject()
            inner = of.shape[-1]
            columns = draw(st.integers(1, 4), label="columns")
            shape = (inner,) if draw(st.booleans(), label="vector rhs") else (inner, columns)
            if of.ndim > 2 and draw(st.booleans(), label="batched rhs"):
                shape = tuple(of.shape[:-2]) + (inner, columns)
            return self.new_input(shape)
        if kind == "tensor_list":
            shape = tuple(of.shape) if isinstance(of, torch.Tensor) else self.shape(ranks)
            return [self.new_input(shape) for _ in range(draw(st.integers(1, 3), label="list length"))]
        raise AssertionError(kind)  # pragma: no cover - Param checks kinds

    def sequence(self, items: list, param: Param, ctx: dict) -> list:
        """A dims/permutation/shape argument written item by item (``permute($x, $a, $b)``): the
        whole value is drawn by its kind and its open items take their part of it."""
        def is_open(item: Any) -> bool:
            return isinstance(item, PWildcard) or (isinstance(item, PCapture) and item.name not in self.captures)

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
        target = self.draw(st.sampled_from(options), label="reshape to")
        if -1 not in target and _product(target) != n:
            reject()
        return target

    def new_input(self, shape: tuple) -> fx.Node:
        fill = self.draw(st.sampled_from(["randn", "randn", "randn", "uniform", "zeros", "ones", "large"]),
                         label="input values")
        tensor = _values(fill, shape, self.dtype, self.generator)
        name = f"x{len(self.inputs)}"
        anchor = next((n for n in self.graph.nodes if n.op != "placeholder"), None)
        if anchor is None:
            node = self.graph.placeholder(name)
        else:
            with self.graph.inserting_before(anchor):
                node = self.graph.placeholder(name)
        self.values[node] = tensor
        self.inputs.append(tensor)
        self.lines.append(f"input {name}: {_dtype_name(self.dtype)}{list(shape)} ({fill})")
        if self.draw(st.integers(0, 3), label="upstream computation") == 3:  # shrinks to none
            up = self.graph.call_function(torch.add, (node, 0.25))
            self.values[up] = tensor + 0.25
            return up
        return node

    def attribute(self, param: Param, ctx: dict, ranks: Optional[tuple]) -> fx.Node:
        """A parameter or buffer of the host model, read with get_attr."""
        of = self.value_of(ctx.get(param.of)) if param.of else None
        if param.kind == "tensor_like" and isinstance(of, torch.Tensor):
            shape = tuple(of.shape)
            if shape and self.draw(st.booleans(), label="attribute broadcasts"):
                shape = shape[1:]
        else:
            shape = self.shape(ranks)
        fill = self.draw(st.sampled_from(["zeros", "ones", "randn", "randn"]), label="attribute values")
        name = f"attr{len(self.lines)}"
        self.root.register_buffer(name, _values(fill, shape, self.dtype, self.generator))
        node = self.graph.get_attr(name)
        self.values[node] = getattr(self.root, name)
        self.lines.append(f"buffer {name}: {_dtype_name(self.dtype)}{list(shape)} ({fill})")
        return node

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
        if module is None:
            reject()
        module = module.to(self.dtype)
        module.train(self.training if training is None else training)
        for name, attr in free_attrs:  # `Conv2d{kernel_size=$k}` binds what was drawn
            if isinstance(attr, PCapture) and attr.name not in self.captures:
                self.captures[attr.name] = getattr(module, name, None)
        target = f"m{len(fxaccess.children(self.root))}"  # one submodule per module call
        self.root.add_module(target, module)
        self.lines.append(f"module {target}: {module!r}" + (" (training)" if module.training else " (eval)"))
        node = self.graph.call_module(target, (x,))
        self.values[node] = self.evaluate(lambda: copy.deepcopy(module)(_clone(value)))
        self.calls.append(node)
        return node

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


def _keyword_only(p: PCall) -> frozenset:
    """The parameters the target takes by keyword only (``F.gelu``'s ``approximate``), by the signatures
    the compiler bound the pattern to: a host must pass them by name, or every call raises and every
    host is discarded."""
    return frozenset(name for sig, _ in p.overloads for name, param in sig.parameters.items()
                     if param.kind is param.KEYWORD_ONLY)


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_clone(v) for v in value)
    return value


def _product(values) -> int:
    total = 1
    for v in values:
        total *= v
    return total


def _values(fill: str, shape: tuple, dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    if fill == "zeros":
        return torch.zeros(shape, dtype=dtype)
    if fill == "ones":
        return torch.ones(shape, dtype=dtype)
    if not dtype.is_floating_point:
        return torch.randint(-3, 4, shape, generator=generator).to(dtype)
    base = torch.randn(shape, generator=generator, dtype=torch.float64)
    if fill == "uniform":
        base = torch.rand(shape, generator=generator, dtype=torch.float64)
    elif fill == "large":
        base = base * 100
    return base.to(dtype)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")
