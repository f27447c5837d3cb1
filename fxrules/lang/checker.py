"""The checker: names resolved, bindings checked, all semantic errors of a file collected.

Input: a :class:`fxrules.lang.ast.RuleFile`. Output: the file's
:class:`fxrules.lang.ruleset.CheckedRule` list and every diagnostic found (the caller
decides whether errors are fatal). The checker never stops at the first error.

What it checks, per rule:

* contract words; the effective contract (the rule's, else the file's
  ``default [...]``, else ``approx``);
* pattern bindings: captures, ``as`` names (no duplicates, none used inside its
  own definition), references to ``as`` names, alternations whose options bind
  the same names, where ``...`` may stand;
* that conditions and the replacement use only what the pattern binds;
* targets: call_function targets and constants resolve (with torch when it is
  importable), call_method names exist on ``torch.Tensor``, module types are
  ``nn.Module`` subclasses, attribute constraints and constructor arguments are
  parameters of the module's constructor, builders are callables; all under
  the import policy of :mod:`fxrules.lang.names`;
* argument lists and attribute blocks: no keyword given twice (by name);
* examples: declared inputs, a rewrite count of at most MAX_EXAMPLE_COUNT, input
  shapes and fills within bounds (their tensors are made only when verifying);
* the rule as a whole: as many replacement roots as pattern roots, and a
  replacement that differs from its pattern.
"""

from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

import fxrules.lang.ast as A
from fxrules.lang.diagnostics import WARNING, Diagnostic
from fxrules.lang import allowlist
from fxrules.lang.allowlist import Position
from fxrules.lang.names import BUILTIN_ALIASES, CONDITION_FUNCTIONS, PREDICATE_NAMES, Resolution, Resolver, builtin_path, expand, torch_available

CONDITION_FUNCTION_NAMES = frozenset(CONDITION_FUNCTIONS)
from fxrules.lang.ruleset import CheckedRule

NEVER_CREATED = frozenset({
    "builtins.getattr", "builtins.setattr", "builtins.delattr", "builtins.type", "builtins.vars",
    "operator.attrgetter", "operator.methodcaller", "operator.call", "operator.itemgetter",
})
"""Targets a replacement may not create: with them a rule could reach any attribute or callable at run time."""

MAX_EXAMPLE_COUNT = 10_000
"""The most rewrites an example may ask for (``example N:``): an example model is small."""

MAX_EXAMPLE_DIMENSIONS, MAX_EXAMPLE_SIZE, MAX_EXAMPLE_ELEMENTS = 8, 4096, 1 << 22
"""An example input has at most this many dimensions, this size in each, and this many elements:
its tensor is made when the rule is verified, so a shape is bounded when the rule is checked."""

_INT64 = range(-(1 << 63), 1 << 63)

CAPTURE_ATTRIBUTES = frozenset({"shape", "ndim", "dtype", "device", "numel", "requires_grad", "is_contiguous"})
"""What a condition may read from a captured value (tensor metadata)."""


@dataclass
class _Scope:
    """What a pattern binds."""

    captures: dict[str, A.Span] = field(default_factory=dict)
    names: dict[str, A.Expr] = field(default_factory=dict)  # `as` name -> the expression it names
    name_spans: dict[str, A.Span] = field(default_factory=dict)
    references: list[tuple[str, A.Span, tuple[str, ...]]] = field(default_factory=list)  # name, span, enclosing binds
    ellipses: list[A.Span] = field(default_factory=list)

    def bound(self) -> frozenset:
        return frozenset(("$" + c) for c in self.captures) | frozenset(self.names)


