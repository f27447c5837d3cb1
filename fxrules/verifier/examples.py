"""Rule examples to runnable models: ``example: MODEL given $x: [2, 8]`` -> a GraphModule and its inputs.

An example is written in the replacement language, so it is compiled by the same
compiler (:mod:`fxrules.engine.program`) that compiles replacements: names resolve under
the rule set's import policy, modules are constructed from their literal keyword
arguments, and nothing is ``eval``'d. The graph is built node by node (no tracing),
so the example model is exactly the graph written in the rule file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

import fxrules.lang.ast as A
from fxrules.engine.program import RCall, RLiteral, RNewModule, RSeq, RValue, RuleCompiler
from fxrules.lang.allowlist import Position
from fxrules.lang.check.examples import MAX_EXAMPLE_DIMENSIONS, MAX_EXAMPLE_ELEMENTS, MAX_EXAMPLE_SIZE
from fxrules.lang.ruleset import CheckedRule, RuleSet

MAX_MODULE_ELEMENTS = 1 << 24
"""The most parameter and buffer elements a module an example constructs may hold (64 MB of float32):
``Embedding{num_embeddings=100000000, embedding_dim=64}`` checks clean (its arguments are literals) but
would allocate 25.6 GB, so the module is first built on the meta device and counted."""

DEFAULT_DTYPE = "float32"


@dataclass(frozen=True)
class ExampleModel:
    """A built example: the model (in the example's mode), its inputs, and what it was built from."""

    example: A.Example
    module: fx.GraphModule
    inputs: tuple

    @property
    def expected(self) -> str:
        """What the rule must do: "rewrite it at least once", "rewrite it exactly 2 times", "leave it alone"."""
        count = self.example.count
        if count is None:
            return "rewrite it at least once"
        if count == 0:
            return "leave it alone"
        return f"rewrite it exactly {count} time{'s' * (count != 1)}"

    def accepts(self, rewrites: int) -> bool:
        """Whether ``rewrites`` (how often the rule fired) is what the example asks for."""
        count = self.example.count
        return rewrites >= 1 if count is None else rewrites == count


def make_tensor(spec: A.InputSpec, generator: torch.Generator) -> torch.Tensor:
    """A tensor for ``$x: dtype[shape] (= fill)``: random (from ``generator``) unless filled."""
    dtype = getattr(torch, spec.dtype or DEFAULT_DTYPE)
    shape = tuple(spec.shape)
    if spec.fill is not None:
        return torch.full(shape, spec.fill, dtype=dtype)
    if dtype == torch.bool:
        return torch.rand(shape, generator=generator) > 0.5
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)
    return torch.randint(0, 5, shape, generator=generator, dtype=torch.int64).to(dtype)


def build_example(rule: CheckedRule, rule_set: RuleSet, example: A.Example, *, seed: int = 0) -> ExampleModel:
    """Build ``example`` of ``rule`` (its names resolve as the rule's do). Raises RuleFileError on a bad name."""
    compiler = RuleCompiler(rule, rule_set)
    compiler.position = Position.EXAMPLE  # names decided as an example's (not a pattern's) by the allow-list
    compiler.bound_names = set()
    buffers = _buffer_names(example)
    generator = torch.Generator().manual_seed(seed)
    graph = fx.Graph()
    root = nn.Module()
    values: dict[str, fx.Node] = {}
    inputs = []
    for spec in example.inputs:
        _check_input_size(spec)  # the checker's limits, again: a RuleSet can be made without it
        tensor = make_tensor(spec, generator)
        if spec.name in buffers:
            root.register_buffer(spec.name, tensor)
            values[spec.name] = graph.get_attr(spec.name)
        else:
            values[spec.name] = graph.placeholder(spec.name)
            inputs.append(tensor)
    emitter = _Emitter(graph, root, values)
    outputs = [emitter.value(compiler.replacement(expr, 0)) for expr in example.outputs]
    graph.output(outputs[0] if len(outputs) == 1 else tuple(outputs))
    module = fx.GraphModule(root, graph, class_name="Example")
    module.train(example.mode == "train")
    return ExampleModel(example, module, tuple(inputs))


def _buffer_names(example: A.Example) -> set[str]:
    found: set[str] = set()

    def visit(expr: Any) -> None:
        if isinstance(expr, A.GetAttr) and isinstance(expr.target, A.Capture):
            found.add(expr.target.name)
        elif isinstance(expr, A.Call):
            for arg in expr.args or ():
                visit(arg)
            for keyword in expr.kwargs:
                visit(keyword.value)
        elif isinstance(expr, (A.ListExpr, A.TupleExpr)):
            for item in expr.items:
                visit(item)

    for output in example.outputs:
        visit(output)
    return found


class _Emitter:
    """Replacement trees (as compiled from an example) to graph nodes."""

    def __init__(self, graph: fx.Graph, root: nn.Module, values: dict[str, fx.Node]):
        self.graph, self.root, self.values = graph, root, values
        self.modules = 0

    def value(self, item: Any) -> Any:
        if isinstance(item, RValue):
            return self.values[item.name]
        if isinstance(item, RLiteral):
            return item.value
        if isinstance(item, RSeq):
            return item.kind(self.value(i) for i in item.items)
        if isinstance(item, RCall):
            return self.call(item)
        raise TypeError(f"an example cannot contain {item!r}")  # pragma: no cover - the checker refuses it

    def call(self, item: RCall) -> fx.Node:
        args = tuple(self.value(a) for a in item.args or ())
        kwargs = {name: self.value(v) for name, v in item.kwargs}
        if item.op == "call_module":
            spec = item.target
            if not isinstance(spec, RNewModule):  # pragma: no cover - the checker refuses builders
                raise TypeError("an example constructs its modules")
            attrs = {name: self.value(v) for name, v in spec.attrs}
            _check_module_size(spec.cls, attrs)
            module = spec.cls(**attrs)
            name = f"{_snake(spec.cls.__name__)}_{self.modules}"
            self.modules += 1
            self.root.add_module(name, module)
            return self.graph.call_module(name, args, kwargs)
        if item.op == "call_method":
            return self.graph.call_method(item.target, args, kwargs)
        return self.graph.call_function(item.target, args, kwargs)


def _snake(name: str) -> str:
    out = []
    for i, ch in enumerate(name):
        if ch.isupper() and i and not name[i - 1].isupper():
            out.append("_")
        out.append(ch.lower())
    return "".join(out)


def _check_input_size(spec: A.InputSpec) -> None:
    elements = 1
    for d in spec.shape:
        elements *= d
    if (len(spec.shape) > MAX_EXAMPLE_DIMENSIONS or any(d > MAX_EXAMPLE_SIZE for d in spec.shape)
            or elements > MAX_EXAMPLE_ELEMENTS):
        raise ValueError(f"example input `${spec.name}` is over the example limits ({MAX_EXAMPLE_DIMENSIONS} dimensions, "
                         f"{MAX_EXAMPLE_SIZE} per dimension, {MAX_EXAMPLE_ELEMENTS} elements)")


def _check_module_size(cls: type, attrs: dict) -> None:
    """Build the module on the meta device (no memory) and count what the real one would allocate."""
    with torch.device("meta"):
        module = cls(**attrs)
    elements = sum(t.numel() for t in module.parameters()) + sum(t.numel() for t in module.buffers())
    if elements > MAX_MODULE_ELEMENTS:
        raise ValueError(f"an example's `{cls.__name__}` would hold {elements} elements; examples construct "
                         f"modules of at most {MAX_MODULE_ELEMENTS}")
