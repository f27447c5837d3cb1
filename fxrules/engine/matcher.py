"""Matching compiled patterns against torch.fx nodes.

``match_program(program, node, graph_view)`` returns a :class:`Match` (the
bindings and matched nodes) or a :class:`Miss` (the deepest point the match
reached and why it stopped there: what ``explain`` shows).

Semantics (see docs/semantics.md):

* call_function targets match by identity; call_method by name; call_module by
  the module's type: an instance of the pattern's class, or of a subclass that
  overrides nothing the computation uses (:func:`computes_as`: not ``forward``,
  not a method or attribute of the class or its bases, such as
  ``_check_input_dim``).
* Arguments are compared after binding both sides to the target's signature,
  so ``sum(x, 1)`` and ``sum(x, dim=1)`` are the same call; a parameter the
  pattern does not mention must be absent or at its default unless the pattern
  ends with ``...``.
* Literals match by value and type (``1`` matches neither ``1.0`` nor ``True``).
* An alternation takes its first option that matches; there is no backtracking
  into an alternation once the pattern moved past it. Multi-root patterns take,
  for each further root, the first node that matches.
"""

from __future__ import annotations

import functools
import heapq
from dataclasses import dataclass
from typing import Any, Callable, Optional

from torch import fx

import fxrules.lang.ast as A
import fxrules.engine.signatures as signatures
from fxrules.engine import fxaccess
from fxrules.engine.program import (PAlt, PBind, PCall, PCapture, PConst, PGetAttr, PLiteral, Program, PRef, PSeq, PVariadic,
                                   PWildcard)
from fxrules.engine.refusals import MissCode
from fxrules.engine.users import HUB, UsersByKey

_MISSING = object()

# Failure codes as module globals: fail() is called on every failed attempt, explained or not.
(_OP, _TARGET, _ATTRIBUTE, _ARGUMENT_COUNT, _ARGUMENT_MISSING, _ARGUMENT, _UNEXPECTED_ARGUMENT, _LITERAL, _CONSTANT,
 _SEQUENCE, _CAPTURE, _NAMED_NODE) = (
    MissCode.OP_MISMATCH, MissCode.TARGET_MISMATCH, MissCode.MODULE_ATTRIBUTE_MISMATCH, MissCode.ARGUMENT_COUNT,
    MissCode.ARGUMENT_MISSING, MissCode.ARGUMENT_MISMATCH, MissCode.UNEXPECTED_ARGUMENT, MissCode.LITERAL_MISMATCH,
    MissCode.CONSTANT_MISMATCH, MissCode.SEQUENCE_MISMATCH, MissCode.CAPTURE_CONFLICT, MissCode.NAMED_NODE_MISMATCH)


class Bindings:
    """What a (partial) match bound. Copied cheaply to backtrack over alternations."""

    __slots__ = ("captures", "names", "nodes", "attrs", "rest", "pending_refs")

    def __init__(self) -> None:
        self.captures: dict = {}  # name -> Node or literal
        self.names: dict = {}  # `as` name -> Node
        self.nodes: dict = {}  # matched operation nodes (ordered set), excluding get_attr
        self.attrs: dict = {}  # matched get_attr nodes (ordered set)
        self.rest: Optional[tuple] = None  # (args, kwargs) taken by `...`
        self.pending_refs: list = []  # (name, value) checked once every name is bound

    def __repr__(self) -> str:
        return (f"Bindings(captures={self.captures!r}, names={self.names!r}, nodes={list(self.nodes)!r}, "
                f"attrs={list(self.attrs)!r}, rest={self.rest!r})")

    def snapshot(self) -> tuple:
        return (dict(self.captures), dict(self.names), dict(self.nodes), dict(self.attrs), self.rest,
                list(self.pending_refs))

    def restore(self, state: tuple) -> None:
        (self.captures, self.names, self.nodes, self.attrs, self.rest, self.pending_refs) = (
            state[0], state[1], state[2], state[3], state[4], state[5])


@dataclass(frozen=True)
class Match:
    """A pattern matched: the compiled rule, its root nodes (one per pattern root) and what the match bound."""

    program: Program
    roots: tuple  # the root nodes, one per pattern root
    bindings: Bindings

    @property
    def rule(self):
        return self.program.rule

    @property
    def nodes(self) -> tuple:
        """Every matched operation node (roots first), then matched get_attr nodes."""
        return tuple(self.bindings.nodes) + tuple(self.bindings.attrs)


@dataclass(frozen=True)
class Miss:
    """Why a rule whose root target matched did not match: the deepest failure."""

    program: Program
    node: fx.Node
    depth: int
    reason: str
    span: A.Span
    code: MissCode  # what kind of failure ``reason`` describes (recorded with or without explain)


class GraphView:
    """What matching needs to know about the graph being rewritten: its modules, and whether each module
    object overrides its class's code (:func:`overridden_on_instance`, asked once per module for the run:
    a rewrite never changes an existing module's attributes)."""

    def __init__(self, module_of: Callable[[str], Any], known: Optional[Callable[[Any], bool]] = None,
                 hubs: Optional[UsersByKey] = None):
        self.module_of = module_of
        # the users of nodes read by many, by (op, target), kept through the edits of the graph this view
        # matches (a workpiece's: it tells them of each new user); None for a view made without one (the
        # further-root search then walks every user)
        self.hubs = hubs
        # ``known(module)`` True says the module overrides nothing (the planner's per-module facts, found
        # once for the run whoever asks first: :meth:`fxrules.engine.planner.Effects.module_is_known`), so
        # the instance is not read a second time; False says nothing, and the instance is asked
        self._known = known
        self._overridden: dict = {}  # id(module) -> (module, overridden_on_instance(module))

    def overridden(self, module: Any) -> bool:
        entry = self._overridden.get(id(module))
        if entry is None or entry[0] is not module:
            known = self._known
            if known is not None and known(module):
                return False
            entry = self._overridden[id(module)] = (module, overridden_on_instance(module))
        return entry[1]