class _FileChecker:
    def __init__(self, rule_file: A.RuleFile, resolver: Resolver):
        self.file = rule_file
        self.resolver = resolver
        self.diagnostics: list[Diagnostic] = []
        self.errors = 0  # how many of the diagnostics are errors: a rule is checked clean when none were added
        self.aliases: dict[str, str] = {}
        self.bad_aliases: set[str] = set()  # aliases whose `use` line was already reported
        self.torch = torch_available()

    # -- reporting -----------------------------------------------------------------
    def error(self, span: A.Span, code: str, message: str, notes: Iterable[str] = ()) -> None:
        self.diagnostics.append(Diagnostic.at(span, code, message, notes=notes))
        self.errors += 1

    def warning(self, span: A.Span, code: str, message: str, notes: Iterable[str] = ()) -> None:
        self.diagnostics.append(Diagnostic.at(span, code, message, notes=notes, severity=WARNING))

    # -- file --------------------------------------------------------------------
    def run(self) -> list[CheckedRule]:
        checked: list[CheckedRule] = []
        default = "approx"
        for item in self.file.items:
            if isinstance(item, A.Use):
                self.use(item)
            elif isinstance(item, A.DefaultContract):
                default = self.contract_word(item.contract) or default
            elif isinstance(item, A.Example):
                self.error(A.Span(item.span.path, item.span.line, item.span.column, item.span.line,
                                  item.span.column + len("example")), "misplaced-example",
                           "an example must follow the rule it illustrates",
                           notes=["write it on the lines after the rule, before the next rule or `use`"])
            else:
                before = self.errors
                contract = self.contract_word(item.contract) if item.contract is not None else default
                self.rule(item)
                if self.errors == before:
                    name = item.name if item.name is not None else item.span.location
                    # numbered in file order: a rule set of this file alone need not renumber them
                    checked.append(CheckedRule(name, contract or default, item, dict(self.aliases), len(checked)))
        return checked

    def use(self, item: A.Use) -> None:
        if item.alias in self.aliases:
            self.error(item.span, "duplicate-alias", f"`{item.alias}` is already an alias in this file",
                       notes=[f"it stands for `{self.aliases[item.alias]}`"])
            return
        path = expand(item.path.parts, self.aliases) or item.path.text
        self.aliases[item.alias] = path
        resolution = self.resolver.resolve(path)
        if resolution.is_error:
            self.bad_aliases.add(item.alias)
            self.report(item.path.span, resolution, "unknown-target")

    def contract_word(self, contract: Optional[A.Contract]) -> Optional[str]:
        if contract is None:
            return None
        if contract.word not in A.CONTRACTS:
            close = difflib.get_close_matches(contract.word, A.CONTRACTS, n=1)
            self.error(contract.span, "bad-contract", f"`{contract.word}` is not a contract",
                       notes=[f"a contract is one of: {', '.join(A.CONTRACTS)}"]
                       + ([f"did you mean `{close[0]}`?"] if close else []))
            return None
        return contract.word

    # -- rule ----------------------------------------------------------------------
    def rule(self, rule: A.Rule) -> None:
        scope = _Scope()
        for root in rule.patterns:
            self.pattern(root, scope, root=True, enclosing=())
        self.check_references(scope)
        self.check_ellipses(rule, scope)
        for condition in rule.conditions:
            self.condition(condition, scope)
        for i, root in enumerate(rule.replacements):
            self.replacement(root, scope, root=True)
        if len(rule.patterns) != len(rule.replacements):
            self.error(rule.span, "arity-mismatch",
                       f"the pattern has {len(rule.patterns)} root{'s' * (len(rule.patterns) != 1)} but the "
                       f"replacement has {len(rule.replacements)}",
                       notes=["each pattern root is replaced by the replacement at the same position"])
        elif all(self.same(pattern, _filled(replacement, pattern))
                 for pattern, replacement in zip(rule.patterns, rule.replacements)):
            self.error(rule.span, "identity-rewrite", "the replacement is identical to the pattern, so the rule "
                                                      "could only rewrite forever")
        for example in rule.examples:
            self.example(example)

    # -- examples ------------------------------------------------------------------------
    def example(self, example: A.Example) -> None:
        """An example model: built only from declared inputs, literals, and calls that resolve."""
        if example.mode is not None and example.mode not in A.EXAMPLE_MODES:
            close = difflib.get_close_matches(example.mode, A.EXAMPLE_MODES, n=1)
            self.error(example.mode_span, "bad-example", f"`{example.mode}` is not an example mode",
                       notes=["after the rewrite count comes `train` or `eval` (the default)"]
                       + ([f"did you mean `{close[0]}`?"] if close else []))
        if example.count is not None and example.count > MAX_EXAMPLE_COUNT:
            span = example.span  # the count has no span of its own: the diagnostic points at `example`
            self.error(A.Span(span.path, span.line, span.column, span.line, span.column + len("example")),
                       "bad-example", f"an example may ask for at most {MAX_EXAMPLE_COUNT} rewrites",
                       notes=["`example N:` means the rule rewrites the example model exactly N times, and an "
                              "example model is small"])
        declared: dict[str, A.InputSpec] = {}
        for spec in example.inputs:
            if spec.name in declared:
                self.error(spec.span, "bad-example", f"`${spec.name}` is declared twice",
                           notes=[f"first declared at {declared[spec.name].span}"])
                continue
            declared[spec.name] = spec
            if spec.dtype is not None and spec.dtype not in A.DTYPES:
                close = difflib.get_close_matches(spec.dtype, A.DTYPES, n=1)
                self.error(spec.span, "bad-example", f"`{spec.dtype}` is not a dtype an example input can have",
                           notes=[f"one of: {', '.join(A.DTYPES)}"] + ([f"did you mean `{close[0]}`?"] if close else []))
            if spec.fill is not None and (isinstance(spec.fill, str) or spec.fill is None):
                self.error(spec.span, "bad-example", "an input can only be filled with a number or a boolean")
            elif type(spec.fill) is int and spec.fill not in _INT64:
                self.error(spec.span, "bad-example", "an input's integer fill value must fit in 64 bits")
            # in this order: the product is computed only for a few dimensions of bounded size
            if (len(spec.shape) > MAX_EXAMPLE_DIMENSIONS or any(d > MAX_EXAMPLE_SIZE for d in spec.shape)
                    or _product(spec.shape) > MAX_EXAMPLE_ELEMENTS):
                self.error(spec.span, "bad-example", f"example inputs are small: at most {MAX_EXAMPLE_DIMENSIONS} "
                                                     f"dimensions, {MAX_EXAMPLE_SIZE} per dimension and 4M elements")
        uses: dict[str, set] = {}
        for output in example.outputs:
            if isinstance(output, (A.Literal, A.ListExpr, A.TupleExpr, A.Name)):
                self.error(output.span, "bad-example", "an example's output must be computed from its inputs",
                           notes=["write an operation, as in `call_function torch.relu($x)`, or an input `$x`"])
            self.example_expr(output, declared, uses)
        for name, spec in declared.items():
            kinds = uses.get(name, set())
            if not kinds:
                self.warning(spec.span, "bad-example", f"`${name}` is declared but the example does not use it")
            elif len(kinds) > 1:
                self.error(spec.span, "bad-example",
                           f"`${name}` is used both as an input and as `get_attr ${name}`",
                           notes=["an input declared for `get_attr` becomes a buffer of the example model"])

    def example_expr(self, expr: A.Expr, declared: dict, uses: dict) -> None:
        if isinstance(expr, A.Capture):
            if expr.name not in declared:
                self.error(expr.span, "bad-example", f"`${expr.name}` is not declared after `given`",
                           notes=[f"declare it with its shape, as in `given ${expr.name}: [2, 8]`"])
            uses.setdefault(expr.name, set()).add("input")
        elif isinstance(expr, A.GetAttr):
            if not isinstance(expr.target, A.Capture):
                self.error(expr.span, "bad-example", "an example reads a declared buffer, as in `get_attr $b`")
            elif expr.target.name not in declared:
                self.error(expr.target.span, "bad-example", f"`${expr.target.name}` is not declared after `given`")
            else:
                uses.setdefault(expr.target.name, set()).add("buffer")
        elif isinstance(expr, (A.Wildcard, A.Alt, A.Bind, A.Ellipsis_)):
            what = {A.Wildcard: "`_`", A.Alt: "an alternation `|`", A.Bind: "`as`", A.Ellipsis_: "`...`"}[type(expr)]
            self.error(expr.span, "bad-example", f"{what} cannot appear in an example: an example is one concrete model")
        elif isinstance(expr, A.Literal):
            return
        elif isinstance(expr, A.Name):
            if len(expr.dotted.parts) == 1:
                self.error(expr.span, "bad-example", f"`{expr.dotted.text}` is not defined in an example",
                           notes=["an example uses its declared inputs (`$x`), literals and dotted constants"])
            else:
                self.constant(expr.dotted)
        elif isinstance(expr, (A.ListExpr, A.TupleExpr)):
            for item in expr.items:
                self.example_expr(item, declared, uses)
        elif isinstance(expr, A.Call):
            self.example_call(expr, declared, uses)

    def example_call(self, call: A.Call, declared: dict, uses: dict) -> None:
        if call.args is None:
            self.error(call.span, "bad-example", "a call in an example needs its argument list",
                       notes=["write `(...)` after the target, as in `call_module ReLU($x)`"])
        if call.op == "call_function":
            self.function_target(call.target, Position.EXAMPLE)
        elif call.op == "call_method":
            self.method_target(call.target, Position.EXAMPLE)
            if call.target.parts[0].startswith("_"):
                self.error(call.target.span, "bad-example", f"an example may not call `{call.target.text}`")
            if not call.args:
                self.error(call.span, "bad-example", "a method call needs the tensor it is called on as its "
                                                     "first argument")
        elif call.builder_args is not None:
            self.error(call.span, "bad-example", "an example constructs modules from keyword arguments in braces",
                       notes=[f"write `call_module {call.target.text}{{name=value, ...}}(...)`"])
        else:
            module_class = self.module_type(call.target)
            self.duplicate_keywords(call.attrs or (), "bad-example", "constructor argument")
            for keyword in call.attrs or ():
                self.module_attribute(keyword, module_class, pattern=False)
                if not _literal_value(keyword.value):
                    self.error(keyword.value.span, "bad-example",
                               "a constructor argument in an example is a literal, a constant or a list of them")
            self.constructor_arguments(call, module_class, "bad-example")
        if call.args is not None:
            self.argument_list(call, None, "bad-example")
            for arg in call.args:
                self.example_expr(arg, declared, uses)
            for keyword in call.kwargs:
                self.example_expr(keyword.value, declared, uses)

    def same(self, a: A.Expr, b: A.Expr) -> bool:
        """Whether two expressions are the same once names are expanded (``F.relu`` is
        ``torch.nn.functional.relu``, ``Conv2d`` is ``torch.nn.Conv2d``), ``as`` is dropped and
        keyword arguments are put in order. Stops at the first difference: most rules differ
        from their pattern near the root, and this runs for every rule."""
        while type(a) is A.Bind:
            a = a.expr
        while type(b) is A.Bind:
            b = b.expr
        kind = type(a)
        if kind is not type(b):
            return False
        if kind is A.Call:
            return (a.op == b.op and self.call_target(a) == self.call_target(b)
                    and self.same_items(a.args, b.args) and self.same_keywords(a.kwargs, b.kwargs)
                    and self.same_keywords(a.attrs, b.attrs) and self.same_items(a.builder_args, b.builder_args))
        if kind is A.ListExpr or kind is A.TupleExpr:
            return self.same_items(a.items, b.items)
        if kind is A.Alt:
            return self.same_items(a.options, b.options)
        if kind is A.Name and (len(a.dotted.parts) > 1 or len(b.dotted.parts) > 1):
            return (len(a.dotted.parts) > 1 and len(b.dotted.parts) > 1
                    and self.full_path(a.dotted) == self.full_path(b.dotted))
        return a == b  # as written (spans aside)

    def same_items(self, a: Optional[tuple], b: Optional[tuple]) -> bool:
        if a is None or b is None:
            return a is b
        return len(a) == len(b) and all(self.same(x, y) for x, y in zip(a, b))

    def same_keywords(self, a: Optional[tuple], b: Optional[tuple]) -> bool:
        """Keyword arguments (or attributes) by name, whatever their order."""
        if a is None or b is None:
            return a is b
        if len(a) != len(b):
            return False
        a, b = sorted(a, key=_name), sorted(b, key=_name)
        return all(x.name == y.name and self.same(x.value, y.value) for x, y in zip(a, b))

    def call_target(self, call: A.Call) -> str:
        """The full path of a call's target (a method's name as written)."""
        if call.op == "call_method":
            return call.target.text
        if call.op == "call_module" and len(call.target.parts) == 1 and call.target.parts[0] not in self.aliases:
            return "torch.nn." + call.target.parts[0]
        return self.full_path(call.target)

    # -- patterns --------------------------------------------------------------------
    def pattern(self, expr: A.Expr, scope: _Scope, *, root: bool, enclosing: tuple[str, ...]) -> None:
        if isinstance(expr, A.Call):  # the most common first (the kinds are disjoint: the order is only speed)
            self.pattern_call(expr, scope, enclosing)
        elif isinstance(expr, A.Capture):
            if root:
                self.error(expr.span, "bad-pattern", "a pattern root must be an operation, not a capture",
                           notes=["write `call_function ...`, `call_method ...`, `call_module ...` or `get_attr ...`"])
            scope.captures.setdefault(expr.name, expr.span)
        elif isinstance(expr, A.Wildcard):
            if root:
                self.error(expr.span, "bad-pattern", "a pattern root must be an operation, not `_`")
        elif isinstance(expr, A.Literal):
            if root:
                self.error(expr.span, "bad-pattern", "a pattern root must be an operation, not a literal")
        elif isinstance(expr, A.Name):
            if root:
                self.error(expr.span, "bad-pattern", "a pattern root must be an operation, not a name")
            elif len(expr.dotted.parts) == 1:
                scope.references.append((expr.dotted.parts[0], expr.span, enclosing))
            else:
                self.constant(expr.dotted)
        elif isinstance(expr, (A.ListExpr, A.TupleExpr)):
            if root:
                self.error(expr.span, "bad-pattern", "a pattern root must be an operation, not a list")
            for item in expr.items:
                self.nested_value(item, scope, enclosing)
        elif isinstance(expr, A.Ellipsis_):
            self.error(expr.span, "ellipsis-misuse", "`...` may only end an argument list")
        elif isinstance(expr, A.GetAttr):
            if isinstance(expr.target, A.Capture):
                scope.captures.setdefault(expr.target.name, expr.target.span)
        elif isinstance(expr, A.Alt):
            self.alternation(expr, scope, root=root, enclosing=enclosing)
        elif isinstance(expr, A.Bind):
            if expr.name in scope.names:
                self.error(expr.span, "duplicate-binding", f"`{expr.name}` is already bound in this pattern",
                           notes=[f"first bound at {scope.name_spans[expr.name]}"])
            else:
                scope.names[expr.name] = expr.expr
                scope.name_spans[expr.name] = expr.span
            self.pattern(expr.expr, scope, root=root, enclosing=enclosing + (expr.name,))

    def nested_value(self, item: A.Expr, scope: _Scope, enclosing: tuple[str, ...]) -> None:
        if isinstance(item, A.Ellipsis_):
            self.error(item.span, "ellipsis-misuse", "`...` may only end an argument list, not a list or tuple")
        else:
            self.pattern(item, scope, root=False, enclosing=enclosing)

    def alternation(self, expr: A.Alt, scope: _Scope, *, root: bool, enclosing: tuple[str, ...]) -> None:
        bound_sets = []
        before = scope.bound()
        names_before, spans_before = dict(scope.names), dict(scope.name_spans)
        for option in expr.options:  # each option starts from what was bound before the alternation
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
        first, _ = bound_sets[0]
        for other, option in bound_sets[1:]:
            if other != first:
                missing = sorted(first ^ other)
                self.error(option.span, "alternation-binding",
                           "the options of an alternation must bind the same captures and names",
                           notes=[f"bound by some options but not others: {', '.join(missing)}"])
                break

    def pattern_call(self, call: A.Call, scope: _Scope, enclosing: tuple[str, ...]) -> None:
        module_class = None
        if call.op == "call_function":
            self.function_target(call.target, Position.PATTERN)
        elif call.op == "call_method":
            self.method_target(call.target, Position.PATTERN)
        else:
            if call.builder_args is not None:
                self.error(call.span, "bad-pattern", "a module builder can only appear in a replacement",
                           notes=["a pattern matches modules by type: `call_module Conv2d(...)`"])
            else:
                module_class = self.module_type(call.target)
            self.duplicate_keywords(call.attrs or (), "bad-pattern", "attribute")
            for keyword in call.attrs or ():
                self.module_attribute(keyword, module_class, pattern=True)
                self.attribute_value(keyword.value, scope, pattern=True)
        if call.args is not None:
            self.argument_list(call, scope, "bad-pattern")
            for arg in call.args:
                if not isinstance(arg, A.Ellipsis_):
                    self.pattern(arg, scope, root=False, enclosing=enclosing)
            for keyword in call.kwargs:
                self.pattern(keyword.value, scope, root=False, enclosing=enclosing)

    def argument_list(self, call: A.Call, scope: Optional[_Scope], code: str) -> None:
        """``...`` at most once, and only after the positional arguments; no keyword twice.

        ``code`` says where the call is: ``bad-pattern``, ``bad-replacement`` or ``bad-example``."""
        positions = [i for i, arg in enumerate(call.args or ()) if isinstance(arg, A.Ellipsis_)]
        for i in positions[1:]:
            self.error(call.args[i].span, "ellipsis-misuse", "`...` may appear only once in an argument list")
        if len(positions) == 1 and positions[0] != len(call.args) - 1:
            self.error(call.args[positions[0]].span, "ellipsis-misuse",
                       "`...` must be the last positional argument")
        if code == "bad-pattern" and positions and scope is not None:
            scope.ellipses.append(call.args[positions[0]].span)
        self.duplicate_keywords(call.kwargs, code, "keyword argument")

    def duplicate_keywords(self, keywords: tuple, code: str, what: str) -> None:
        """Each keyword (argument or attribute) whose name an earlier one of ``keywords`` has.

        By name only: keywords compare equal without their spans, so ``inplace=False,
        inplace=False`` are two equal keywords, and looking one up by equality finds the first."""
        if len(keywords) < 2:
            return
        first: dict[str, A.Keyword] = {}
        for keyword in keywords:
            earlier = first.get(keyword.name)
            if earlier is None:
                first[keyword.name] = keyword
            else:
                self.error(keyword.span, code, f"{what} `{keyword.name}` is given twice",
                           notes=[f"first given at {earlier.span}"])

    def attribute_value(self, value: A.Expr, scope: _Scope, *, pattern: bool) -> None:
        if isinstance(value, (A.Call, A.GetAttr, A.Alt, A.Bind, A.Ellipsis_)):
            self.error(value.span, "bad-pattern" if pattern else "bad-replacement",
                       "a module attribute must be a literal, a capture, a constant or a list of them")
            return
        if isinstance(value, (A.ListExpr, A.TupleExpr)):
            for item in value.items:
                self.attribute_value(item, scope, pattern=pattern)
        elif pattern:
            self.pattern(value, scope, root=False, enclosing=())
        else:
            self.replacement(value, scope, root=False)

    def check_references(self, scope: _Scope) -> None:
        for name, span, enclosing in scope.references:
            if name in enclosing:
                self.error(span, "bad-pattern", f"`{name}` is used inside the pattern it names",
                           notes=["a reference must point to a node outside its own definition"])
            elif name not in scope.names:
                self.unbound_name(name, span, scope)

    def check_ellipses(self, rule: A.Rule, scope: _Scope) -> None:
        uses = [e for root in rule.replacements for e in _replacement_ellipses(root)]
        if uses and len(scope.ellipses) == 0:
            self.error(uses[0], "ellipsis-misuse",
                       "the replacement forwards `...`, but the pattern has no `...` to take arguments from")
        elif uses and len(scope.ellipses) > 1:
            self.error(uses[0], "ellipsis-misuse",
                       "the replacement forwards `...`, but the pattern has several; it would be ambiguous",
                       notes=[f"the pattern's `...` are at {', '.join(str(s) for s in scope.ellipses)}"])

    def unbound_name(self, name: str, span: A.Span, scope: _Scope) -> None:
        bound = sorted(scope.names)
        notes = [f"the pattern names: {', '.join(bound)}" if bound else "the pattern names no node with `as`"]
        close = difflib.get_close_matches(name, bound, n=1)
        if close:
            notes.append(f"did you mean `{close[0]}`?")
        self.error(span, "unbound-name", f"`{name}` is not a node the pattern names with `as`", notes=notes)

    def unbound_capture(self, name: str, span: A.Span, scope: _Scope, where: str) -> None:
        bound = sorted(scope.captures)
        notes = [f"the pattern binds: {', '.join('$' + c for c in bound)}" if bound else "the pattern binds no capture"]
        close = difflib.get_close_matches(name, bound, n=1)
        if close:
            notes.append(f"did you mean `${close[0]}`?")
        self.error(span, "unbound-capture", f"{where} uses `${name}`, which the pattern does not bind", notes=notes)

    # -- conditions --------------------------------------------------------------------
    def condition(self, cond: A.Cond, scope: _Scope) -> None:
        if isinstance(cond, A.CCapture):
            if cond.name not in scope.captures:
                self.unbound_capture(cond.name, cond.span, scope, "the condition")
        elif isinstance(cond, A.CName):
            if cond.name not in scope.names:
                self.condition_name(cond, scope)
        elif isinstance(cond, A.CLiteral):
            pass
        elif isinstance(cond, A.CAttr):
            if cond.attr.startswith("__"):
                self.error(cond.span, "forbidden-target", f"a condition may not read the dunder attribute `{cond.attr}`")
                return
            chain = A.name_chain(cond)
            if chain is not None and chain[0] not in scope.names:
                head = A.CName(chain[0], cond.span)
                if self.is_module_head(chain[0]):
                    self.condition_constant(A.Dotted(chain, cond.span))
                else:
                    self.condition_name(head, scope)
                return
            if isinstance(cond.value, A.CCapture) and cond.attr not in CAPTURE_ATTRIBUTES:
                self.error(cond.span, "unknown-attribute", f"a capture has no attribute `{cond.attr}`",
                           notes=[f"captures expose: {', '.join(sorted(CAPTURE_ATTRIBUTES))}"])
            elif chain is None and cond.attr not in CAPTURE_ATTRIBUTES and not _rooted_at_name(cond.value):
                self.error(cond.span, "forbidden-target",
                           f"a condition may read only tensor metadata from a computed value, not `{cond.attr}`",
                           notes=[f"metadata: {', '.join(sorted(CAPTURE_ATTRIBUTES))}; module attributes are read "
                                  f"through a name bound with `as` (`bn.training`)"])
            self.condition(cond.value, scope)
        elif isinstance(cond, A.CIndex):
            self.condition(cond.value, scope)
            self.condition(cond.index, scope)
        elif isinstance(cond, A.CCall):
            self.condition_call(cond, scope)
        elif isinstance(cond, A.CList):
            for item in cond.items:
                self.condition(item, scope)
        elif isinstance(cond, A.CUnary):
            self.condition(cond.operand, scope)
        elif isinstance(cond, A.CBinary):
            self.condition(cond.left, scope)
            self.condition(cond.right, scope)

    def is_module_head(self, name: str) -> bool:
        return name in self.aliases or name in BUILTIN_ALIASES

    def condition_constant(self, dotted: A.Dotted) -> None:
        """A dotted constant in a condition: it must resolve, and not to a module (a value to reach through)."""
        if self.alias_reported(dotted):
            return
        resolution = self.resolver.resolve(self.full_path(dotted))
        if resolution.is_error:
            self.report(dotted.span, resolution, "unknown-target")
        elif self.refused(dotted.span, allowlist.refuse_constant(self.full_path(dotted), self.resolver.packages)):
            return
        elif resolution.ok and isinstance(resolution.value, type(A)):
            self.error(dotted.span, "forbidden-target",
                       f"a condition may not use the module `{dotted.text}` as a value")

    def condition_name(self, cond: A.CName, scope: _Scope) -> None:
        if cond.name in PREDICATE_NAMES or cond.name in CONDITION_FUNCTIONS:
            self.error(cond.span, "unknown-name", f"`{cond.name}` is a function; call it, as in `{cond.name}($x)`")
            return
        known = sorted(scope.names) + sorted(PREDICATE_NAMES)
        close = difflib.get_close_matches(cond.name, known, n=1)
        notes = [f"the pattern names: {', '.join(sorted(scope.names))}" if scope.names
                 else "the pattern names no node with `as`"]
        if close:
            notes.append(f"did you mean `{close[0]}`?")
        self.error(cond.span, "unknown-name", f"the condition uses `{cond.name}`, which is not bound or known",
                   notes=notes)

    def condition_call(self, cond: A.CCall, scope: _Scope) -> None:
        for arg in cond.args:
            self.condition(arg, scope)
        func = cond.func
        if isinstance(func, A.CName):
            if func.name in PREDICATE_NAMES or func.name in CONDITION_FUNCTIONS:
                return
            close = difflib.get_close_matches(func.name, sorted(PREDICATE_NAMES | CONDITION_FUNCTION_NAMES), n=1)
            self.error(func.span, "unknown-predicate", f"`{func.name}` is not a built-in predicate",
                       notes=[f"built-in predicates: {', '.join(sorted(PREDICATE_NAMES))}",
                              "a Python function can be named by its dotted path, as in `mypkg.preds.is_small($x)`"]
                       + ([f"did you mean `{close[0]}`?"] if close else []))
            return
        chain = A.name_chain(func)
        if chain is None:
            # a method on a value, e.g. `$x.is_contiguous()`
            if isinstance(func, A.CAttr) and isinstance(func.value, A.CCapture) and func.attr in CAPTURE_ATTRIBUTES:
                self.condition(func.value, scope)
                return
            self.error(func.span, "unknown-predicate", "only predicates and dotted function paths can be called")
            return
        if chain[0] in scope.names:
            self.error(func.span, "unknown-predicate", "only predicates and dotted function paths can be called",
                       notes=[f"`{chain[0]}` is a matched node"])
            return
        path = expand(chain, self.aliases) or ".".join(chain)
        if path.startswith("builtins.") or path in NEVER_CREATED or any(p.startswith("_") for p in path.split(".")):
            self.error(func.span, "forbidden-target",
                       f"a condition may not call `{path}`",
                       notes=[f"the pure builtins a condition may call by bare name: "
                              f"{', '.join(sorted(CONDITION_FUNCTION_NAMES))}"])
            return
        resolution = self.resolver.resolve(path)
        if resolution.is_error:
            self.report(func.span, resolution, "unknown-predicate")
        elif self.refused(func.span, allowlist.refuse_condition_call(path, self.resolver.packages)):
            return
        elif resolution.ok and not callable(resolution.value):
            self.error(func.span, "unknown-predicate", f"`{path}` is not callable")

    # -- replacements --------------------------------------------------------------------
    def replacement(self, expr: A.Expr, scope: _Scope, *, root: bool) -> None:
        if isinstance(expr, A.Call):  # the most common first (the kinds are disjoint: the order is only speed)
            self.replacement_call(expr, scope, root=root)
        elif isinstance(expr, A.Capture):
            if expr.name not in scope.captures:
                self.unbound_capture(expr.name, expr.span, scope, "the replacement")
        elif isinstance(expr, A.Wildcard):
            self.error(expr.span, "bad-replacement", "`_` matches anything, so it cannot be built",
                       notes=["bind the value with a capture (`$x`) in the pattern and use that"])
        elif isinstance(expr, A.Literal):
            if root:
                self.error(expr.span, "bad-replacement", "a node cannot be replaced by a literal",
                           notes=["a replacement root is an operation or a value the pattern binds"])
        elif isinstance(expr, A.Name):
            if len(expr.dotted.parts) == 1:
                if expr.dotted.parts[0] not in scope.names:
                    self.unbound_name(expr.dotted.parts[0], expr.span, scope)
            elif root:
                self.error(expr.span, "bad-replacement", "a node cannot be replaced by a constant")
            else:
                self.constant(expr.dotted)
        elif isinstance(expr, (A.ListExpr, A.TupleExpr)):
            if root:
                self.error(expr.span, "bad-replacement", "a node cannot be replaced by a list")
            for item in expr.items:
                if isinstance(item, A.Ellipsis_):
                    self.error(item.span, "ellipsis-misuse", "`...` may only end an argument list")
                else:
                    self.replacement(item, scope, root=False)
        elif isinstance(expr, A.Ellipsis_):
            self.error(expr.span, "ellipsis-misuse", "`...` may only end an argument list")
        elif isinstance(expr, A.GetAttr):
            if not isinstance(expr.target, A.Capture):
                self.error(expr.span, "bad-replacement",
                           "a replacement can read only an attribute the pattern binds, as in `get_attr $p`")
            elif expr.target.name not in scope.captures:
                self.unbound_capture(expr.target.name, expr.target.span, scope, "the replacement")
        elif isinstance(expr, A.Alt):
            self.error(expr.span, "bad-replacement", "an alternation `|` can only appear in a pattern")
        elif isinstance(expr, A.Bind):
            self.error(expr.span, "bad-replacement", "`as` can only name nodes of the pattern")
            self.replacement(expr.expr, scope, root=root)

    def replacement_call(self, call: A.Call, scope: _Scope, *, root: bool) -> None:
        if call.args is None and not root:
            self.error(call.span, "bad-replacement",
                       "a call without an argument list forwards the matched node's arguments, so it can only be "
                       "a whole replacement", notes=["give it arguments, as in `call_function torch.relu($x)`"])
        if call.op == "call_function":
            self.function_target(call.target, Position.REPLACEMENT)  # the allow-list refuses NEVER_CREATED
        elif call.op == "call_method":
            self.method_target(call.target, Position.REPLACEMENT)  # and dunder methods
        elif call.builder_args is not None:
            self.builder(call, scope)
        elif len(call.target.parts) == 1 and call.target.parts[0] in scope.names:
            named = _unwrap(scope.names[call.target.parts[0]])
            if not (isinstance(named, A.Call) and named.op == "call_module"):
                self.error(call.target.span, "bad-replacement",
                           f"`{call.target.text}` names a node that is not a call_module, so it cannot be called")
            if call.attrs is not None:
                self.error(call.span, "bad-replacement",
                           "a matched module is called as it is; it takes no constructor arguments")
        else:
            module_class = self.module_type(call.target)
            self.duplicate_keywords(call.attrs or (), "bad-replacement", "constructor argument")
            for keyword in call.attrs or ():
                self.module_attribute(keyword, module_class, pattern=False)
                self.attribute_value(keyword.value, scope, pattern=False)
            self.constructor_arguments(call, module_class)
        if call.args is not None:
            self.argument_list(call, None, "bad-replacement")
            for arg in call.args:
                if not isinstance(arg, A.Ellipsis_):
                    self.replacement(arg, scope, root=False)
            for keyword in call.kwargs:
                self.replacement(keyword.value, scope, root=False)

    def builder(self, call: A.Call, scope: _Scope) -> None:
        if call.attrs is not None:
            self.error(call.span, "bad-replacement", "a module builder takes matched modules, not attributes")
        for arg in call.builder_args or ():
            if isinstance(arg, A.Keyword):
                self.error(arg.span, "bad-replacement",
                           "a module builder takes the names of matched modules, not keyword arguments")
                continue
            if isinstance(arg, A.Capture):  # a matched parameter (get_attr) or constant, e.g. for aten graphs
                if arg.name not in scope.captures:
                    self.unbound_capture(arg.name, arg.span, scope, "the builder's arguments")
                continue
            if not (isinstance(arg, A.Name) and len(arg.dotted.parts) == 1):
                self.error(arg.span, "bad-replacement",
                           "a module builder takes the names of matched modules or captures, as in "
                           "`fold_conv_bn(conv, bn)` or `fold_aten_conv_bn($w, $b, ...)`")
                continue
            name = arg.dotted.parts[0]
            if name not in scope.names:
                self.unbound_name(name, arg.span, scope)
                continue
            named = _unwrap(scope.names[name])
            if not _is_module_pattern(named):
                self.error(arg.span, "bad-replacement", f"`{name}` is not a matched call_module node",
                           notes=["a module builder receives the nn.Module instances of matched call_module nodes"])
        path = expand(call.target.parts, self.aliases) or call.target.text
        resolution = self.resolver.resolve(path)
        if resolution.is_error:
            self.report(call.target.span, resolution, "unknown-builder")
        elif resolution.ok and (isinstance(resolution.value, type) or not callable(resolution.value)):
            self.error(call.target.span, "unknown-builder", f"`{path}` is not a builder function",
                       notes=["a builder is a function taking matched modules and returning a new nn.Module"])
        else:
            self.refused(call.target.span, allowlist.refuse_builder(path, self.resolver.packages))

    def constructor_arguments(self, call: A.Call, module_class: Any, code: str = "bad-replacement") -> None:
        """Constructing ``TYPE{...}`` must supply every required constructor argument."""
        signature = _constructor_signature(module_class)
        if signature is None:
            return
        given = {k.name for k in call.attrs or ()}
        missing = [
            p.name for p in signature.parameters.values()
            if p.default is inspect.Parameter.empty
            and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
            and p.name not in given
        ]
        if missing:
            self.error(call.span, code,
                       f"constructing `{module_class.__name__}` needs {', '.join('`' + m + '`' for m in missing)}",
                       notes=[f"write `call_module {call.target.text}{{{', '.join(m + '=...' for m in missing)}}}(...)`"])

    # -- names ---------------------------------------------------------------------------
    def report(self, span: A.Span, resolution: Resolution, code: str) -> None:
        """Turn a failed resolution into a diagnostic (its own code for policy errors)."""
        if resolution.status == "unknown-alias":
            head = resolution.path.split(".", 1)[0]
            if head in self.bad_aliases:
                return  # its `use` line is reported already
        status = resolution.status if resolution.status in ("import-not-allowed", "forbidden-target",
                                                            "unknown-alias", "not-allowed") else code
        notes = []
        if status == code:
            suggestion = _suggest(resolution.path, self.resolver)
            if suggestion:
                notes.append(f"did you mean `{suggestion}`?")
        self.error(span, status, resolution.message, notes=notes)

    def refused(self, span: A.Span, refusal: Optional[str]) -> bool:
        """Report an allow-list refusal (fxrules.lang.allowlist) as `not-allowed`; whether there was one."""
        if refusal is None:
            return False
        self.error(span, "not-allowed", refusal, notes=["see SECURITY.md: rule files name only what the allow-list "
                                                        "permits"])
        return True

    def full_path(self, dotted: A.Dotted) -> str:
        return expand(dotted.parts, self.aliases) or dotted.text

    def alias_reported(self, dotted: A.Dotted) -> bool:
        return dotted.parts[0] in self.bad_aliases

    def constant(self, dotted: A.Dotted) -> None:
        if self.alias_reported(dotted):
            return
        resolution = self.resolver.resolve(self.full_path(dotted))
        if resolution.is_error:
            self.report(dotted.span, resolution, "unknown-target")
        else:
            self.refused(dotted.span, allowlist.refuse_constant(self.full_path(dotted), self.resolver.packages))

    def function_target(self, target: A.Dotted, position: Position) -> None:
        if self.alias_reported(target):
            return
        if len(target.parts) == 1 and target.parts[0] not in self.aliases and target.parts[0] not in BUILTIN_ALIASES:
            path = builtin_path(target.parts[0])
            if path is None:
                notes = []
                if self.torch:
                    import torch

                    if hasattr(torch, target.parts[0]):
                        notes.append(f"did you mean `torch.{target.parts[0]}`?")
                self.error(target.span, "unknown-target",
                           f"`{target.text}` is not a known function; name it by its dotted path",
                           notes=notes or ["for example `torch.relu`, `F.gelu`, `operator.add` or `aten.mm.default`"])
                return
        else:
            path = self.full_path(target)
        resolution = self.resolver.resolve(path)
        if resolution.is_error:
            self.report(target.span, resolution, "unknown-target")
        elif self.refused(target.span, allowlist.refuse_function(path, position, self.resolver.packages)):
            return
        elif resolution.ok and not callable(resolution.value):
            self.error(target.span, "unknown-target", f"`{path}` is not callable")

    def method_target(self, target: A.Dotted, position: Position) -> None:
        if not self.torch:
            self.refused(target.span, allowlist.refuse_method(target.parts[0], position))
            return
        import torch

        name = target.parts[0]
        if not hasattr(torch.Tensor, name):
            close = difflib.get_close_matches(name, [n for n in dir(torch.Tensor) if not n.startswith("_")], n=1)
            self.error(target.span, "unknown-method", f"`torch.Tensor` has no method `{name}`",
                       notes=[f"did you mean `{close[0]}`?"] if close else [])
            return
        self.refused(target.span, allowlist.refuse_method(name, position))

    def module_type(self, target: A.Dotted) -> Any:
        """The module class, or None when it cannot be resolved (reported) or torch is missing."""
        if self.alias_reported(target):
            return None
        if len(target.parts) == 1 and target.parts[0] not in self.aliases:
            path = "torch.nn." + target.parts[0]
        else:
            path = self.full_path(target)
        resolution = self.resolver.resolve(path)
        if resolution.is_error:
            self.report(target.span, resolution, "unknown-module-type")
            return None
        if resolution.ok and not _is_module_class(resolution.value):
            self.error(target.span, "unknown-module-type", f"`{path}` is not an nn.Module subclass")
            return None
        if self.refused(target.span, allowlist.refuse_module_type(path, self.resolver.packages)) or not resolution.ok:
            return None
        return resolution.value

    def module_attribute(self, keyword: A.Keyword, module_class: Any, *, pattern: bool) -> None:
        if module_class is None:
            return
        signature = _constructor_signature(module_class)
        if signature is None:
            return
        params = [p for p in signature.parameters.values()
                  if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
        names = {p.name for p in params}
        allowed = names | ({"training"} if pattern else set())
        if keyword.name not in allowed:
            close = difflib.get_close_matches(keyword.name, sorted(allowed), n=1)
            self.error(keyword.span, "unknown-attribute",
                       f"`{module_class.__name__}` has no constructor argument `{keyword.name}`",
                       notes=[f"it takes: {', '.join(sorted(allowed))}"]
                       + ([f"did you mean `{close[0]}`?"] if close else []))


def _is_module_class(value: Any) -> bool:
    import torch

    return isinstance(value, type) and issubclass(value, torch.nn.Module)


def _product(shape: tuple) -> int:
    total = 1
    for d in shape:
        total *= d
    return total


def _literal_value(expr: A.Expr) -> bool:
    if isinstance(expr, (A.ListExpr, A.TupleExpr)):
        return all(_literal_value(i) for i in expr.items)
    return isinstance(expr, A.Literal) or (isinstance(expr, A.Name) and len(expr.dotted.parts) > 1)


def _rooted_at_name(cond: A.Cond) -> bool:
    """An attribute chain on a bare name (``bn.weight``), possibly indexed (``conv.kernel_size[0]``)."""
    while isinstance(cond, (A.CAttr, A.CIndex)):
        cond = cond.value
    return isinstance(cond, A.CName)


def _name(keyword: A.Keyword) -> str:
    return keyword.name


def _filled(replacement: A.Expr, pattern: A.Expr) -> A.Expr:
    """A bare replacement call (``call_module M``) with the arguments of the pattern root it forwards."""
    root = _unwrap(pattern)
    if (isinstance(replacement, A.Call) and replacement.args is None and isinstance(root, A.Call)
            and root.op == replacement.op):
        return A.Call(replacement.op, replacement.target, root.args, root.kwargs, replacement.attrs,
                      replacement.builder_args)
    return replacement


def _constructor_signature(module_class: Any) -> Optional[inspect.Signature]:
    if module_class is None:
        return None
    try:
        signature = inspect.signature(module_class.__init__)
    except (TypeError, ValueError):
        return None
    parameters = [p for name, p in signature.parameters.items() if name != "self"]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None  # accepts anything
    return signature.replace(parameters=parameters)


def _suggest(path: str, resolver: Resolver) -> Optional[str]:
    owner, _, last = path.rpartition(".")
    if not owner:
        return None
    resolution = resolver.resolve(owner)
    if not resolution.ok:
        return None
    try:
        candidates = [n for n in dir(resolution.value) if not n.startswith("_")]
    except Exception:
        return None
    close = difflib.get_close_matches(last, candidates, n=1)
    return f"{owner}.{close[0]}" if close else None


def _unwrap(expr: A.Expr) -> A.Expr:
    while isinstance(expr, A.Bind):
        expr = expr.expr
    return expr


def _is_module_pattern(expr: A.Expr) -> bool:
    expr = _unwrap(expr)
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


def check_file(rule_file: A.RuleFile, resolver: Resolver) -> tuple[list[CheckedRule], list[Diagnostic]]:
    """Check one file. Returns the rules without errors and all diagnostics (errors and warnings)."""
    checker = _FileChecker(rule_file, resolver)
    rules = checker.run()
    return rules, checker.diagnostics


def check_duplicates(rules: Iterable[A.Rule]) -> list[Diagnostic]:
    """``duplicate-rule`` for every named rule whose name an earlier rule of the set already has."""
    first: dict[str, A.Rule] = {}
    diagnostics = []
    for rule in rules:
        if rule.name is None:
            continue
        if rule.name in first:
            diagnostics.append(Diagnostic.at(rule.name_span, "duplicate-rule",
                                             f"a rule named `{rule.name}` is already defined",
                                             notes=[f"first defined at {first[rule.name].span.location}"]))
        else:
            first[rule.name] = rule
    return diagnostics
