"""Rules compiled to matcher programs, and the index that finds candidate rules for a node.

A pattern AST becomes a tree of ``P*`` nodes whose targets are resolved Python
objects (functions, method names, module classes) and whose argument lists are
pre-bound to the target's signatures. A replacement becomes a tree of ``R*``
templates. Rules are indexed by the (op, target) of their first root, so a
node is only ever tried against the rules that can match it.

Compiling needs torch; it happens once per rule set (cached on the RuleSet).
"""

from __future__ import annotations

import inspect
import threading
import weakref
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Iterator, Optional, Union

import fxrules.lang.ast as A
import fxrules.engine.signatures as signatures
from fxrules.engine.conditions import module_flag
from fxrules.lang import allowlist
from fxrules.lang.allowlist import Position
from fxrules.lang.commutative import MAX_COMMUTING_DEPTH, Commutation, commutation
from fxrules.lang.diagnostics import Diagnostic, RuleFileError
from fxrules.lang.names import builtin_path, expand
from fxrules.lang.ruleset import CheckedRule, RuleSet

# ---------------------------------------------------------------------------
# Pattern programs
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PCapture:
    """``$name``: matches any value and binds it (the same name twice must bind the same value)."""

    name: str
    span: A.Span = field(default=A.NO_SPAN, compare=False)


@dataclass(frozen=True, slots=True)
class PWildcard:
    """``_``: matches any value and binds nothing."""


@dataclass(frozen=True, slots=True)
class PLiteral:
    """A literal (number, string, bool, None): matches an equal value of the same kind."""

    value: Any
    span: A.Span = field(default=A.NO_SPAN, compare=False)


@dataclass(frozen=True, slots=True)
class PConst:
    """A named constant (``torch.float32``): matches that value; ``label`` is how the rule wrote it."""

    value: Any
    label: str
    span: A.Span = field(default=A.NO_SPAN, compare=False)


@dataclass(frozen=True, slots=True)
class PRef:
    """A reference to a node bound earlier with ``as``: matches that same node."""

    name: str
    span: A.Span = field(default=A.NO_SPAN, compare=False)


@dataclass(frozen=True, slots=True)
class PVariadic:
    """``*$xs``, last in an argument list or a list: binds the remaining items as a tuple."""

    name: str
    span: A.Span = field(default=A.NO_SPAN, compare=False)


@dataclass(frozen=True, slots=True)
class PSeq:
    """A list or tuple pattern: matches a sequence with matching items, in order."""

    items: tuple
    span: A.Span = field(default=A.NO_SPAN, compare=False)


@dataclass(frozen=True, slots=True)
class PAlt:
    """Alternatives ``a | b``: the first option that matches, tried in order."""

    options: tuple


@dataclass(frozen=True, slots=True)
class PBind:
    """``inner as name``: what ``inner`` matches, bound as ``name``."""

    inner: Any
    name: str


@dataclass(frozen=True, slots=True)
class PGetAttr:
    """A ``get_attr`` pattern: the attribute of a qualified name, or (``get_attr $w``) any attribute, bound as ``capture``."""

    qualname: Optional[str]
    capture: Optional[str]
    span: A.Span


@dataclass(frozen=True, slots=True)
class PCall:
    """A call pattern. ``args is None``: any arguments. ``overloads``: (signature, param -> P) pairs."""

    op: str
    targets: tuple  # functions, method names, or module classes
    label: str
    args: Optional[tuple]
    kwargs: tuple  # ((name, P), ...)
    rest: bool  # ends with `...`
    overloads: tuple  # ((inspect.Signature, {param: P}), ...); empty: compare as written
    attrs: tuple  # ((name, P), ...) module attribute constraints
    span: A.Span
    commutes: Optional[Commutation] = None  # its two operands may match in either order (lang.commutative)
    in_order: bool = False  # its first signature binds its arguments to its first parameters, in order (_in_order)


Pattern = Union[PCapture, PWildcard, PLiteral, PConst, PRef, PSeq, PAlt, PBind, PGetAttr, PCall, PVariadic]

# ---------------------------------------------------------------------------
# Replacement templates
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RValue:
    """A capture (``$x``) or a node named with ``as``."""

    name: str
    is_capture: bool


@dataclass(frozen=True, slots=True)
class RLiteral:
    """A literal in a replacement: the value itself."""

    value: Any


@dataclass(frozen=True, slots=True)
class RSplat:
    """``*$xs`` in a replacement's argument list or list: the items the capture bound, spliced in."""

    name: str


@dataclass(frozen=True, slots=True)
class RShared:
    """``CALL as name`` in a replacement: the node ``inner`` builds, kept as ``name`` for :class:`RRef`."""

    inner: Any
    name: str


@dataclass(frozen=True, slots=True)
class RRef:
    """A later use of a node the replacement built and named (:class:`RShared`): the same node, built once."""

    name: str


@dataclass(frozen=True, slots=True)
class RComputed:
    """``{cond}``: a value computed from the match when the rewrite is made, by the conditions'
    evaluator (:mod:`fxrules.engine.conditions`, with its allow-list and budget); it must come out
    a constant a graph can hold (:func:`fxrules.engine.conditions.constant_value`)."""

    cond: Any  # A.Cond
    aliases: Any  # the rule's alias table
    resolver: Any  # the rule set's Resolver (its import policy)
    span: A.Span = field(default=A.NO_SPAN, compare=False)


@dataclass(frozen=True, slots=True)
class RSeq:
    """A list or tuple in a replacement: its items, built as ``kind``."""

    items: tuple
    kind: type  # list or tuple