class _Matcher:
    def __init__(self, program: Program, view: GraphView, explain: bool = True):
        self.program = program
        self.view = view
        self.explain = explain
        self.env = Bindings()
        self.fail_depth = -1
        self.fail_reason = ""
        self.fail_code = MissCode.PATTERN_MISMATCH
        self.fail_span = program.rule.span
        self.depth = 0

    def fail(self, code: MissCode, reason: Callable[[], str], span: Optional[A.Span] = None) -> bool:
        """Record a failure (the deepest one is reported); ``reason`` is only formatted when explaining."""
        if self.depth > self.fail_depth:
            self.fail_depth = self.depth
            self.fail_code = code
            if self.explain:
                self.fail_reason = reason()
            self.fail_span = span if span is not None else self.fail_span
        return False

    # -- values ----------------------------------------------------------------
    def match(self, pattern: Any, value: Any) -> bool:
        kind = type(pattern)
        if kind is PCapture:
            return self.capture(pattern.name, value, pattern.span)
        if kind is PCall:
            return self.call(pattern, value)
        if kind is PWildcard:
            return True
        if kind is PLiteral:
            return _same_literal(pattern.value, value) or self.fail(_LITERAL, lambda:
                f"expected the literal {pattern.value!r}, found {_show(value, self.view.module_of)}", pattern.span)
        if kind is PConst:
            return _same_constant(pattern.value, value) or self.fail(_CONSTANT, lambda:
                f"expected {pattern.label}, found {_show(value, self.view.module_of)}", pattern.span)
        if kind is PSeq and pattern.items and type(pattern.items[-1]) is PVariadic:
            return self.variadic(pattern.items, value, pattern.span)
        if kind is PSeq:
            if not isinstance(value, (list, tuple)) or len(value) != len(pattern.items):
                return self.fail(_SEQUENCE, lambda:
                    f"expected a sequence of {len(pattern.items)}, found {_show(value, self.view.module_of)}", pattern.span)
            return all(self.match(p, v) for p, v in zip(pattern.items, value))
        if kind is PBind:
            if not self.match(pattern.inner, value):
                return False
            self.env.names[pattern.name] = value
            return True
        if kind is PRef:
            bound = self.env.names.get(pattern.name, _MISSING)
            if bound is _MISSING:
                self.env.pending_refs.append((pattern.name, value))
                return True
            return bound is value or self.fail(_NAMED_NODE, lambda:
                f"expected the node named `{pattern.name}` ({_show(bound, self.view.module_of)}), found {_show(value, self.view.module_of)}", pattern.span)
        if kind is PAlt:
            for option in pattern.options:
                state = self.env.snapshot()
                if self.match(option, value):
                    return True
                self.env.restore(state)
            return False
        if kind is PGetAttr:
            return self.get_attr(pattern, value)
        raise AssertionError(kind)  # pragma: no cover

    def variadic(self, items: tuple, values: Any, span: A.Span) -> bool:
        """Items ending in ``*$xs``: the fixed ones match one by one, ``$xs`` binds the rest (a list, as
        conditions write sequences: `$xs == [0, 2, 1]`)."""
        fixed = len(items) - 1
        if not isinstance(values, (list, tuple)) or len(values) < fixed:
            return self.fail(_SEQUENCE, lambda: f"expected at least {fixed} item{'s' * (fixed != 1)}, found "
                                                f"{_show(values)}", span)
        if not all(self.match(p, v) for p, v in zip(items[:fixed], values)):
            return False
        return self.capture(items[-1].name, list(values[fixed:]), items[-1].span)

    def capture(self, name: str, value: Any, span: Optional[A.Span] = None) -> bool:
        bound = self.env.captures.get(name, _MISSING)
        if bound is _MISSING:
            self.env.captures[name] = value
            return True
        if _same_value(bound, value):
            return True
        return self.fail(_CAPTURE, lambda:
            f"`${name}` is already bound to {_show(bound, self.view.module_of)}, but here it is {_show(value, self.view.module_of)}", span)

    def get_attr(self, pattern: PGetAttr, value: Any) -> bool:
        if not isinstance(value, fx.Node) or value.op != "get_attr":
            return self.fail(_OP, lambda: f"expected a get_attr node, found {_show(value, self.view.module_of)}", pattern.span)
        if pattern.qualname is not None and value.target != pattern.qualname:
            return self.fail(_TARGET, lambda:
                f"expected get_attr {pattern.qualname}, found get_attr {value.target}", pattern.span)
        if pattern.capture is not None and not self.capture(pattern.capture, value, pattern.span):
            return False
        self.env.attrs[value] = None
        return True

    # -- calls ----------------------------------------------------------------
    def call(self, pattern: PCall, value: Any) -> bool:
        if not isinstance(value, fx.Node):
            return self.fail(_OP, lambda: f"expected {pattern.op} {pattern.label}, found {_show(value, self.view.module_of)}", pattern.span)
        if value.op != pattern.op:
            return self.fail(_OP, lambda:
                f"expected {pattern.op} {pattern.label}, found {value.op} {_target(value)}", pattern.span)
        module = None
        if pattern.op == "call_module":
            module = self.view.module_of(value.target)
            if module is None or not _module_matches_any(module, pattern.targets, self.view.overridden):
                return self.fail(_TARGET, lambda:
                    f"expected a {pattern.label} module, found {type(module).__name__} `{value.target}`", pattern.span)
        elif pattern.op == "call_method":
            if value.target not in pattern.targets:
                return self.fail(_TARGET, lambda:
                    f"expected method {pattern.label}, found {value.target}", pattern.span)
        elif not _same_target(value.target, pattern.targets):
            return self.fail(_TARGET, lambda: f"expected {pattern.label}, found {_target(value)}", pattern.span)
        self.depth += 1
        try:
            if pattern.attrs and not self.attributes(pattern, module):
                return False
            if pattern.args is not None and not self.arguments(pattern, value):
                return False
        finally:
            self.depth -= 1
        self.env.nodes[value] = None
        return True

    def attributes(self, pattern: PCall, module: Any) -> bool:
        for name, expected in pattern.attrs:
            actual = getattr(module, name, _MISSING)
            if actual is _MISSING:
                return self.fail(_ATTRIBUTE, lambda: f"the module has no attribute `{name}`", pattern.span)
            actual = _attribute_value(actual, expected)
            if not self.match(expected, actual):
                return self.fail(_ATTRIBUTE, lambda: f"attribute `{name}` is {actual!r}", pattern.span)
        return True

    def arguments(self, pattern: PCall, node: fx.Node) -> bool:
        if not pattern.overloads:
            return self.positional_arguments(pattern, node)
        args, kwargs = node.args, node.kwargs
        if pattern.in_order and not kwargs and len(args) == len(pattern.args) and not self.explain:
            # binding would pair them in order (program._in_order); explaining binds, for its messages
            match = self.match
            for want, have in zip(pattern.args, args):
                if not match(want, have):
                    return False
            return True
        for sig, expected in pattern.overloads:
            actual = signatures.bind(sig, args, kwargs)
            if actual is None:
                continue
            # The first signature the call binds to decides. A failure needs no undoing here:
            # it fails the whole match, or an enclosing alternative restores its own snapshot.
            if pattern.commutes is not None:
                return self.commuting_arguments(pattern, node, sig, expected, actual)
            return self.bound_arguments(pattern, node, sig, expected, actual)
        return self.positional_arguments(pattern, node)  # the call does not fit the signature: compare as written

    def bound_arguments(self, pattern: PCall, node: fx.Node, sig, expected: dict, actual: dict) -> bool:
        for param in sig.parameters:
            want = expected.get(param, _MISSING)
            have = actual.get(param, _MISSING)
            if want is not _MISSING:
                if have is _MISSING:
                    have = signatures.default(sig, param)
                    if have is signatures.EMPTY:
                        return self.fail(_ARGUMENT_MISSING, lambda: f"argument `{param}` is missing", pattern.span)
                if not self.match(want, have):
                    return self.fail(_ARGUMENT, lambda:
                        f"argument `{param}` does not match: {_show(have, self.view.module_of)}", pattern.span)
            elif have is not _MISSING and not pattern.rest:
                default = signatures.default(sig, param)
                if default is signatures.EMPTY or not _same_value(default, have):
                    return self.fail(_UNEXPECTED_ARGUMENT, lambda:
                        f"argument `{param}` is {_show(have, self.view.module_of)}; the pattern does not mention it, so it "
                        f"must be absent or at {_shown_default(default)} (end the pattern's arguments with `...` to "
                        f"accept any)", pattern.span)
        if pattern.rest:
            self.env.rest = _rest(pattern, node, expected)
        return True

    def commuting_arguments(self, pattern: PCall, node: fx.Node, sig, expected: dict, actual: dict) -> bool:
        """A commutative call (fxrules.lang.commutative): the written order, else the two operands
        exchanged (at most two tries; the first that matches wins, as for an alternation)."""
        state = self.env.snapshot()
        if self.bound_arguments(pattern, node, sig, expected, actual):
            return True
        swapped = _swapped(pattern.commutes, sig, actual)
        if swapped is None:
            return False
        self.env.restore(state)
        return self.bound_arguments(pattern, node, sig, expected, swapped)

    def positional_arguments(self, pattern: PCall, node: fx.Node) -> bool:
        args, kwargs = node.args, node.kwargs
        if pattern.args and type(pattern.args[-1]) is PVariadic:
            if not self.variadic(pattern.args, args, pattern.span):
                return False
            return self.keyword_arguments(pattern, args, kwargs, len(args))
        count = len(pattern.args)
        if len(args) < count or (len(args) > count and not pattern.rest):
            return self.fail(_ARGUMENT_COUNT, lambda:
                f"expected {count} positional argument{'s' * (count != 1)}, found {len(args)}", pattern.span)
        for want, have in zip(pattern.args, args):
            if not self.match(want, have):
                return False
        return self.keyword_arguments(pattern, args, kwargs, count)

    def keyword_arguments(self, pattern: PCall, args: tuple, kwargs: dict, count: int) -> bool:
        """The keywords of a call compared as written (``count``: the positional arguments taken)."""
        named = {name for name, _ in pattern.kwargs}
        for name, want in pattern.kwargs:
            if name not in kwargs:
                return self.fail(_ARGUMENT_MISSING, lambda: f"keyword argument `{name}` is missing", pattern.span)
            if not self.match(want, kwargs[name]):
                return False
        extra = [k for k in kwargs if k not in named]
        if extra and not pattern.rest:
            return self.fail(_UNEXPECTED_ARGUMENT, lambda:
                f"keyword argument `{extra[0]}` is not in the pattern", pattern.span)
        if pattern.rest:
            self.env.rest = (tuple(args[count:]), {k: v for k, v in kwargs.items() if k not in named})
        return True


