"""Examples (``example N: MODEL given $x: [shape]``): one concrete, small model a rule must rewrite.

Built only from declared inputs, literals, dotted constants and calls that resolve; a rewrite
count of at most :data:`MAX_EXAMPLE_COUNT`; input shapes and fills within bounds, so the tensors
(made only when the rule is verified) are small. Every problem here is ``bad-example``, except
the names the calls use, which are checked as everywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import fxrules.lang.ast as A
from fxrules.lang.check.calls import check_argument_list, check_duplicate_keywords
from fxrules.lang.check.introduced import NOTHING, callee, check_devices, check_literal_sizes
from fxrules.lang.check.reporter import Reporter, did_you_mean
from fxrules.lang.allowlist import Position
from fxrules.lang.check.targets import Targets

MAX_EXAMPLE_COUNT = 10_000
"""The most rewrites an example may ask for (``example N:``): an example model is small."""

MAX_EXAMPLE_DIMENSIONS, MAX_EXAMPLE_SIZE, MAX_EXAMPLE_ELEMENTS = 8, 4096, 1 << 22
"""An example input has at most this many dimensions, this size in each, and this many elements:
its tensor is made when the rule is verified, so a shape is bounded when the rule is checked."""

EXAMPLE_DEVICES = frozenset({"cpu"})
"""The device an example may name (its model runs on the CPU): ``"cpu"``, and the ``cpu`` method."""

_INT64 = range(-(1 << 63), 1 << 63)

_NOT_IN_AN_EXAMPLE = {A.Wildcard: "`_`", A.Alt: "an alternation `|`", A.Bind: "`as`", A.Ellipsis_: "`...`",
                      A.PatternUse: "a named pattern", A.Computed: "a computed value `{...}`",
                      A.Variadic: "`*$xs`"}
"""Pattern constructs, which an example (one concrete model) cannot have."""
_PATTERN_ONLY = tuple(_NOT_IN_AN_EXAMPLE)


def check_example(reporter: Reporter, targets: Targets, example: A.Example) -> None:
    """Check one example of a rule: its header, its declared inputs, and the model it builds."""
    check_header(reporter, example)
    declared = check_inputs(reporter, example.inputs)
    model = _ExampleModel(reporter, targets, declared)
    for output in example.outputs:
        if isinstance(output, (A.Literal, A.ListExpr, A.TupleExpr, A.Name)):
            reporter.error(output.span, "bad-example", "an example's output must be computed from its inputs",
                           notes=["write an operation, as in `call_function torch.relu($x)`, or an input `$x`"])
        model.expr(output)
    model.check_uses()


def check_header(reporter: Reporter, example: A.Example) -> None:
    """The mode word (``train``/``eval``) and the rewrite count."""
    if example.mode is not None and example.mode not in A.EXAMPLE_MODES:
        reporter.error(example.mode_span, "bad-example", f"`{example.mode}` is not an example mode",
                       notes=["after the rewrite count comes `train` or `eval` (the default)"]
                       + did_you_mean(example.mode, A.EXAMPLE_MODES))
    if example.count is not None and example.count > MAX_EXAMPLE_COUNT:
        span = example.span  # the count has no span of its own: the diagnostic points at `example`
        reporter.error(A.Span(span.path, span.line, span.column, span.line, span.column + len("example")),
                       "bad-example", f"an example may ask for at most {MAX_EXAMPLE_COUNT} rewrites",
                       notes=["`example N:` means the rule rewrites the example model exactly N times, and an "
                              "example model is small"])


def check_inputs(reporter: Reporter, inputs: tuple[A.InputSpec, ...]) -> dict[str, A.InputSpec]:
    """Each input declared once, with a known dtype, a numeric fill and a bounded shape; the declared inputs."""
    declared: dict[str, A.InputSpec] = {}
    for spec in inputs:
        if spec.name in declared:
            reporter.error(spec.span, "bad-example", f"`${spec.name}` is declared twice",
                           notes=[f"first declared at {declared[spec.name].span}"])
            continue
        declared[spec.name] = spec
        if spec.dtype is not None and spec.dtype not in A.DTYPES:
            reporter.error(spec.span, "bad-example", f"`{spec.dtype}` is not a dtype an example input can have",
                           notes=[f"one of: {', '.join(A.DTYPES)}"] + did_you_mean(spec.dtype, A.DTYPES))
        if isinstance(spec.fill, str):
            reporter.error(spec.span, "bad-example", "an input can only be filled with a number or a boolean")
        elif type(spec.fill) is int and spec.fill not in _INT64:
            reporter.error(spec.span, "bad-example", "an input's integer fill value must fit in 64 bits")
        # in this order: the product is computed only for a few dimensions of bounded size
        if (len(spec.shape) > MAX_EXAMPLE_DIMENSIONS or any(d > MAX_EXAMPLE_SIZE for d in spec.shape)
                or _product(spec.shape) > MAX_EXAMPLE_ELEMENTS):
            reporter.error(spec.span, "bad-example", f"example inputs are small: at most {MAX_EXAMPLE_DIMENSIONS} "
                                                     f"dimensions, {MAX_EXAMPLE_SIZE} per dimension and 4M elements")
    return declared


@dataclass(slots=True)
class _ExampleModel:
    """Walks one example's model, recording how each declared input is used (as an input, as a buffer)."""

    reporter: Reporter
    targets: Targets
    declared: dict[str, A.InputSpec]
    uses: dict[str, set[str]] = field(default_factory=dict)

    def expr(self, expr: A.Expr) -> None:
        if isinstance(expr, A.Capture):
            if expr.name not in self.declared:
                self.reporter.error(expr.span, "bad-example", f"`${expr.name}` is not declared after `given`",
                                    notes=[f"declare it with its shape, as in `given ${expr.name}: [2, 8]`"])
            self.uses.setdefault(expr.name, set()).add("input")
        elif isinstance(expr, A.GetAttr):
            if not isinstance(expr.target, A.Capture):
                self.reporter.error(expr.span, "bad-example", "an example reads a declared buffer, as in `get_attr $b`")
            elif expr.target.name not in self.declared:
                self.reporter.error(expr.target.span, "bad-example",
                                    f"`${expr.target.name}` is not declared after `given`")
            else:
                self.uses.setdefault(expr.target.name, set()).add("buffer")
        elif isinstance(expr, _PATTERN_ONLY):
            self.reporter.error(expr.span, "bad-example", f"{_NOT_IN_AN_EXAMPLE[type(expr)]} cannot appear in an "
                                                          f"example: an example is one concrete model")
        elif isinstance(expr, A.Literal):
            return
        elif isinstance(expr, A.Name):
            if len(expr.dotted.parts) == 1:
                self.reporter.error(expr.span, "bad-example", f"`{expr.dotted.text}` is not defined in an example",
                                    notes=["an example uses its declared inputs (`$x`), literals and dotted constants"])
            else:
                self.targets.constant(expr.dotted)
        elif isinstance(expr, (A.ListExpr, A.TupleExpr)):
            for item in expr.items:
                self.expr(item)
        elif isinstance(expr, A.Call):
            self.call(expr)

    def call(self, call: A.Call) -> None:
        if call.args is None:
            self.reporter.error(call.span, "bad-example", "a call in an example needs its argument list",
                                notes=["write `(...)` after the target, as in `call_module ReLU($x)`"])
        if call.op == "call_function":
            self.targets.function_target(call.target, Position.EXAMPLE)
            self.targets.literal_call(call, Position.EXAMPLE)
        elif call.op == "call_method":
            self.method_call(call)
        elif call.builder_args is not None:
            self.reporter.error(call.span, "bad-example",
                                "an example constructs modules from keyword arguments in braces",
                                notes=[f"write `call_module {call.target.text}{{name=value, ...}}(...)`"])
        else:
            self.module_call(call)
        found = callee(call, self.targets.aliases)
        if found is not None:  # an example is built and run by `fxrules verify`: bounded, on the CPU
            check_literal_sizes(self.reporter, call, found)
        check_devices(self.reporter, call, found, NOTHING, EXAMPLE_DEVICES)
        if call.args is not None:
            check_argument_list(self.reporter, call, "bad-example")
            for arg in call.args:
                self.expr(arg)
            for keyword in call.kwargs:
                self.expr(keyword.value)

    def method_call(self, call: A.Call) -> None:
        self.targets.method_target(call.target, Position.EXAMPLE)
        if call.target.parts[0].startswith("_"):
            self.reporter.error(call.target.span, "bad-example", f"an example may not call `{call.target.text}`")
        if not call.args:
            self.reporter.error(call.span, "bad-example",
                                "a method call needs the tensor it is called on as its first argument")

    def module_call(self, call: A.Call) -> None:
        """``call_module TYPE{argument=literal, ...}(...)``: a module constructed from literals."""
        module_class = self.targets.module_type(call.target)
        check_duplicate_keywords(self.reporter, call.attrs or (), "bad-example", "constructor argument")
        for keyword in call.attrs or ():
            self.targets.module_attribute(keyword, module_class, matched=False)
            if not _literal_value(keyword.value):
                self.reporter.error(keyword.value.span, "bad-example",
                                    "a constructor argument in an example is a literal, a constant or a list of them")
        self.targets.constructor_arguments(call, module_class, "bad-example")

    def check_uses(self) -> None:
        """Every declared input is used, and either as an input or as a buffer, not both."""
        for name, spec in self.declared.items():
            kinds = self.uses.get(name, set())
            if not kinds:
                self.reporter.warning(spec.span, "bad-example", f"`${name}` is declared but the example does not use it")
            elif len(kinds) > 1:
                self.reporter.error(spec.span, "bad-example",
                                    f"`${name}` is used both as an input and as `get_attr ${name}`",
                                    notes=["an input declared for `get_attr` becomes a buffer of the example model"])


def _product(shape: tuple) -> int:
    total = 1
    for d in shape:
        total *= d
    return total


def _literal_value(expr: A.Expr) -> bool:
    if isinstance(expr, (A.ListExpr, A.TupleExpr)):
        return all(_literal_value(i) for i in expr.items)
    return isinstance(expr, A.Literal) or (isinstance(expr, A.Name) and len(expr.dotted.parts) > 1)