@dataclass(frozen=True, slots=True)
class RNewModule:
    """A new module a replacement calls (``call_module torch.nn.ReLU{inplace=False}``): ``cls(**dict(attrs))``."""

    cls: type
    attrs: tuple  # ((name, R), ...)


@dataclass(frozen=True, slots=True)
class RBuilder:
    """A module a builder function makes from matched modules and captures (``fxrules.builders``)."""

    function: Any
    label: str
    names: tuple[str, ...]  # `as` names of matched modules; "$x" for a capture (a parameter or a constant)


@dataclass(frozen=True, slots=True)
class RReuse:
    """A matched module called again by the replacement (``call_module inner($x)``)."""

    name: str  # a matched call_module node, called again


@dataclass(frozen=True, slots=True)
class RCall:
    """A node to create. ``args is None``: forward the arguments of root ``root_index``."""

    op: str
    target: Any  # function, method name, or RNewModule/RBuilder/RReuse
    label: str
    args: Optional[tuple]
    kwargs: tuple
    rest: bool
    root_index: int
    span: A.Span
    respells: Optional[str] = None  # the `as` name (or a hidden one) of the matched node this call computes again


Replacement = Union[RValue, RLiteral, RSeq, RCall, RComputed, RShared, RRef, RSplat]


@dataclass(frozen=True, slots=True)
class Program:
    """One compiled rule."""

    rule: CheckedRule
    roots: tuple  # Pattern per root
    conditions: tuple  # A.Cond
    replacements: tuple  # Replacement per root
    keys: tuple  # index keys of the first root
    needs_metadata: bool  # a condition reads shape/dtype of a node
    requires: tuple = ()  # PCall patterns that must each match an input node of the first root (see _requires)
    module_calls: tuple = ()  # replacement RCalls that construct a module (builder or class), in build order
    requires_keys: tuple = ()  # per `requires` pattern: frozenset of the (op, target) it matches, or None
    reads: tuple = ()  # what the replacements read from a match (see _reads), computed once
    prefilter: Optional[frozenset] = None  # the one requires_keys set, when that is the whole pre-check
    computed: tuple = ()  # the replacements' RComputed values, evaluated before the graph is touched
    method_objects: tuple = ()  # (RCall, capture name or None: forwarded): call_method replacements' objects
    flags: tuple = ()  # per condition: its conditions.ModuleFlag form (`not bn.training`), or None
    reused_modules: tuple = ()  # `as` names of matched call_module nodes whose module a replacement call calls again
    new_calls_only: bool = False  # see _new_calls_only
    source: str = ""  # the rule's ``file:line`` (CheckedRule.source, formatted once: every report entry names it)
    calls: tuple = ()  # every RCall of the replacements (nested ones and shared nodes' included), outermost first
    makes_nodes: bool = False  # some call of `calls` makes a node (one that does not compute a matched node again)
    further_keys: tuple = ()  # per further root (roots[1:]): the (op, target) pairs it can match, or None (see _call_keys)

    def __post_init__(self) -> None:
        object.__setattr__(self, "source", self.rule.source)
        object.__setattr__(self, "calls", tuple(item for item in replacement_items(self.replacements)
                                                if isinstance(item, RCall)))
        object.__setattr__(self, "makes_nodes", any(call.respells is None for call in self.calls))
        object.__setattr__(self, "computed", _computed(self.replacements))
        object.__setattr__(self, "method_objects", _method_objects(self.replacements))
        object.__setattr__(self, "flags", tuple(module_flag(c) for c in self.conditions))
        object.__setattr__(self, "reused_modules", tuple(dict.fromkeys(
            item.target.name for item in replacement_items(self.replacements)
            if isinstance(item, RCall) and isinstance(item.target, RReuse))))
        if any(_reads_metadata(c.cond) for c in self.computed):
            object.__setattr__(self, "needs_metadata", True)
        keys = tuple(_match_keys(p) for p in self.requires)
        object.__setattr__(self, "requires_keys", keys)
        object.__setattr__(self, "reads", _reads(self.replacements))
        object.__setattr__(self, "new_calls_only", _new_calls_only(self.replacements, self.reads))
        object.__setattr__(self, "prefilter", keys[0] if len(keys) == 1 else None)
        object.__setattr__(self, "further_keys", tuple(_call_keys(root) for root in self.roots[1:]))

    @property
    def name(self) -> str:
        return self.rule.name


# ---------------------------------------------------------------------------
# Compiling
# ---------------------------------------------------------------------------

_METADATA_ATTRS = frozenset({"shape", "ndim", "dtype", "device", "numel", "is_contiguous", "requires_grad"})