def _swapped(commutes, sig, actual: dict) -> Optional[dict]:
    """``actual`` with the two operands exchanged, or None where the call does not commute: an
    operand missing, a parameter of ``at_default`` given otherwise, or (``numeric``) neither operand
    known to be a tensor or a number."""
    first, second = actual.get(commutes.first, _MISSING), actual.get(commutes.second, _MISSING)
    if first is _MISSING or second is _MISSING:
        return None
    for name in commutes.at_default:
        if name in actual and not _same_value(actual[name], signatures.default(sig, name)):
            return None
    if commutes.numeric and not (_numeric(first) or _numeric(second)):
        return None
    swapped = dict(actual)
    swapped[commutes.first], swapped[commutes.second] = second, first
    return swapped


def _numeric(value: Any) -> bool:
    """A tensor or a number: a literal number, or a node whose metadata says so."""
    import torch

    if isinstance(value, fx.Node):
        value = value.meta.get("val", value.meta.get("tensor_meta"))
        if value is not None and not isinstance(value, (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool,
                                                        int, float, bool, complex)):
            return hasattr(value, "shape") and hasattr(value, "dtype")  # a TensorMetadata
    return isinstance(value, (torch.Tensor, int, float, bool, complex, torch.SymInt, torch.SymFloat))


