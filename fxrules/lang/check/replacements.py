"""Replacements: they can be built, from what the pattern binds, and create nothing forbidden.

A replacement uses only the pattern's captures and ``as`` names; its calls resolve (through
:class:`fxrules.lang.check.targets.Targets`), never create a call in :data:`NEVER_CREATED` or a
dunder method, and construct modules with the arguments their constructors need; a module
builder takes matched modules or captures; ``...`` is forwarded only from exactly one ``...`` of
the pattern; and it introduces no literal size over the budget, no random numbers under
``[exact]``/``[approx]`` and no device the pattern does not name (:mod:`fxrules.lang.check.introduced`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import fxrules.lang.ast as A
from fxrules.lang.check.conditions import check_conditions
from fxrules.lang.check.calls import attribute_values, check_argument_list, check_duplicate_keywords
from fxrules.lang.check.introduced import PatternFacts, callee, check_devices, check_literal_sizes, check_random
from fxrules.lang.check.reporter import Reporter
from fxrules.lang.check.scope import Bindings, report_unbound_capture, report_unbound_name, unwrap
from fxrules.lang.allowlist import Position
from fxrules.lang.check.targets import Targets


def check_forwarded_ellipses(reporter: Reporter, replacements: tuple[A.Expr, ...], bindings: Bindings) -> None:
    """A replacement's ``...`` forwards the arguments the pattern's one ``...`` matched."""
    uses = [e for root in replacements for e in _replacement_ellipses(root)]
    if uses and len(bindings.ellipses) == 0:
        reporter.error(uses[0], "ellipsis-misuse",
                       "the replacement forwards `...`, but the pattern has no `...` to take arguments from")
    elif uses and len(bindings.ellipses) > 1:
        reporter.error(uses[0], "ellipsis-misuse",
                       "the replacement forwards `...`, but the pattern has several; it would be ambiguous",
                       notes=[f"the pattern's `...` are at {', '.join(str(s) for s in bindings.ellipses)}"])


def check_replacements(reporter: Reporter, targets: Targets, bindings: Bindings, roots: tuple[A.Expr, ...], *,
                       patterns: tuple[A.Expr, ...] = (), contract: str = "approx") -> None:
    """Check the replacement roots of a rule whose pattern binds ``bindings``; what they introduce
    (literal sizes, random numbers under ``contract``, devices) against what ``patterns`` call
    (:mod:`fxrules.lang.check.introduced`)."""
    walk = _ReplacementWalk(reporter, targets, bindings, PatternFacts.of(patterns, targets.aliases), contract)
    for root in roots:
        walk.replacement(root, root=True)
    for name, (span, used) in walk.shared.items():
        if not used:
            reporter.error(span, "bad-replacement", f"the replacement names a node `{name}` with `as` but never uses it",
                           notes=["`as` in a replacement names a node built once and used by several of its parts: "
                                  f"write `{name}` where it is used again"])


@dataclass(slots=True)  # a worker, made for each rule: a frozen dataclass costs three times as much to make
class _ReplacementWalk:
    """Checks one rule's replacements against what its patterns bound, reporting to ``reporter``."""

    reporter: Reporter
    targets: Targets
    bindings: Bindings
    pattern: PatternFacts
    contract: str
    shared: dict = field(default_factory=dict)  # name bound with `as` in the replacement -> [span, used]

    def replacement(self, expr: A.Expr, *, root: bool) -> None:
        if isinstance(expr, A.Call):  # the most common first (the kinds are disjoint: the order is only speed)
            self.call(expr, root=root)
        elif isinstance(expr, A.Capture):
            if expr.name not in self.bindings.captures:
                report_unbound_capture(self.reporter, expr.name, expr.span, self.bindings, "the replacement")
        elif isinstance(expr, A.Wildcard):
            self.reporter.error(expr.span, "bad-replacement", "`_` matches anything, so it cannot be built",
                                notes=["bind the value with a capture (`$x`) in the pattern and use that"])
        elif isinstance(expr, A.Literal):
            if root:
                self.reporter.error(expr.span, "bad-replacement", "a node cannot be replaced by a literal",
                                    notes=["a replacement root is an operation or a value the pattern binds"])
        elif isinstance(expr, A.Name):
            if len(expr.dotted.parts) == 1:
                if expr.dotted.parts[0] in self.shared:
                    self.shared[expr.dotted.parts[0]][1] = True
                elif expr.dotted.parts[0] not in self.bindings.names:
                    report_unbound_name(self.reporter, expr.dotted.parts[0], expr.span, self.bindings)
            elif root:
                self.reporter.error(expr.span, "bad-replacement", "a node cannot be replaced by a constant")
            else:
                self.targets.constant(expr.dotted)
        elif isinstance(expr, (A.ListExpr, A.TupleExpr)):
            if root:
                self.reporter.error(expr.span, "bad-replacement", "a node cannot be replaced by a list")
            for item in expr.items:
                if isinstance(item, A.Ellipsis_):
                    self.reporter.error(item.span, "ellipsis-misuse", "`...` may only end an argument list")
                else:
                    self.item(item)
        elif isinstance(expr, A.Ellipsis_):
            self.reporter.error(expr.span, "ellipsis-misuse", "`...` may only end an argument list")
        elif isinstance(expr, A.GetAttr):
            if not isinstance(expr.target, A.Capture):
                self.reporter.error(expr.span, "bad-replacement",
                                    "a replacement can read only an attribute the pattern binds, as in `get_attr $p`")
            elif expr.target.name not in self.bindings.captures:
                report_unbound_capture(self.reporter, expr.target.name, expr.target.span, self.bindings,
                                       "the replacement")
        elif isinstance(expr, A.Alt):
            self.reporter.error(expr.span, "bad-replacement", "an alternation `|` can only appear in a pattern")
        elif isinstance(expr, A.Bind):
            self.shared_node(expr, root=root)
        elif isinstance(expr, A.Variadic):
            self.reporter.error(expr.span, "bad-replacement", f"`*${expr.name}` splices items: it may appear only "
                                                              "among positional arguments or list items")
        elif isinstance(expr, A.Computed):
            if root:
                self.reporter.error(expr.span, "bad-replacement", "a node cannot be replaced by a computed value",
                                    notes=["a computed value is an argument or a constructor argument"])
            check_conditions(self.reporter, self.targets, self.bindings, (expr.cond,))
        elif isinstance(expr, A.PatternUse):
            self.reporter.error(expr.span, "bad-replacement", f"`{expr.name}(...)` uses a named pattern, which "
                                                              "can only be matched, not built")

    def call(self, call: A.Call, *, root: bool) -> None:
        if call.args is None and not root:
            self.reporter.error(call.span, "bad-replacement",
                                "a call without an argument list forwards the matched node's arguments, so it can "
                                "only be a whole replacement",
                                notes=["give it arguments, as in `call_function torch.relu($x)`"])
        if call.op == "call_function":
            self.function_call(call.target)
            self.targets.literal_call(call, Position.REPLACEMENT)
        elif call.op == "call_method":
            self.targets.method_target(call.target, Position.REPLACEMENT)  # the allow-list refuses dunder methods
            self.method_object(call)
        elif call.builder_args is not None:
            self.builder_call(call)
        elif len(call.target.parts) == 1 and call.target.parts[0] in self.bindings.names:
            self.matched_module_call(call)
        else:
            self.new_module_call(call)
        self.introduced(call)
        if call.args is not None:
            check_argument_list(self.reporter, call, "bad-replacement")
            for arg in call.args:
                if not isinstance(arg, A.Ellipsis_):
                    self.item(arg)
            for keyword in call.kwargs:
                self.replacement(keyword.value, root=False)

    def introduced(self, call: A.Call) -> None:
        """What the call brings that the pattern did not: literal sizes over the budget, random
        numbers under ``[exact]``/``[approx]``, devices (SECURITY.md)."""
        found = callee(call, self.targets.aliases)
        if found is not None:
            check_literal_sizes(self.reporter, call, found)
            check_random(self.reporter, call, found, self.contract, self.pattern)
        check_devices(self.reporter, call, found, self.pattern)

    def item(self, expr: A.Expr) -> None:
        """A positional argument or list item: ``*$xs`` splices what the pattern's ``*$xs`` bound."""
        if isinstance(expr, A.Variadic):
            if expr.name not in self.bindings.captures:
                report_unbound_capture(self.reporter, expr.name, expr.span, self.bindings, "the replacement")
            elif expr.name not in self.bindings.variadics:
                self.reporter.error(expr.span, "bad-replacement", f"`*${expr.name}` splices a list, but the pattern "
                                                                  f"binds `${expr.name}` to one value",
                                    notes=[f"bind it with `*${expr.name}` in the pattern"])
        else:
            self.replacement(expr, root=False)

    def shared_node(self, expr: A.Bind, *, root: bool) -> None:
        """``CALL as name``: a node built once, which the replacement's later parts (its other roots
        above all) use by ``name``. The name is new, and it names a call with arguments."""
        self.replacement(expr.expr, root=root)
        if not isinstance(expr.expr, A.Call) or expr.expr.args is None:
            self.reporter.error(expr.span, "bad-replacement", "`as` in a replacement names a call it builds, "
                                                              "as in `call_function torch.split($x, 2) as s`")
        elif expr.name in self.bindings.names:
            self.reporter.error(expr.span, "bad-replacement", f"`{expr.name}` already names a node of the pattern")
        elif expr.name in self.shared:
            self.reporter.error(expr.span, "duplicate-binding", f"`{expr.name}` is already bound in this replacement",
                                notes=[f"first bound at {self.shared[expr.name][0]}"])
        else:
            self.shared[expr.name] = [expr.span, False]

    def method_object(self, call: A.Call) -> None:
        """A method is called on a graph value: not on a literal, a constant, a list or a computed value,
        whose generated code (``2.neg()``) would not compile (issue 19). A capture is checked when the
        rule is applied (it may bind a literal)."""
        if not call.args or isinstance(call.args[0], (A.Capture, A.Call, A.GetAttr, A.Ellipsis_)):
            return
        if isinstance(call.args[0], A.Name) and len(call.args[0].dotted.parts) == 1:
            return  # a node named with `as`
        self.reporter.error(call.args[0].span, "bad-replacement",
                            f"`call_method {call.target.text}` is called on this value, which is not a graph value",
                            notes=[f"a method needs a tensor the graph computes; write `call_function "
                                   f"torch.{call.target.text}(...)` instead"])

    def function_call(self, target: A.Dotted) -> None:
        """A call_function target that resolves and is on the allow-list for replacements (which
        refuses everything in :data:`~fxrules.lang.check.targets.NEVER_CREATED`)."""
        self.targets.function_target(target, Position.REPLACEMENT)

    def matched_module_call(self, call: A.Call) -> None:
        """``call_module name(...)``: calls the module the pattern matched as ``name``, as it is."""
        named = unwrap(self.bindings.names[call.target.parts[0]])
        if not (isinstance(named, A.Call) and named.op == "call_module"):
            self.reporter.error(call.target.span, "bad-replacement",
                                f"`{call.target.text}` names a node that is not a call_module, so it cannot be called")
        if call.attrs is not None:
            self.reporter.error(call.span, "bad-replacement",
                                "a matched module is called as it is; it takes no constructor arguments")

    def new_module_call(self, call: A.Call) -> None:
        """``call_module TYPE{argument=value, ...}(...)``: constructs a module of a type, with what it needs."""
        module_class = self.targets.module_type(call.target)
        check_duplicate_keywords(self.reporter, call.attrs or (), "bad-replacement", "constructor argument")
        for keyword in call.attrs or ():
            self.targets.module_attribute(keyword, module_class, matched=False)
            for value in attribute_values(self.reporter, keyword.value, "bad-replacement"):
                self.replacement(value, root=False)
        self.targets.constructor_arguments(call, module_class, "bad-replacement")

    def builder_call(self, call: A.Call) -> None:
        """``call_module builder(conv, bn)(...)``: a builder function, given matched modules or captures."""
        if call.attrs is not None:
            self.reporter.error(call.span, "bad-replacement", "a module builder takes matched modules, not attributes")
        for arg in call.builder_args or ():
            self.builder_argument(arg)
        self.targets.builder(call.target)

    def builder_argument(self, arg: A.Expr) -> None:
        if isinstance(arg, A.Keyword):
            self.reporter.error(arg.span, "bad-replacement",
                                "a module builder takes the names of matched modules, not keyword arguments")
            return
        if isinstance(arg, A.Capture):  # a matched parameter (get_attr) or constant, e.g. for aten graphs
            if arg.name not in self.bindings.captures:
                report_unbound_capture(self.reporter, arg.name, arg.span, self.bindings, "the builder's arguments")
            return
        if not (isinstance(arg, A.Name) and len(arg.dotted.parts) == 1):
            self.reporter.error(arg.span, "bad-replacement",
                                "a module builder takes the names of matched modules or captures, as in "
                                "`fold_conv_bn(conv, bn)` or `fold_aten_conv_bn($w, $b, ...)`")
            return
        name = arg.dotted.parts[0]
        if name not in self.bindings.names:
            report_unbound_name(self.reporter, name, arg.span, self.bindings)
            return
        if not _is_module_pattern(self.bindings.names[name]):
            self.reporter.error(arg.span, "bad-replacement", f"`{name}` is not a matched call_module node",
                                notes=["a module builder receives the nn.Module instances of matched call_module "
                                       "nodes"])


def _is_module_pattern(expr: A.Expr) -> bool:
    expr = unwrap(expr)
    if isinstance(expr, A.Call):
        return expr.op == "call_module"
    if isinstance(expr, A.Alt):
        return all(_is_module_pattern(o) for o in expr.options)
    return False


def _replacement_ellipses(expr: A.Expr) -> list[A.Span]:
    found: list[A.Span] = []
    stack = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, A.Call):
            found.extend(a.span for a in node.args or () if isinstance(a, A.Ellipsis_))
            stack.extend(a for a in node.args or () if not isinstance(a, A.Ellipsis_))
            stack.extend(k.value for k in node.kwargs)
        elif isinstance(node, (A.ListExpr, A.TupleExpr)):
            stack.extend(node.items)
    return found