class RuleCompiler:
    """Turns one checked rule into a :class:`Program`.

    Every name is decided by the allow-list again here (``not-allowed``), before it is
    resolved: a RuleSet is a public dataclass and a CheckedRule can be made from a parsed AST
    without the checker, so the engine does not take "checked" on trust (defence in depth;
    the checker reports the same refusals, located, for every file it reads).
    """

    def __init__(self, rule: CheckedRule, rule_set: RuleSet):
        self.rule = rule
        self.resolver = rule_set.resolver
        self.aliases = rule.aliases
        self.sources = rule_set.sources
        self.position = Position.PATTERN
        self.commuting_depth = 0  # commutative call patterns around the one being compiled

    def fail(self, span: A.Span, code: str, message: str) -> RuleFileError:
        return RuleFileError([Diagnostic.at(span, code, message)], dict(self.sources))

    def allowed(self, span: A.Span, refusal: Optional[str]) -> None:
        if refusal is not None:
            raise self.fail(span, "not-allowed", refusal)

    def constant(self, dotted: A.Dotted, span: A.Span) -> Any:
        path = self.full(dotted)
        self.allowed(span, allowlist.refuse_constant(path, self.resolver.packages))
        return self.resolve(path, span, "unknown-target")

    def resolve(self, path: str, span: A.Span, code: str) -> Any:
        resolution = self.resolver.resolve(path)
        if not resolution.ok:
            raise self.fail(span, code if resolution.status in ("unavailable", "unknown-target") else resolution.status,
                            resolution.message or f"`{path}` does not resolve")
        return resolution.value

    def full(self, dotted: A.Dotted) -> str:
        return expand(dotted.parts, self.aliases) or dotted.text

    def function_path(self, dotted: A.Dotted) -> str:
        if len(dotted.parts) == 1 and dotted.parts[0] not in self.aliases:
            return builtin_path(dotted.parts[0]) or self.full(dotted)
        return self.full(dotted)

    def function(self, dotted: A.Dotted) -> Any:
        path = self.function_path(dotted)
        self.allowed(dotted.span, allowlist.refuse_function(path, self.position, self.resolver.packages))
        return self.resolve(path, dotted.span, "unknown-target")

    def module_class(self, dotted: A.Dotted) -> type:
        if len(dotted.parts) == 1 and dotted.parts[0] not in self.aliases:
            path = "torch.nn." + dotted.parts[0]
        else:
            path = self.full(dotted)
        self.allowed(dotted.span, allowlist.refuse_module_type(path, self.resolver.packages))
        return self.resolve(path, dotted.span, "unknown-module-type")

    # -- patterns ----------------------------------------------------------------
    def pattern(self, expr: A.Expr) -> Pattern:
        if isinstance(expr, A.Capture):
            return PCapture(expr.name, expr.span)
        if isinstance(expr, A.Variadic):
            return PVariadic(expr.name, expr.span)
        if isinstance(expr, A.Wildcard):
            return PWildcard()
        if isinstance(expr, A.Literal):
            return PLiteral(expr.value, expr.span)
        if isinstance(expr, A.Name):
            if len(expr.dotted.parts) == 1:
                return PRef(expr.dotted.parts[0], expr.span)
            return PConst(self.constant(expr.dotted, expr.span), expr.dotted.text, expr.span)
        if isinstance(expr, (A.ListExpr, A.TupleExpr)):
            return PSeq(tuple(self.pattern(i) for i in expr.items), expr.span)
        if isinstance(expr, A.Alt):
            return PAlt(tuple(self.pattern(o) for o in expr.options))
        if isinstance(expr, A.Bind):
            return PBind(self.pattern(expr.expr), expr.name)
        if isinstance(expr, A.GetAttr):
            target = expr.target
            return PGetAttr(target.text if isinstance(target, A.Dotted) else None,
                            target.name if isinstance(target, A.Capture) else None, expr.span)
        if isinstance(expr, A.Call):
            return self.call_pattern(expr)
        raise self.fail(expr.span, "bad-pattern", "this cannot be matched")  # pragma: no cover - checker rejects

    def call_pattern(self, call: A.Call) -> PCall:
        if call.op == "call_function":
            targets: tuple = (self.function(call.target),)
            sigs = signatures.for_function(targets[0])
        elif call.op == "call_method":
            self.allowed(call.target.span, allowlist.refuse_method(call.target.parts[0], self.position))
            targets = (call.target.parts[0],)
            sigs = signatures.for_method(call.target.parts[0])
        else:
            targets = (self.module_class(call.target),)
            sigs = signatures.for_module(targets[0])
        attrs = tuple((k.name, self.pattern(k.value)) for k in call.attrs or ())
        if call.args is None:
            return PCall(call.op, targets, call.target.text, None, (), True, (), attrs, call.span)
        rest = call.has_ellipsis
        commutes = self.commutation(call)
        self.commuting_depth += commutes is not None
        try:
            positional = tuple(self.pattern(a) for a in call.args if not isinstance(a, A.Ellipsis_))
            keywords = tuple((k.name, self.pattern(k.value)) for k in call.kwargs)
        finally:
            self.commuting_depth -= commutes is not None
        overloads = []
        if positional and type(positional[-1]) is PVariadic:
            sigs = ()  # `*$xs` takes the rest as written: compared positionally
        for sig in sigs:  # for call_method, the first argument is `self`, as in torch.NAME(input, ...)
            bound = signatures.bind(sig, positional, dict(keywords), partial=rest)
            if bound is not None:
                overloads.append((sig, {name: _seq(value) for name, value in bound.items()}))
        if commutes is not None and not any(commutes.first in bound and commutes.second in bound
                                            for _, bound in overloads):
            commutes = None  # the pattern must give both operands to exchange them (others: by name, when bound)
        # No signature fits (e.g. `x.reshape(2, -1)`: the method takes *shape, torch.reshape a
        # tuple): compare the arguments as written. The checker accepted the rule, so it must apply.
        commutes = commutes if overloads else None
        return PCall(call.op, targets, call.target.text, positional, keywords, rest, tuple(overloads), attrs, call.span,
                     commutes, _in_order(overloads, positional, keywords, rest, commutes))

    def commutation(self, call: A.Call) -> Optional[Commutation]:
        """How a call pattern commutes (:mod:`fxrules.lang.commutative`), within the nesting bound."""
        if self.commuting_depth >= MAX_COMMUTING_DEPTH or call.op == "call_module":
            return None
        path = call.target.parts[0] if call.op == "call_method" else self.function_path(call.target)
        return commutation(call.op, path)

    # -- replacements ----------------------------------------------------------------
    def replacement(self, expr: A.Expr, root_index: int) -> Replacement:
        if isinstance(expr, A.Capture):
            return RValue(expr.name, True)
        if isinstance(expr, A.Variadic):
            return RSplat(expr.name)
        if isinstance(expr, A.Literal):
            return RLiteral(expr.value)
        if isinstance(expr, A.Name):
            if len(expr.dotted.parts) == 1 and expr.dotted.parts[0] in self.shared_names:
                return RRef(expr.dotted.parts[0])
            if len(expr.dotted.parts) == 1:
                return RValue(expr.dotted.parts[0], False)
            return RLiteral(self.constant(expr.dotted, expr.span))
        if isinstance(expr, A.Bind) and isinstance(expr.expr, A.Call):
            return RShared(self.call_replacement(expr.expr, root_index), expr.name)
        if isinstance(expr, A.ListExpr):
            return RSeq(tuple(self.replacement(i, root_index) for i in expr.items), list)
        if isinstance(expr, A.TupleExpr):
            return RSeq(tuple(self.replacement(i, root_index) for i in expr.items), tuple)
        if isinstance(expr, A.GetAttr) and isinstance(expr.target, A.Capture):
            return RValue(expr.target.name, True)
        if isinstance(expr, A.Call):
            return self.call_replacement(expr, root_index)
        if isinstance(expr, A.Computed):
            return RComputed(expr.cond, self.aliases, self.resolver, expr.span)
        raise self.fail(expr.span, "bad-replacement", "this cannot be built")  # pragma: no cover - checker rejects

    def call_replacement(self, call: A.Call, root_index: int) -> RCall:
        if call.op == "call_function":
            target: Any = self.function(call.target)
            self.allowed(call.target.span, allowlist.refuse_literal_call(self.function_path(call.target), call))
        elif call.op == "call_method":
            self.allowed(call.target.span, allowlist.refuse_method(call.target.parts[0], self.position))
            target = call.target.parts[0]
        elif call.builder_args is not None:
            self.allowed(call.target.span, allowlist.refuse_builder(self.full(call.target), self.resolver.packages))
            function = self.resolve(self.full(call.target), call.target.span, "unknown-builder")
            # matched module names, and captures as "$name" (their values: parameters or constants)
            target = RBuilder(function, call.target.text, tuple(
                "$" + a.name if isinstance(a, A.Capture) else a.dotted.parts[0] for a in call.builder_args))
        elif len(call.target.parts) == 1 and call.target.parts[0] in self.bound_names:
            target = RReuse(call.target.parts[0])
        else:
            cls = self.module_class(call.target)
            target = RNewModule(cls, tuple((k.name, self.replacement(k.value, root_index)) for k in call.attrs or ()))
        if call.args is None:
            return RCall(call.op, target, call.target.text, None, (), False, root_index, call.span)
        args = tuple(self.replacement(a, root_index) for a in call.args if not isinstance(a, A.Ellipsis_))
        kwargs = tuple((k.name, self.replacement(k.value, root_index)) for k in call.kwargs)
        return RCall(call.op, target, call.target.text, args, kwargs, call.has_ellipsis, root_index, call.span)

    # -- the rule ------------------------------------------------------------------
    def program(self) -> Program:
        ast = self.rule.ast
        patterns = self.rule.pattern_roots
        self.bound_names = A.bound_names(patterns)
        self.position = Position.PATTERN
        roots = tuple(self.pattern(p) for p in patterns)
        self.position = Position.REPLACEMENT
        self.shared_names = A.bound_names(ast.replacements)  # nodes a replacement builds once and names
        replacements = tuple(self.replacement(r, i) for i, r in enumerate(ast.replacements))
        roots, replacements = respelled(roots, replacements)
        return Program(self.rule, roots, ast.conditions, replacements, _keys(roots[0]),
                       any(_reads_metadata(c) for c in ast.conditions), _requires(roots[0]),
                       _module_calls(replacements))