def _rest(pattern: PCall, node: fx.Node, expected: dict) -> tuple:
    """What `...` took: positional arguments past the pattern's, and keywords the pattern does not name."""
    count = len(pattern.args or ())
    return tuple(node.args[count:]), {k: v for k, v in node.kwargs.items() if k not in expected}


def _module_matches_any(module: Any, targets: tuple, overridden: Callable[[Any], bool]) -> bool:
    """Whether ``module`` matches one of a pattern's module classes (:func:`_module_matches`)."""
    for cls in targets:
        if _module_matches(module, cls, overridden):
            return True
    return False


def _module_matches(module: Any, cls: type, overridden: Optional[Callable[[Any], bool]] = None) -> bool:
    """Whether ``module`` computes as ``cls``: an instance of it, not overriding its class's code on the
    object itself (``overridden``: :func:`overridden_on_instance`, or a run's memo of it), of ``cls``
    itself or of a subclass that computes as it and shadows none of its state."""
    if not isinstance(module, cls):
        return False
    if (overridden or overridden_on_instance)(module):
        return False
    sub = type(module)
    if sub is cls:
        return True
    if not computes_as(sub, cls):
        return False
    added = _added_names(sub, cls)
    return not added or not _shadows_state(module, added)


INERT_CLASS_NAMES = frozenset({
    "__module__", "__qualname__", "__doc__", "__dict__", "__weakref__", "__annotations__", "__annotate__",
    "__annotate_func__", "__annotations_cache__", "__firstlineno__", "__static_attributes__", "__orig_bases__",
    "__parameters__", "__slotnames__", "__abstractmethods__", "_abc_impl", "__init__", "extra_repr", "__repr__",
    "_get_name", "reset_parameters", "reset_running_stats",
})
"""Names a subclass may define without changing what its modules compute: class bookkeeping,
construction (what ``__init__`` stores is the instance's state, which patterns, conditions and
builders read from the instance) and description (``extra_repr``). Reviewed: none of them is
called by ``forward``, ``__call__`` or the builders."""


@functools.lru_cache(maxsize=4096)
def computes_as(sub: type, base: type) -> bool:
    """Whether modules of class ``sub`` (a subclass of ``base``) compute what ``base``'s compute.

    True when no class between ``sub`` and ``base`` in ``sub``'s MRO defines, outside
    :data:`INERT_CLASS_NAMES`, a name that ``base`` or any class above it defines (``forward``,
    ``_check_input_dim``, ``_conv_forward``, ``__call__``, ``_call_impl``, ``__getattr__``,
    ``__setattr__``, ``__getattribute__``, class attributes such as ``_version``, ...), nor a
    data descriptor (a property) of any name: whatever ``forward`` and the builders reach
    through ``self`` is then ``base``'s own code or the instance's state. Another new name
    can only matter by shadowing a parameter, buffer or submodule (found by
    ``nn.Module.__getattr__`` only when ordinary lookup fails), checked per module by
    :func:`_shadows_state`.
    """
    if sub is base:
        return True
    mro = sub.__mro__
    if base not in mro:
        return False
    inherited: set = set()
    for cls in base.__mro__:
        inherited.update(vars(cls))
    for cls in mro[:mro.index(base)]:
        for name, value in vars(cls).items():
            if name in INERT_CLASS_NAMES:
                continue
            if name in inherited or _is_data_descriptor(value):
                return False
    return True


def overridden_on_instance(module: Any) -> bool:
    """Whether the module object itself overrides what its class computes with: an instance attribute
    named like something a class in its MRO defines (``m.forward = ...``, ``m._conv_forward = ...``,
    ``m._check_input_dim = ...``; ``m.compile()``'s ``_compiled_call_impl``; ``_call_impl``, ...). Calls
    look such names up on the instance first (``nn.Module.__call__`` runs ``self._call_impl``, which
    runs ``self.forward``), so the class's code is not what runs. Reviewed: no torch.nn module keeps
    such a name in its own ``__dict__`` after construction, ``.eval()``, ``.to()`` or a deep copy;
    :data:`INERT_CLASS_NAMES` (``extra_repr``, ...) may be set freely."""
    return not class_defined_names(type(module)).isdisjoint(vars(module))


@functools.lru_cache(maxsize=4096)
def class_defined_names(cls: type) -> frozenset:
    """Every name a class in ``cls``'s MRO defines, inert ones (:data:`INERT_CLASS_NAMES`) left out."""
    found: set = set()
    for klass in cls.__mro__:
        found.update(vars(klass))
    return frozenset(found - INERT_CLASS_NAMES)


def _is_data_descriptor(value: Any) -> bool:
    """A property or other descriptor with ``__set__``/``__delete__``: it takes precedence over the
    instance's own attributes, so it could stand in for any state ``forward`` reads."""
    kind = type(value)
    return hasattr(kind, "__set__") or hasattr(kind, "__delete__")


