"""Patterns: what they bind, and that they can be matched.

Captures and ``as`` names (no name bound twice, none used inside its own definition), references
to ``as`` names, alternations whose options bind the same names, where ``...`` may stand, and
the targets of the calls (through :class:`fxrules.lang.check.targets.Targets`). The result is the
pattern's :class:`fxrules.lang.check.scope.Bindings`, which conditions and replacements are
checked against.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import fxrules.lang.ast as A
from fxrules.lang.check.calls import attribute_values, check_argument_list, check_duplicate_keywords
from fxrules.lang.check.reporter import Reporter
from fxrules.lang.check.scope import Bindings, report_unbound_name
from fxrules.lang.allowlist import Position
from fxrules.lang.check.named import NO_PATTERNS, NamedPatterns, expand, report_unknown_pattern
from fxrules.lang.check.targets import Targets


def check_patterns(reporter: Reporter, targets: Targets, patterns: tuple[A.Expr, ...],
                   named: NamedPatterns = NO_PATTERNS) -> Bindings:
    """Check a rule's pattern roots (or a named pattern's body), which may use the patterns in ``named``;
    what they bind."""
    walk = _PatternWalk(reporter, targets, named)
    scope = _Scope()
    for root in patterns:
        walk.pattern(root, scope, root=True, enclosing=())
    return _bindings(reporter, scope)


def check_body_pattern(reporter: Reporter, targets: Targets, body: A.Expr, named: NamedPatterns) -> Bindings:
    """Check a named pattern's body, which may stand where any argument may (an alternation with a
    bare capture is an optional part: ``call_function F.dropout($x, ...) | $x``); its uses at a
    rule's root are checked to be operations (:attr:`NamedPattern.rootable`)."""
    walk = _PatternWalk(reporter, targets, named)
    scope = _Scope()
    walk.pattern(body, scope, root=False, enclosing=())
    return _bindings(reporter, scope)


def _bindings(reporter: Reporter, scope: "_Scope") -> Bindings:
    bindings = Bindings(scope.captures, scope.names, tuple(scope.ellipses), frozenset(scope.variadics))
    for name, span, enclosing in scope.references:
        if name in enclosing:
            reporter.error(span, "bad-pattern", f"`{name}` is used inside the pattern it names",
                           notes=["a reference must point to a node outside its own definition"])
        elif name not in scope.names:
            report_unbound_name(reporter, name, span, bindings)
    return bindings


@dataclass(slots=True)
class _Scope:
    """What the pattern binds so far, while it is walked (an alternation's options get one each)."""

    captures: dict[str, A.Span] = field(default_factory=dict)
    names: dict[str, A.Expr] = field(default_factory=dict)  # `as` name -> the expression it names
    name_spans: dict[str, A.Span] = field(default_factory=dict)
    references: list[tuple[str, A.Span, tuple[str, ...]]] = field(default_factory=list)  # name, span, enclosing binds
    ellipses: list[A.Span] = field(default_factory=list)
    variadics: set[str] = field(default_factory=set)

    def bound(self) -> frozenset:
        return frozenset(("$" + c) for c in self.captures) | frozenset(self.names)