# ---------------------------------------------------------------------------
# Replacement calls that compute a matched node again
# ---------------------------------------------------------------------------

HIDDEN_NAME_PREFIX = "%"
"""Names the compiler gives matched nodes a replacement re-spells but the rule leaves unnamed: no rule
can write one (an ``as`` name is an identifier), so none is seen by conditions or clashes with a rule's."""

_PLAIN_LITERALS = (int, bool, str, type(None))
"""Literal types equal exactly when ``==`` says so (not floats: ``-0.0 == 0.0``, ``nan != nan``)."""


def respelled(roots: tuple, replacements: tuple) -> tuple[tuple, tuple]:
    """The roots and replacements of a rule, each replacement call that computes a matched node again
    marked with that node's name (:attr:`RCall.respells`), decided here, once, rather than per match.

    ``F.gelu(l($x))`` in ``Dropout(F.gelu(Linear($x) as l)) -> F.gelu(l($x))`` re-spells the matched
    gelu and Linear nodes: the rewrite keeps both (it replaces the root by the gelu node) instead of
    building copies. A call re-spells a pattern call (never a root) when both have the same op and
    one target (the call_module's ``as`` name, for a module), no ``...`` and no commuting operands,
    and the same arguments as written, position by position and keyword by keyword: the same
    captures, the same names, exact literals (not floats), or calls that re-spell the pattern's call
    at that place. The matched node then computes the same call: the matcher bound its arguments
    to the pattern's exactly (captures and names are those values; every argument the pattern does
    not mention is absent or at its default), so the replacement's call would have the same
    arguments, spelled as the rule spells them.

    Only calls reached from the root through call arguments and ``as`` are considered (not inside an
    alternative or a sequence: those may match otherwise). A re-spelled call the rule left unnamed is
    named with a hidden name (:data:`HIDDEN_NAME_PREFIX`) by wrapping it in a :class:`PBind`; in a rule
    of several roots only calls the rule names itself are used (a name's node seeds the search for
    the further roots, so no names are added there)."""
    named: dict = {}  # id(PCall) -> (PCall, its `as` name or None)
    _named_calls(roots[0], named, root=True)
    for root in roots[1:]:
        _named_calls(root, named, root=True)
    if not named:
        return roots, replacements
    hidden: dict = {}  # id(PCall) -> the hidden name given to it
    may_hide = len(roots) == 1
    marked = tuple(_mark(r, named, hidden, may_hide) for r in replacements)
    if not hidden:
        return roots, marked
    return tuple(_with_names(r, hidden) for r in roots), marked