@functools.lru_cache(maxsize=4096)
def _added_names(sub: type, base: type) -> frozenset:
    """Names the classes between ``sub`` and ``base`` define that ``base`` does not (new methods, class
    attributes, properties), inert ones left out."""
    mro = sub.__mro__
    found: set = set()
    for cls in mro[:mro.index(base)]:
        found.update(name for name in vars(cls) if name not in INERT_CLASS_NAMES)
    return frozenset(found)


def _shadows_state(module: Any, names: frozenset) -> bool:
    """Whether one of a subclass's new class names is also the name of the module's own state (an
    instance attribute, parameter, buffer or submodule): a property or descriptor there would
    change what ``forward`` reads."""
    members = fxaccess.members(module)
    return any(name in members for name in names)


def _attribute_value(actual: Any, expected: Any) -> Any:
    """Constructor arguments as the module stores them: `bias=True` is a bias tensor; `kernel_size=3` is (3, 3)."""
    if isinstance(expected, PLiteral):
        if isinstance(expected.value, bool) and not isinstance(actual, bool):
            import torch

            if actual is None or isinstance(actual, torch.Tensor):
                return actual is not None
        if isinstance(expected.value, (int, float)) and not isinstance(expected.value, bool) \
                and isinstance(actual, tuple) and actual and all(_same_literal(expected.value, a) for a in actual):
            return expected.value
    return actual


def _same_target(target: Any, targets: tuple) -> bool:
    """Whether a call_function node's ``target`` is one of ``targets`` (identity, else equality)."""
    for t in targets:
        if target is t:
            return True
    return any(_safe_eq(target, t) for t in targets)