@dataclass(slots=True)  # a worker, made for each rule: a frozen dataclass costs three times as much to make
class _PatternWalk:
    """Checks one rule's patterns, reporting to ``reporter``."""

    reporter: Reporter
    targets: Targets
    named: NamedPatterns

    def pattern(self, expr: A.Expr, scope: _Scope, *, root: bool, enclosing: tuple[str, ...]) -> None:
        if isinstance(expr, A.Call):  # the most common first (the kinds are disjoint: the order is only speed)
            self.call(expr, scope, enclosing)
        elif isinstance(expr, A.Capture):
            if root:
                self.reporter.error(expr.span, "bad-pattern", "a pattern root must be an operation, not a capture",
                                    notes=["write `call_function ...`, `call_method ...`, `call_module ...` or "
                                           "`get_attr ...`"])
            scope.captures.setdefault(expr.name, expr.span)
        elif isinstance(expr, A.Wildcard):
            if root:
                self.reporter.error(expr.span, "bad-pattern", "a pattern root must be an operation, not `_`")
        elif isinstance(expr, A.Literal):
            if root:
                self.reporter.error(expr.span, "bad-pattern", "a pattern root must be an operation, not a literal")
        elif isinstance(expr, A.Name):
            if root:
                self.reporter.error(expr.span, "bad-pattern", "a pattern root must be an operation, not a name")
            elif len(expr.dotted.parts) == 1:
                scope.references.append((expr.dotted.parts[0], expr.span, enclosing))
            else:
                self.targets.constant(expr.dotted)
        elif isinstance(expr, (A.ListExpr, A.TupleExpr)):
            if root:
                self.reporter.error(expr.span, "bad-pattern", "a pattern root must be an operation, not a list")
            for i, item in enumerate(expr.items):
                if isinstance(item, A.Ellipsis_):
                    self.reporter.error(item.span, "ellipsis-misuse",
                                        "`...` may only end an argument list, not a list or tuple")
                elif isinstance(item, A.Variadic):
                    self.variadic(item, scope, last=i == len(expr.items) - 1)
                else:
                    self.pattern(item, scope, root=False, enclosing=enclosing)
        elif isinstance(expr, A.Ellipsis_):
            self.reporter.error(expr.span, "ellipsis-misuse", "`...` may only end an argument list")
        elif isinstance(expr, A.GetAttr):
            if isinstance(expr.target, A.Capture):
                scope.captures.setdefault(expr.target.name, expr.target.span)
        elif isinstance(expr, A.Alt):
            self.alternation(expr, scope, root=root, enclosing=enclosing)
        elif isinstance(expr, A.PatternUse):
            self.pattern_use(expr, scope, enclosing)
            named = self.named.get(expr.name)
            if root and named is not None and not named.rootable:
                self.reporter.error(expr.span, "bad-pattern", f"`{expr.name}` may match a value that is not an "
                                                              "operation, so it cannot be a pattern root",
                                    notes=[f"its body (at {named.definition.span}) has an option that is not a call"])
        elif isinstance(expr, A.Variadic):
            self.variadic(expr, scope, last=False)
        elif isinstance(expr, A.Computed):
            self.reporter.error(expr.span, "bad-pattern", "a computed value `{...}` can only appear in a replacement",
                                notes=["to test a value, capture it (`$x`) and write `where` with the condition"])
        elif isinstance(expr, A.Bind):
            if expr.name in scope.names:
                self.reporter.error(expr.span, "duplicate-binding", f"`{expr.name}` is already bound in this pattern",
                                    notes=[f"first bound at {scope.name_spans[expr.name]}"])
            else:
                scope.names[expr.name] = self.named_expr(expr.expr)
                scope.name_spans[expr.name] = expr.span
            self.pattern(expr.expr, scope, root=root, enclosing=enclosing + (expr.name,))

    def alternation(self, expr: A.Alt, scope: _Scope, *, root: bool, enclosing: tuple[str, ...]) -> None:
        """Each option is walked from what was bound before the alternation; all must bind the same."""
        bound_sets = []
        before = scope.bound()
        names_before, spans_before = dict(scope.names), dict(scope.name_spans)
        for option in expr.options:
            sub = _Scope(names=dict(names_before), name_spans=dict(spans_before))
            self.pattern(option, sub, root=root, enclosing=enclosing)
            bound_sets.append((sub.bound() - before, option))
            for name, span in sub.captures.items():
                scope.captures.setdefault(name, span)
            for name, inner in sub.names.items():
                scope.names.setdefault(name, inner)
                scope.name_spans.setdefault(name, sub.name_spans[name])
            scope.references.extend(sub.references)
            scope.ellipses.extend(sub.ellipses)
            scope.variadics.update(sub.variadics)
        first, _ = bound_sets[0]
        for other, option in bound_sets[1:]:
            if other != first:
                missing = sorted(first ^ other)
                self.reporter.error(option.span, "alternation-binding",
                                    "the options of an alternation must bind the same captures and names",
                                    notes=[f"bound by some options but not others: {', '.join(missing)}"])
                break

    def named_expr(self, expr: A.Expr) -> A.Expr:
        """What an ``as`` name names, for the checks that read its shape (a matched module called
        again, a builder's argument): a named pattern's use is its expansion."""
        if isinstance(expr, A.PatternUse):
            named = self.named.get(expr.name)
            if named is not None and len(expr.args) == len(named.params) and not expr.kwargs:
                return expand((expr,), self.named)[0]
        return expr

    def pattern_use(self, use: A.PatternUse, scope: _Scope, enclosing: tuple[str, ...]) -> None:
        """``name(PATTERN, ...)``: a named pattern defined above, given one pattern per parameter.

        Its body was checked where it is defined (an operation at its root); here, its arguments,
        and that each fits where the body puts it."""
        named = self.named.get(use.name)
        if named is None:
            report_unknown_pattern(self.reporter, use, self.named)
        elif len(use.args) != len(named.params):
            self.reporter.error(use.span, "bad-pattern",
                                f"`{use.name}` takes {len(named.params)} pattern{'s' * (len(named.params) != 1)}, "
                                f"given {len(use.args)}",
                                notes=[f"defined as `{use.name}({', '.join('$' + p for p in named.params)})` at "
                                       f"{named.definition.span}"])
        for keyword in use.kwargs:
            self.reporter.error(keyword.span, "bad-pattern", "a named pattern takes its patterns by position",
                                notes=[f"write `{use.name}(PATTERN, ...)` in the order of its parameters"])
            self.pattern(keyword.value, scope, root=False, enclosing=enclosing)
        for i, arg in enumerate(use.args):
            if isinstance(arg, A.Ellipsis_):
                self.reporter.error(arg.span, "ellipsis-misuse", "`...` may only end a call's argument list, "
                                                                 "not a named pattern's")
                continue
            self.pattern(arg, scope, root=False, enclosing=enclosing)
            if named is not None and i < len(named.params):
                self.fits(use, named.params[i], arg, named)
        if named is not None:
            scope.ellipses.extend(named.ellipses)
            hidden = sorted(head for head in named.heads if head in self.targets.aliases.paths)
            if hidden:
                self.reporter.error(use.name_span, "bad-pattern",
                                    f"this file's alias `{hidden[0]}` hides the module that `{use.name}` names",
                                    notes=[f"`{use.name}` (defined at {named.definition.span}) names "
                                           f"`{hidden[0]}...`; choose another alias here"])

    def fits(self, use: A.PatternUse, param: str, arg: A.Expr, named) -> None:
        """An argument for a parameter the body uses as a module attribute or a `get_attr` target
        must be a value there (a capture, `_`, a literal, a constant; `get_attr`: a capture or `_`)."""
        if param in named.getattr_params and not isinstance(arg, (A.Capture, A.Wildcard)):
            self.reporter.error(arg.span, "bad-pattern", f"`{use.name}` reads `get_attr ${param}`, so this "
                                                         "argument must be a capture or `_`")
        elif param in named.attribute_params and not _attribute_like(arg):
            self.reporter.error(arg.span, "bad-pattern", f"`{use.name}` uses `${param}` as a module attribute, so "
                                                         "this argument must be a capture, `_`, a literal or a "
                                                         "constant")

    def call(self, call: A.Call, scope: _Scope, enclosing: tuple[str, ...]) -> None:
        if call.op == "call_function":
            self.targets.function_target(call.target, Position.PATTERN)
        elif call.op == "call_method":
            self.targets.method_target(call.target, Position.PATTERN)
        else:
            self.module_call(call, scope)
        if call.args is not None:
            ellipsis = check_argument_list(self.reporter, call, "bad-pattern")
            if ellipsis is not None:
                scope.ellipses.append(ellipsis)
            for i, arg in enumerate(call.args):
                if isinstance(arg, A.Variadic):
                    self.variadic(arg, scope, last=i == len(call.args) - 1)
                elif not isinstance(arg, A.Ellipsis_):
                    self.pattern(arg, scope, root=False, enclosing=enclosing)
            for keyword in call.kwargs:
                self.pattern(keyword.value, scope, root=False, enclosing=enclosing)

    def variadic(self, item: A.Variadic, scope: _Scope, *, last: bool) -> None:
        """``*$xs`` binds the rest of an argument list or a list (a tuple): it must be the last item
        (so what it takes is decided, without backtracking), and not beside a `...`."""
        scope.captures.setdefault(item.name, item.span)
        scope.variadics.add(item.name)
        if not last:
            self.reporter.error(item.span, "bad-pattern", f"`*${item.name}` takes the rest, so it must be the last "
                                                          "positional argument or list item",
                                notes=["a call may end with `*$xs` or with `...`, not both"])

    def module_call(self, call: A.Call, scope: _Scope) -> None:
        """``call_module TYPE{attribute=value, ...}``: a module type, and attributes its constructor takes."""
        module_class = None
        if call.builder_args is not None:
            self.reporter.error(call.span, "bad-pattern", "a module builder can only appear in a replacement",
                                notes=["a pattern matches modules by type: `call_module Conv2d(...)`"])
        else:
            module_class = self.targets.module_type(call.target)
        check_duplicate_keywords(self.reporter, call.attrs or (), "bad-pattern", "attribute")
        for keyword in call.attrs or ():
            self.targets.module_attribute(keyword, module_class, matched=True)
            for value in attribute_values(self.reporter, keyword.value, "bad-pattern"):
                self.pattern(value, scope, root=False, enclosing=())


def _attribute_like(expr: A.Expr) -> bool:
    if isinstance(expr, (A.ListExpr, A.TupleExpr)):
        return all(_attribute_like(item) for item in expr.items)
    return isinstance(expr, (A.Capture, A.Wildcard, A.Literal)) or (
        isinstance(expr, A.Name) and len(expr.dotted.parts) > 1)