def _named_calls(pattern: Any, found: dict, *, root: bool = False, name: Optional[str] = None) -> None:
    """The pattern calls below ``pattern`` (not itself when it is the root) that every match binds:
    reached through call arguments and ``as`` only."""
    if isinstance(pattern, PBind):
        _named_calls(pattern.inner, found, root=root, name=pattern.name)
        return
    if not isinstance(pattern, PCall):
        return
    if not root:
        found[id(pattern)] = (pattern, name)
    for arg in pattern.args or ():
        _named_calls(arg, found)
    for _, value in pattern.kwargs:
        _named_calls(value, found)


def _mark(item: Any, named: dict, hidden: dict, may_hide: bool) -> Any:
    """``item`` with its calls (nested ones first) marked where they re-spell a pattern call."""
    if isinstance(item, RSeq):
        return RSeq(tuple(_mark(i, named, hidden, may_hide) for i in item.items), item.kind)
    if isinstance(item, RShared):
        return RShared(_mark(item.inner, named, hidden, may_hide), item.name)
    if not isinstance(item, RCall) or item.args is None:
        return item
    args = tuple(_mark(a, named, hidden, may_hide) for a in item.args)
    kwargs = tuple((k, _mark(v, named, hidden, may_hide)) for k, v in item.kwargs)
    item = replace(item, args=args, kwargs=kwargs)
    for pattern, name in named.values():
        if not _respells(item, pattern, name, named, hidden):
            continue
        if name is None:
            name = hidden.get(id(pattern))
            if name is None:
                if not may_hide:
                    continue
                name = hidden[id(pattern)] = f"{HIDDEN_NAME_PREFIX}{len(hidden) + 1}"
        return replace(item, respells=name)
    return item


def _respells(call: RCall, pattern: PCall, name: Optional[str], named: dict, hidden: dict) -> bool:
    if call.op != pattern.op or call.rest or pattern.rest or pattern.commutes is not None:
        return False
    if pattern.args is None or len(call.args) != len(pattern.args) or len(call.kwargs) != len(pattern.kwargs):
        return False
    if call.op == "call_module":
        if not (isinstance(call.target, RReuse) and name is not None and call.target.name == name):
            return False
    elif len(pattern.targets) != 1 or not (pattern.targets[0] is call.target or
                                           (call.op == "call_method" and pattern.targets[0] == call.target)):
        return False
    if not all(_same_item(r, p, named, hidden) for r, p in zip(call.args, pattern.args)):
        return False
    expected = dict(pattern.kwargs)
    return all(key in expected and _same_item(value, expected[key], named, hidden) for key, value in call.kwargs)


def _same_item(item: Any, pattern: Any, named: dict, hidden: dict) -> bool:
    """Whether replacement argument ``item`` is, in every match, the value pattern argument ``pattern`` bound."""
    bound_name = None
    if isinstance(pattern, PBind):
        bound_name, pattern = pattern.name, pattern.inner
    kind = type(item)
    if kind is RValue:
        if item.is_capture:
            return isinstance(pattern, PCapture) and pattern.name == item.name
        return item.name == bound_name or (isinstance(pattern, PRef) and pattern.name == item.name)
    if kind is RLiteral:
        value = item.value
        return isinstance(pattern, PLiteral) and type(value) in _PLAIN_LITERALS and \
            type(pattern.value) is type(value) and pattern.value == value
    if kind is RCall:
        if item.respells is None or not isinstance(pattern, PCall) or id(pattern) not in named:
            return False
        return item.respells == (bound_name or hidden.get(id(pattern)))
    return False


def _with_names(pattern: Any, hidden: dict) -> Any:
    """``pattern`` with each call in ``hidden`` (by id) wrapped in a PBind of its hidden name; the calls
    above them rebuilt around the new arguments (their signature bindings too)."""
    if isinstance(pattern, PBind):
        inner = _with_names(pattern.inner, hidden)
        return pattern if inner is pattern.inner else PBind(inner, pattern.name)
    if not isinstance(pattern, PCall) or pattern.args is None:
        return pattern
    swapped: dict = {}  # id(old argument) -> new argument
    for arg in tuple(pattern.args) + tuple(v for _, v in pattern.kwargs):
        new = _with_names(arg, hidden)
        if isinstance(arg, PCall) and id(arg) in hidden:
            new = PBind(new, hidden[id(arg)])
        if new is not arg:
            swapped[id(arg)] = new
    if not swapped:
        return pattern

    def get(p: Any) -> Any:
        if isinstance(p, PSeq):  # a var-positional parameter's patterns (_seq): the same objects inside
            items = tuple(swapped.get(id(i), i) for i in p.items)
            return p if all(a is b for a, b in zip(items, p.items)) else PSeq(items, p.span)
        return swapped.get(id(p), p)

    overloads = tuple((sig, {param: get(p) for param, p in bound.items()}) for sig, bound in pattern.overloads)
    return replace(pattern, args=tuple(get(a) for a in pattern.args),
                   kwargs=tuple((k, get(v)) for k, v in pattern.kwargs), overloads=overloads)