def _safe_eq(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:
        return False


def _same_literal(expected: Any, actual: Any) -> bool:
    if isinstance(actual, fx.Node):
        return False
    if type(expected) is not type(actual):
        return False
    return _safe_eq(expected, actual)


def _same_constant(expected: Any, actual: Any) -> bool:
    if isinstance(actual, fx.Node):
        return False
    return actual is expected or _safe_eq(expected, actual)


def _same_value(a: Any, b: Any) -> bool:
    """Two bound values are the same: the same node, or equal literals of the same type."""
    if isinstance(a, fx.Node) or isinstance(b, fx.Node):
        return a is b
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and _safe_eq(a, b)


def _target(node: fx.Node) -> str:
    target = node.target
    if isinstance(target, str):
        return target
    return getattr(target, "__name__", None) or str(target)


def _module_type(node: fx.Node, module_of: Callable[[str], Any]) -> str:
    """The class name of the module a call_module node calls (what a pattern names, rather than the
    attribute it is stored under), or ``?``."""
    try:
        return type(module_of(node.target)).__name__
    except Exception:  # a target the model does not have: the attribute name still says which
        return "?"


def _shown_default(default: Any) -> str:
    return "no default" if default is signatures.EMPTY else f"the default {default!r}"


def _show(value: Any, module_of: Optional[Callable[[str], Any]] = None) -> str:
    if isinstance(value, fx.Node):
        if value.op == "call_module" and module_of is not None:
            return f"%{value.name} (call_module {_target(value)}: {_module_type(value, module_of)})"
        return f"%{value.name} ({value.op} {_target(value)})" if value.op != "placeholder" else f"%{value.name}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def input_keys(node: fx.Node) -> set:
    """The (op, target) of each call_function/call_method input of ``node``: what ``may_match`` tests
    patterns against (computed once per node, shared by every rule tried there)."""
    keys = set()
    for value in node.all_input_nodes:
        if value.op == "call_function" or value.op == "call_method":
            try:
                keys.add((value.op, value.target))
            except TypeError:  # an unhashable target: such inputs are compared one by one
                keys.add(UNHASHABLE_INPUT)
    return keys


UNHASHABLE_INPUT = ("call_function", object())
"""In ``input_keys``: some input's target cannot be hashed, so set tests cannot decide."""


def may_match(program: Program, node: fx.Node, module_of: Callable[[str], Any], keys: Optional[set]) -> bool:
    """False when ``program`` cannot match at ``node``: an argument call pattern of its first root
    matches none of the node's inputs by op and target (``Program.requires``). ``keys`` is
    ``input_keys(node)`` (None is allowed when no pattern has a set test: ``Program.requires_keys`` all
    None). A cheap test that never reads more than the inputs' op, target and module class
    (:func:`_class_may_match`); True says nothing."""
    for pattern, wanted in zip(program.requires, program.requires_keys):
        if wanted is not None and keys is None:
            keys = input_keys(node)
        if wanted is not None and UNHASHABLE_INPUT not in keys:
            if wanted.isdisjoint(keys):
                return False
            continue
        op, targets = pattern.op, pattern.targets
        for value in node.all_input_nodes:
            if value.op != op:
                continue
            if op == "call_module":
                module = module_of(value.target)
                if module is not None and _class_may_match(module, targets):
                    break
            elif op == "call_method":
                if value.target in targets:
                    break
            elif _same_target(value.target, targets):
                break
        else:
            return False
    return True


def _class_may_match(module: Any, targets: tuple) -> bool:
    """The pre-check's test of a module input: an instance of one of the pattern's classes. Weaker than
    :func:`_module_matches` (which the matcher asks: it also refuses a module overriding its class's code,
    or of a subclass that does not compute as the class), so it never rejects a module that matches;
    decided per class, the common module being of an exactly named class or of none."""
    cls = type(module)
    if module.__class__ is not cls:  # a class the object claims (isinstance reads it too): asked in full
        return isinstance(module, targets)
    return _subclass_of_any(cls, targets)


@functools.lru_cache(maxsize=4096)
def _subclass_of_any(cls: type, targets: tuple) -> bool:
    return issubclass(cls, targets)


# ---------------------------------------------------------------------------
# Direct matchers: the interpreter above, specialised to one rule's pattern
# ---------------------------------------------------------------------------

def direct_matcher(program: Program) -> Optional[Callable[[fx.Node, GraphView], Any]]:
    """``program``'s pattern as nested closures that do what :class:`_Matcher` does with
    ``explain=False``, without its per-pattern dispatch or failure bookkeeping; None for a rule with
    several roots (its other roots are searched over the graph: :func:`_match_other_root`).

    ``direct(node, view)`` answers the :class:`Match` :func:`match_program` would give (the same
    bindings, in the same order), or None where it gives a :class:`Miss` (no reason: the fixpoint only
    needs to know). Every form a single root can have is covered: module, method and function calls
    (arguments taken in order where the call has exactly the pattern's positional arguments, else
    bound to the target's signatures as :meth:`_Matcher.arguments` binds them, with keywords, ``...``,
    ``*$xs`` and commuting operands), module attributes (``Dropout{p=0.5}``), captures, ``_``, ``as``
    names and references to them, literals and constants, get_attr patterns, alternatives (tried in
    order) and sequences.

    A call's arguments are made into closures when a node first matches the call's op and target
    (:func:`_direct_call`): the library's largest patterns have about a hundred thousand pattern
    objects in all (named patterns expanded at each use), most of them below heads that never match."""
    if len(program.roots) != 1:
        return None
    root = _direct(program.roots[0], {})

    def direct(node: fx.Node, view: GraphView) -> Any:
        env = Bindings()
        if not root(node, view, env):
            return None
        for name, value in env.pending_refs:  # as match_program checks them, once every name is bound
            if env.names.get(name, _MISSING) is not value:
                return None
        return Match(program, (node,), env)

    return direct


def _direct(pattern: Any, memo: dict) -> Callable:
    """One pattern's closure ``(value, view, env) -> bool``: whether it matches, its bindings added
    to ``env``. ``memo`` (id of a pattern -> (pattern, closure)) makes one closure per pattern
    object while one call's arguments are made: its signatures bind the same pattern objects as its
    arguments (see :func:`_direct_arguments`). No closure holds the memo."""
    made = memo.get(id(pattern))
    if made is not None and made[0] is pattern:
        return made[1]
    closure = _make_direct(pattern, memo)
    memo[id(pattern)] = (pattern, closure)
    return closure


def _make_direct(pattern: Any, memo: dict) -> Callable:
    kind = type(pattern)
    if kind is PCapture:
        return _direct_capture(pattern.name)
    if kind is PWildcard:
        return lambda value, view, env: True
    if kind is PLiteral:
        expected = pattern.value
        return lambda value, view, env: _same_literal(expected, value)
    if kind is PConst:
        constant = pattern.value
        return lambda value, view, env: _same_constant(constant, value)
    if kind is PBind:
        return _direct_bind(_direct(pattern.inner, memo), pattern.name)
    if kind is PRef:
        return _direct_ref(pattern.name)
    if kind is PCall:
        return _direct_call(pattern, memo)
    if kind is PAlt:
        return _direct_alternatives(tuple(_direct(option, memo) for option in pattern.options))
    if kind is PSeq:
        return _direct_sequence(pattern, memo)
    if kind is PGetAttr:
        return _direct_get_attr(pattern)
    raise AssertionError(kind)  # as _Matcher.match: the program's compiler makes no other kind here


def _direct_capture(name: str) -> Callable:
    def capture(value: Any, view: GraphView, env: Bindings) -> bool:
        captures = env.captures
        bound = captures.get(name, _MISSING)
        if bound is _MISSING:
            captures[name] = value
            return True
        return _same_value(bound, value)

    return capture


def _direct_bind(inner: Callable, name: str) -> Callable:
    def bind(value: Any, view: GraphView, env: Bindings) -> bool:
        if not inner(value, view, env):
            return False
        env.names[name] = value
        return True

    return bind


def _direct_ref(name: str) -> Callable:
    """A named node used again: the same node, checked at once where the name is bound, else once the
    whole match is (``pending_refs``, read by :func:`direct_matcher`'s ``direct``)."""
    def ref(value: Any, view: GraphView, env: Bindings) -> bool:
        bound = env.names.get(name, _MISSING)
        if bound is _MISSING:
            env.pending_refs.append((name, value))
            return True
        return bound is value

    return ref


def _direct_get_attr(pattern: PGetAttr) -> Callable:
    qualname = pattern.qualname
    capture = _direct_capture(pattern.capture) if pattern.capture is not None else None

    def get_attr(value: Any, view: GraphView, env: Bindings) -> bool:
        if not isinstance(value, fx.Node) or value.op != "get_attr":
            return False
        if qualname is not None and value.target != qualname:
            return False
        if capture is not None and not capture(value, view, env):
            return False
        env.attrs[value] = None
        return True

    return get_attr


def _direct_alternatives(options: tuple) -> Callable:
    """The options tried in order, as the interpreter tries them: the bindings as they were before
    each option (a snapshot, restored when it fails), and the first that matches wins."""
    def alternatives(value: Any, view: GraphView, env: Bindings) -> bool:
        for option in options:
            state = env.snapshot()
            if option(value, view, env):
                return True
            env.restore(state)
        return False

    return alternatives


def _direct_items(items: tuple, memo: dict) -> Callable:
    """Items matched one by one against as many values (a list, a tuple or a call's positional
    arguments, whose count the caller checked)."""
    parts = tuple(_direct(item, memo) for item in items)

    def each(values: Any, view: GraphView, env: Bindings) -> bool:
        for part, item in zip(parts, values):
            if not part(item, view, env):
                return False
        return True

    return each


def _direct_sequence(pattern: PSeq, memo: dict) -> Callable:
    """A list or tuple of exactly the pattern's items, matched in order; one ending in ``*$xs`` takes
    at least the fixed items, and ``$xs`` binds the rest as a list (:meth:`_Matcher.variadic`)."""
    items = pattern.items
    variadic = bool(items) and type(items[-1]) is PVariadic
    fixed = len(items) - 1 if variadic else len(items)
    each = _direct_items(items[:fixed], memo)
    tail = _direct_capture(items[-1].name) if variadic else None

    def sequence(value: Any, view: GraphView, env: Bindings) -> bool:
        if not isinstance(value, (list, tuple)):
            return False
        if tail is None:
            return len(value) == fixed and each(value, view, env)
        return len(value) >= fixed and each(value, view, env) and tail(list(value[fixed:]), view, env)

    return sequence


def _direct_call(pattern: PCall, memo: dict) -> Callable:
    """A call: its op and target, its module's attributes (read as :meth:`_Matcher.attributes` reads
    them), then its arguments (:func:`_direct_arguments`, made when a node first gets that far)."""
    op, targets, has_arguments = pattern.op, pattern.targets, pattern.args is not None
    attributes = tuple((name, expected, _direct(expected, memo)) for name, expected in pattern.attrs)
    if attributes and op != "call_module":  # (the grammar has none: the interpreter reads them off no module)
        return lambda value, view, env: False
    made: list = []  # the arguments' closure, once made

    def call(value: Any, view: GraphView, env: Bindings) -> bool:
        if type(value) is not fx.Node and not isinstance(value, fx.Node):
            return False
        if value.op != op:
            return False
        if op == "call_module":
            module = view.module_of(value.target)
            if module is None or not _module_matches_any(module, targets, view.overridden):
                return False
            for name, expected, part in attributes:
                actual = getattr(module, name, _MISSING)
                if actual is _MISSING or not part(_attribute_value(actual, expected), view, env):
                    return False
        elif op == "call_method":
            if value.target not in targets:
                return False
        elif not _same_target(value.target, targets):
            return False
        if has_arguments:
            if not made:  # (a memo of its own: one shared with the caller would make a reference cycle)
                made.append(_direct_arguments(pattern, {}))
            in_order, arguments = made[0]
            args = value.args
            if in_order is not None and len(args) == len(in_order) and not value.kwargs:
                for part, have in zip(in_order, args):  # (inline: most calls are compared this way)
                    if not part(have, view, env):
                        return False
            elif not arguments(value, view, env):
                return False
        env.nodes[value] = None
        return True

    return call


def _direct_arguments(pattern: PCall, memo: dict) -> tuple:
    """A call's arguments as :meth:`_Matcher.arguments` compares them with ``explain=False``:
    ``(in_order, arguments)``. ``in_order``: the closures of the pattern's positional arguments, to
    compare one by one with a call that has exactly as many and no keywords, where that is the
    whole test (no signature, no keywords, ``...`` or ``*$xs`` in the pattern; or the pattern is
    ``in_order``), else None. ``arguments(node, view, env)``: the test for every other call: bound to
    the first of the pattern's signatures the call binds to (that one decides; a commuting call tries
    its operands exchanged once); else, or with no signature, as written (:func:`_direct_as_written`)."""
    as_written = _direct_as_written(pattern, memo)
    simple = not pattern.kwargs and not pattern.rest and not (pattern.args and type(pattern.args[-1]) is PVariadic)
    in_order = tuple(_direct(p, memo) for p in pattern.args) \
        if (pattern.in_order or (simple and not pattern.overloads)) else None
    if not pattern.overloads:
        return in_order, as_written
    # per signature: each parameter in its order, with its pattern's closure (None: not in the pattern)
    # and its default
    overloads = tuple(
        (sig, tuple((param, _direct(expected[param], memo) if param in expected else None,
                     signatures.default(sig, param)) for param in sig.parameters), expected)
        for sig, expected in pattern.overloads)
    rest, commutes, bind, empty = pattern.rest, pattern.commutes, signatures.bind, signatures.EMPTY

    def bound(node: fx.Node, params: tuple, expected: dict, actual: dict, view: GraphView, env: Bindings) -> bool:
        """:meth:`_Matcher.bound_arguments`."""
        for param, want, default in params:
            have = actual.get(param, _MISSING)
            if want is not None:
                if have is _MISSING:
                    have = default
                    if have is empty:
                        return False
                if not want(have, view, env):
                    return False
            elif have is not _MISSING and not rest:
                if default is empty or not _same_value(default, have):
                    return False
        if rest:
            env.rest = _rest(pattern, node, expected)
        return True

    def arguments(node: fx.Node, view: GraphView, env: Bindings) -> bool:
        args, kwargs = node.args, node.kwargs
        for sig, params, expected in overloads:
            actual = bind(sig, args, kwargs)
            if actual is None:
                continue
            if commutes is None:
                return bound(node, params, expected, actual, view, env)
            state = env.snapshot()  # :meth:`_Matcher.commuting_arguments`
            if bound(node, params, expected, actual, view, env):
                return True
            swapped = _swapped(commutes, sig, actual)
            if swapped is None:
                return False
            env.restore(state)
            return bound(node, params, expected, swapped, view, env)
        return as_written(node, view, env)  # the call does not fit a signature: compare as written

    return in_order, arguments


def _direct_as_written(pattern: PCall, memo: dict) -> Callable:
    """A call's arguments compared as written (:meth:`_Matcher.positional_arguments` and
    :meth:`_Matcher.keyword_arguments`): the positional ones one by one (``*$xs`` last binds the rest
    as a list), each keyword by name, and with ``...`` whatever else the call has, kept as ``rest``."""
    items = pattern.args
    variadic = bool(items) and type(items[-1]) is PVariadic
    fixed = len(items) - 1 if variadic else len(items)
    each = _direct_items(items[:fixed], memo)
    tail = _direct_capture(items[-1].name) if variadic else None
    keywords = tuple((name, _direct(p, memo)) for name, p in pattern.kwargs)
    named = frozenset(name for name, _ in keywords)
    rest = pattern.rest

    def as_written(node: fx.Node, view: GraphView, env: Bindings) -> bool:
        args, kwargs = node.args, node.kwargs
        if len(args) < fixed or (tail is None and len(args) > fixed and not rest):
            return False
        if not each(args, view, env):
            return False
        if tail is not None and not tail(list(args[fixed:]), view, env):
            return False
        for name, part in keywords:
            if name not in kwargs or not part(kwargs[name], view, env):
                return False
        if not rest:
            return all(key in named for key in kwargs)
        env.rest = (tuple(args[fixed:]), {k: v for k, v in kwargs.items() if k not in named})  # (no `*$xs` with `...`)
        return True

    return as_written


def _may_be(node: fx.Node, keys: frozenset, module_of: Callable[[str], Any]) -> bool:
    """Whether ``node``'s (op, target) is among ``keys``, for a module call whether its module is of a class
    among them or a subclass of one (True for an unhashable target or an unknown module: the matcher decides)."""
    if node.op == "call_module":
        module = module_of(node.target)
        if module is None:
            return True
        kind = type(module)
        return any(op == "call_module" and issubclass(kind, target) for op, target in keys)
    try:
        return (node.op, node.target) in keys
    except TypeError:
        return True


def _uses_a_bound_node(pattern: Any, env: Any) -> bool:
    """Whether every node ``pattern`` (a further root) can match reads a node bound so far: a capture or a
    reference bound to a node among its call's own arguments (in every option of an alternation). Such a
    root is found among the bound nodes' users or not at all; the search of every node is for the others."""
    while isinstance(pattern, PBind):
        pattern = pattern.inner
    if isinstance(pattern, PAlt):
        return all(_uses_a_bound_node(option, env) for option in pattern.options)
    if not isinstance(pattern, PCall) or pattern.args is None:
        return False
    for arg in tuple(pattern.args) + tuple(value for _, value in pattern.kwargs):
        if isinstance(arg, PCapture):
            if isinstance(env.captures.get(arg.name), fx.Node):
                return True
        elif isinstance(arg, PRef):
            if isinstance(env.names.get(arg.name), fx.Node):
                return True
    return False


def match_program(program: Program, node: fx.Node, view: GraphView, *, explain: bool = True) -> "Match | Miss":
    """Match ``program`` with its first root at ``node``.

    With ``explain=False`` a :class:`Miss` carries no reason text (formatting it is most of
    the cost of a failed attempt; only ``explain`` shows it).
    """
    matcher = _Matcher(program, view, explain)
    if not matcher.match(program.roots[0], node):
        return Miss(program, node, matcher.fail_depth, matcher.fail_reason or "the root does not match",
                    matcher.fail_span, matcher.fail_code)
    roots = [node]
    for pattern, keys in zip(program.roots[1:], program.further_keys):
        found = _match_other_root(matcher, pattern, keys, roots)
        if found is None:
            return Miss(program, node, max(matcher.fail_depth, 0) + 1,  # (deeper than the first root's misses)
                        "no node matches the rule's other root over the same captures", matcher.fail_span,
                        MissCode.OTHER_ROOT_MISSING)
        roots.append(found)
    env = matcher.env
    for name, value in env.pending_refs:
        if env.names.get(name, _MISSING) is not value:
            return Miss(program, node, matcher.fail_depth + 1,
                        f"the node named `{name}` is not the one used here", program.rule.span, _NAMED_NODE)
    return Match(program, tuple(roots), env)


def _match_other_root(matcher: _Matcher, pattern: Any, keys: Optional[frozenset], roots: list) -> Optional[fx.Node]:
    """The first node, in graph order, that matches a further root ``pattern`` with the bindings so far: among
    the users of the captured and named nodes, or, when they have none, among all nodes. ``keys``
    (:attr:`Program.further_keys`): the (op, target) pairs the pattern can match; a node with another is
    not tried (an input read by thousands of nodes made each match try them all: quadratic). The users of
    a node read by many (:data:`fxrules.engine.users.HUB`) come from the view's groups of them by pair, in
    graph order, where it keeps them: a search that takes the first costs what it reads."""
    env = matcher.env
    seen = set(roots)
    candidates: list = []
    grouped: list = []  # iterators in graph order over hubs' users whose pair is among keys
    hubs_read: set = set()
    any_user = False
    matched = env.nodes
    hubs = matcher.view.hubs if keys is not None else None
    module_of = matcher.view.module_of
    for value in list(env.captures.values()) + list(env.names.values()):
        if isinstance(value, fx.Node):
            if hubs is not None and len(value.users) >= HUB:
                if value not in hubs_read:  # (bound twice, a capture and a name: its groups are read once)
                    hubs_read.add(value)
                    any_user = any_user or any(user not in roots and user not in matched for user in value.users)
                    grouped.extend(hubs.groups(value, keys))
                continue
            for user in value.users:
                if user in seen or user in matched:
                    continue
                seen.add(user)
                any_user = True
                if keys is not None and not _may_be(user, keys, module_of):
                    continue
                candidates.append(user)
    if not any_user:
        if _uses_a_bound_node(pattern, env):  # a match must be a user of a bound node, and none has another
            return None
        graph = roots[0].graph
        candidates = [n for n in graph.nodes if n not in seen and n not in env.nodes
                      and (keys is None or _may_be(n, keys, module_of))]
        grouped = []
    candidates.sort()
    if grouped:  # the hubs' users merged with the others in graph order, each tried once
        tried = set(roots)
        tried.update(matched)
        grouped.append(iter(candidates))
        candidates = (node for node in heapq.merge(*grouped, key=fxaccess.sort_key)
                      if node not in tried and not tried.add(node))
    for candidate in candidates:
        state = env.snapshot()
        if matcher.match(pattern, candidate):
            return candidate
        env.restore(state)
    return None