READ_CAPTURE, READ_NAME, READ_ROOT_ARGUMENTS, READ_REST, READ_MODULE_NAME = range(5)


def _reads(replacements: tuple) -> tuple:
    """What the replacements read from a match, as ``(kind, key)`` pairs: a capture or an ``as``
    name used as a value, the arguments of a root a call forwards (``key``: the root's index),
    what ``...`` took, and the ``as`` names of matched modules a call re-calls or a builder takes.
    The planner turns them into the nodes the replacement uses."""
    found: dict = {}
    stack = list(replacements)
    while stack:
        item = stack.pop()
        if isinstance(item, RShared):
            stack.append(item.inner)
        elif isinstance(item, RSplat):
            found[(READ_CAPTURE, item.name)] = None
        elif isinstance(item, RValue):
            found[(READ_CAPTURE if item.is_capture else READ_NAME, item.name)] = None
        elif isinstance(item, RSeq):
            stack.extend(item.items)
        elif isinstance(item, RCall):
            if item.args is None:
                found[(READ_ROOT_ARGUMENTS, item.root_index)] = None
            else:
                stack.extend(item.args)
                stack.extend(v for _, v in item.kwargs)
                if item.rest:
                    found[(READ_REST, None)] = None
            target = item.target
            if isinstance(target, RBuilder):
                found.update(((READ_MODULE_NAME, n), None) for n in target.names if not n.startswith("$"))
            elif isinstance(target, RReuse):
                found[(READ_MODULE_NAME, target.name)] = None
            elif isinstance(target, RNewModule):
                stack.extend(v for _, v in target.attrs)
    return tuple(found)


def replacement_items(replacements: tuple) -> Iterator[Any]:
    """Every item of the replacements' templates, each before what it holds and in the order written:
    each template, the node a shared node (``CALL as name``) builds, a sequence's items, a call's
    module's constructor arguments, its arguments and its keywords. The one walk over templates, so that
    no reader of them misses a kind of item (the calls in shared nodes were once missed)."""
    stack = list(reversed(replacements))
    while stack:
        item = stack.pop()
        yield item
        if isinstance(item, RShared):
            stack.append(item.inner)
        elif isinstance(item, RSeq):
            stack.extend(reversed(item.items))
        elif isinstance(item, RCall):
            stack.extend(reversed([v for _, v in item.kwargs]))
            stack.extend(reversed(item.args or ()))
            if isinstance(item.target, RNewModule):
                stack.extend(reversed([v for _, v in item.target.attrs]))


def _new_calls_only(replacements: tuple, reads: tuple) -> bool:
    """Whether every call of the replacements calls a module the rule makes (a builder's or a class's),
    with the arguments the rule writes, and the replacements read nothing of a match but its captures
    and the modules of its named nodes (a builder's inputs): a rule folding modules into one,
    ``BatchNorm2d(Conv2d($x) as conv) as bn -> fold_conv_bn(conv, bn)($x)``. Such a replacement
    keeps no matched node (:func:`fxrules.engine.planner.kept_nodes`) unless a capture binds one."""
    calls = [item for item in replacement_items(replacements) if isinstance(item, RCall)]
    return bool(calls) and all(
        c.op == "call_module" and isinstance(c.target, (RBuilder, RNewModule)) and c.args is not None and not c.rest
        for c in calls) and all(kind in (READ_CAPTURE, READ_MODULE_NAME) for kind, _ in reads)


def shared_template(replacements: tuple, name: str) -> Any:
    """The template of the shared node ``CALL as name`` among ``replacements``: what a later use of
    ``name`` (an :class:`RRef`, in any root's replacement) stands for. The checker makes every later
    use refer to one."""
    for item in replacement_items(replacements):
        if isinstance(item, RShared) and item.name == name:
            return item.inner
    raise KeyError(f"no shared node `{name}` in the replacements")


def _computed(replacements: tuple) -> tuple:
    """The computed values (``{...}``) of the replacements, module constructor arguments included."""
    return tuple(item for item in replacement_items(replacements) if isinstance(item, RComputed))


def _method_objects(replacements: tuple) -> tuple:
    """``(call, capture)`` for each replacement ``call_method NAME($capture, ...)``: a capture may bind a
    literal, on which no method can be called (the code would not compile): checked before a rewrite."""
    found = []
    stack = list(replacements)
    while stack:
        item = stack.pop()
        if isinstance(item, RShared):
            stack.append(item.inner)
        elif isinstance(item, RSeq):
            stack.extend(item.items)
        elif isinstance(item, RCall):
            if item.op == "call_method" and item.args is None:
                found.append((item, None))  # forwards its root's arguments: the first is the object
            elif item.op == "call_method" and item.args and isinstance(item.args[0], RValue) and item.args[0].is_capture:
                found.append((item, item.args[0].name))
            stack.extend(item.args or ())
            stack.extend(v for _, v in item.kwargs)
    return tuple(found)


def graph_constant(value: Any, span: A.Span) -> Any:
    """A computed value as a graph may hold it: None, a bool, int, float or str, a dtype, device,
    layout or memory format, or a list or tuple of them (a shape becomes a tuple). Anything else (a
    tensor, a module, a symbolic size) raises TypeError: the rule is wrong, not the model."""
    import torch

    if value is None or type(value) in (bool, int, float, str):
        return value
    if isinstance(value, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return value
    if isinstance(value, torch.Size):
        value = tuple(value)
    if type(value) in (list, tuple):
        return type(value)(graph_constant(item, span) for item in value)
    raise TypeError(f"the computed value at {span} is {type(value).__name__}, not a constant a graph can hold "
                    f"(a number, string, bool, None, dtype, device, or a list or tuple of them)")


def _module_calls(replacements: tuple) -> tuple:
    """The replacement calls that construct a module, in the order they are built (last item first,
    depth first): a rewrite makes every module before it touches the graph."""
    found = []
    stack = list(replacements)
    while stack:
        item = stack.pop()
        if isinstance(item, RShared):
            stack.append(item.inner)
        elif isinstance(item, RSeq):
            stack.extend(item.items)
        elif isinstance(item, RCall):
            stack.extend(item.args or ())
            stack.extend(v for _, v in item.kwargs)
            if isinstance(item.target, (RBuilder, RNewModule)):
                found.append(item)
    return tuple(found)


def _in_order(overloads: list, positional: tuple, keywords: tuple, rest: bool, commutes: Any) -> bool:
    """Whether a call pattern's arguments, all positional (no keywords, no ``...``, no exchanged
    operands), bind to its first signature's first parameters one by one. A node whose arguments
    are as many and all positional then binds that signature the same way, every parameter the
    pattern leaves out absent: comparing the arguments in order is the same test as binding them
    (the matcher's shortcut, :meth:`fxrules.engine.matcher._Matcher.arguments`)."""
    if not overloads or keywords or rest or commutes is not None:
        return False
    sig, bound = overloads[0]
    params = list(sig.parameters.values())[:len(positional)]
    if len(params) != len(positional) or len(bound) != len(positional):
        return False
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return all(p.kind in kinds and bound.get(p.name) is arg for p, arg in zip(params, positional))


def _seq(value: Any) -> Any:
    """A var-positional parameter binds a tuple of patterns: match it as a sequence."""
    if isinstance(value, tuple):
        return PSeq(value)
    return value


def _keys(pattern: Pattern) -> tuple:
    """Index keys of a root pattern: ("call_function", fn), ("call_method", name), ("call_module", cls), ("get_attr",)."""
    if isinstance(pattern, PBind):
        return _keys(pattern.inner)
    if isinstance(pattern, PAlt):
        return tuple(k for option in pattern.options for k in _keys(option))
    if isinstance(pattern, PGetAttr):
        return (("get_attr", None),)
    if isinstance(pattern, PCall):
        return tuple((pattern.op, t) for t in pattern.targets)
    return ()


def _requires(root: Pattern) -> tuple:
    """The call patterns among the first root's direct arguments: a cheap test before matching.

    Each must match a node among the root node's inputs (a call pattern only matches a graph
    node, and an argument's node is an input), so a node none of whose inputs has the pattern's
    op and target cannot match: the engine skips it without binding arguments. Empty (no test)
    when the pattern reads module attributes anywhere: matching reads them (which may raise)
    before it gets to the arguments, and skipping must not hide such an error.
    """
    while isinstance(root, PBind):
        root = root.inner
    if not isinstance(root, PCall) or root.args is None or _reads_attrs(root):
        return ()
    found = []
    for arg in tuple(root.args) + tuple(v for _, v in root.kwargs):
        while isinstance(arg, PBind):
            arg = arg.inner
        if isinstance(arg, PCall):
            found.append(arg)
    return tuple(found)


def _match_keys(pattern: "PCall") -> Optional[frozenset]:
    """The (op, target) pairs of nodes a call_function/call_method pattern can match, for a set
    test (equal targets hash alike); None for module patterns (matched by the module's class)
    and unhashable targets."""
    if pattern.op not in ("call_function", "call_method"):
        return None
    try:
        return frozenset((pattern.op, t) for t in pattern.targets)
    except TypeError:
        return None


def _call_keys(pattern: Pattern) -> Optional[frozenset]:
    """The (op, target) pairs of the nodes a root pattern can match, when it only matches call_function,
    call_method and call_module nodes (a call pattern, bound or among alternatives) with hashable targets
    (a module pattern's pair is ("call_module", its class): it matches a module call of that class or a
    subclass); else None. The search for a multi-root rule's further roots skips a candidate whose pair is
    not among them (a module call whose module is of none of the classes): the matcher would refuse it on its
    op, target or class, before reading anything else."""
    keys = _keys(pattern)
    if not keys or any(op not in ("call_function", "call_method", "call_module") for op, _ in keys):
        return None
    try:
        return frozenset(keys)
    except TypeError:
        return None


def _reads_attrs(pattern: Pattern) -> bool:
    stack = [pattern]
    while stack:
        p = stack.pop()
        if isinstance(p, PCall):
            if p.attrs:
                return True
            stack.extend(p.args or ())  # the overloads bind these same pattern objects
            stack.extend(v for _, v in p.kwargs)
        elif isinstance(p, PAlt):
            stack.extend(p.options)
        elif isinstance(p, PSeq):
            stack.extend(p.items)
        elif isinstance(p, PBind):
            stack.append(p.inner)
    return False


def _reads_metadata(cond: A.Cond) -> bool:
    stack = [cond]
    while stack:
        c = stack.pop()
        if isinstance(c, A.CAttr):
            if c.attr in _METADATA_ATTRS and not isinstance(c.value, A.CAttr):
                return True
            stack.append(c.value)
        elif isinstance(c, A.CIndex):
            stack.extend((c.value, c.index))
        elif isinstance(c, A.CSlice):
            stack.extend(c.parts())
        elif isinstance(c, A.CCall):
            stack.append(c.func)
            stack.extend(c.args)
        elif isinstance(c, A.CList):
            stack.extend(c.items)
        elif isinstance(c, A.CUnary):
            stack.append(c.operand)
        elif isinstance(c, A.CBinary):
            stack.extend((c.left, c.right))
        elif isinstance(c, A.CGenerator):
            stack.extend((c.element, c.iterable) + ((c.filter,) if c.filter is not None else ()))
    return False


# ---------------------------------------------------------------------------
# The index
# ---------------------------------------------------------------------------


_CLASS_CACHE_SIZE = 4096
"""Module classes whose candidates a CompiledRules remembers; beyond this it starts over (it holds
the classes alive, and every GraphModule instance has a class of its own)."""


@dataclass(frozen=True)
class CompiledRules:
    """All programs of a rule set and the (op, target) index over their first roots."""

    programs: tuple
    by_key: dict  # key -> tuple of programs, in rule order
    module_keys: bool  # whether any rule's root is a call_module (needs module lookups per node)
    by_class: dict = field(default_factory=dict, compare=False)  # module class -> candidates, filled on use
    # id(program) -> (program, its direct matcher or None): fxrules.engine.matcher.direct_matcher, made on first use
    direct: dict = field(default_factory=dict, compare=False)

    def candidates(self, node, module_of) -> tuple:
        """Programs whose first root can match ``node`` (in rule order)."""
        op = node.op
        if op == "call_module":
            if not self.module_keys:
                return ()
            module = module_of(node.target)
            if module is None:
                return ()
            cls = type(module)
            found = self.by_class.get(cls)
            if found is None:
                if len(self.by_class) >= _CLASS_CACHE_SIZE:  # each GraphModule has a class of its own
                    self.by_class.clear()
                found = self.by_class.setdefault(cls, self._for_class(cls))
            return found
        if op == "get_attr":
            return self.by_key.get(("get_attr", None), ())
        if op in ("call_function", "call_method"):
            try:
                return self.by_key.get((op, node.target), ())
            except TypeError:  # an unhashable target
                return ()
        return ()


    def scan(self, nodes: Iterable, module_of) -> Iterator[tuple]:
        """``(node, candidates)`` for each of ``nodes`` that has candidates: what calling
        :meth:`candidates` per node gives, with the common cases (a call_function or call_method
        node, whose target no rule roots on; a module call, whose class was seen before) decided
        inline, without a call per node."""
        get = self.by_key.get
        by_class = self.by_class
        module_keys = self.module_keys
        for node in nodes:
            op = node.op
            if op == "call_function" or op == "call_method":
                try:
                    found = get((op, node.target))
                except TypeError:  # an unhashable target
                    continue
            elif op == "call_module":  # (candidates' module case, written out: a remembered class)
                if not module_keys:
                    continue
                module = module_of(node.target)
                if module is None:
                    continue
                found = by_class.get(type(module))
                if found is None:
                    found = self.candidates(node, module_of)
            else:
                found = self.candidates(node, module_of)
            if found:
                yield node, found

    def _for_class(self, cls: type) -> tuple:
        """Programs rooted on ``cls`` or a base class of it, in rule order."""
        found: list = []
        for base in cls.__mro__:
            found.extend(self.by_key.get(("call_module", base), ()))
        found.sort(key=lambda p: p.rule.index)
        return tuple(found)


def further_roots(programs: tuple) -> Optional[CompiledRules]:
    """The index over the further roots of the multi-root programs (``roots[1:]``), keyed as the first
    roots are, for the fixpoint's revisit: a rewrite that changes a node this index finds may have made it
    the further root of a match whose first root is a sibling (another user of the same capture). None
    when a further root has no index key (a capture, or a named node): any node may then be one."""
    by_key: dict = {}
    for program in programs:
        for root in program.roots[1:]:
            keys = _keys(root)
            if not keys:
                return None
            for key in keys:
                found = by_key.setdefault(key, [])
                if program not in found:
                    found.append(program)
    return CompiledRules(tuple(p for p in programs if len(p.roots) > 1), {k: tuple(v) for k, v in by_key.items()},
                         any(k[0] == "call_module" for k in by_key))


_compiled: "weakref.WeakKeyDictionary[RuleSet, CompiledRules]" = weakref.WeakKeyDictionary()
"""Each rule set's compiled rules, for as long as the rule set lives (and no longer: a weak key).

Keyed by the RuleSet object itself: RuleSet compares and hashes by identity (``eq=False``),
so two rule sets with equal rules are two entries, and a RuleSet is never mutated for this
(it stays the front end's frozen value; compiling is the engine's business). A CompiledRules
holds CheckedRules and programs, never the RuleSet, so the value keeps no key alive."""

_compiled_lock = threading.Lock()  # WeakKeyDictionary is not safe to write from several threads


def compile_rules(rule_set: RuleSet) -> CompiledRules:
    """Compile every rule once per rule set; later calls with the same RuleSet object reuse it."""
    with _compiled_lock:
        found = _compiled.get(rule_set)
    if found is not None:
        return found
    programs = tuple(RuleCompiler(rule, rule_set).program() for rule in rule_set.rules)
    compiled = index_programs(programs)
    with _compiled_lock:
        return _compiled.setdefault(rule_set, compiled)


def index_programs(programs: tuple) -> CompiledRules:
    """``programs`` (in rule order) with the (op, target) index over their first roots."""
    by_key: dict = {}
    for program in programs:
        for key in dict.fromkeys(program.keys):
            by_key.setdefault(key, []).append(program)
    return CompiledRules(programs, {k: tuple(v) for k, v in by_key.items()},
                         any(k[0] == "call_module" for k in by_key))
