"""Conditions (``where`` clauses): they use only what the pattern binds, and call only what is allowed.

A condition reads captures (tensor metadata only: :data:`CAPTURE_ATTRIBUTES`), names bound with
``as`` (module attributes), literals and dotted constants; it calls the built-in predicates, a
few pure builtins by bare name, and functions by dotted path (:func:`check_called_path`, the one
place that decides which dotted functions a condition may call).
"""

from __future__ import annotations

from dataclasses import dataclass

import fxrules.lang.ast as A
from fxrules.lang.check.reporter import Reporter, did_you_mean
from fxrules.lang.check.scope import Bindings, report_unbound_capture
from fxrules.lang import allowlist
from fxrules.lang.check.targets import NEVER_CREATED, Targets
from fxrules.lang.check.condition_types import report_type_errors
from fxrules.lang.names import (BINDING_PREDICATES, CONDITION_FUNCTIONS, GENERATOR_FUNCTIONS, MAX_CONDITION_ITEMS,
                                MAX_GENERATOR_DEPTH, PREDICATE_NAMES, USER_FUNCTIONS, expand)
from fxrules.lang.torch_index import Kind

CONDITION_FUNCTION_NAMES = frozenset(CONDITION_FUNCTIONS)
"""The pure builtins a condition may call by bare name."""

CAPTURE_ATTRIBUTES = frozenset({"shape", "ndim", "dtype", "device", "numel", "requires_grad", "is_contiguous"})
DTYPE_ATTRIBUTES = frozenset({"itemsize", "is_floating_point", "is_complex", "is_signed"})
"""What a condition may read of a dtype value (``$x.dtype.itemsize``, ``$d.is_floating_point`` for a
captured dtype literal): torch.dtype's data properties. Of a value that is not a dtype, none: false."""
"""What a condition may read from a captured value (tensor metadata)."""

def check_conditions(reporter: Reporter, targets: Targets, bindings: Bindings, conditions: tuple[A.Cond, ...]) -> None:
    """Check the ``where`` clauses of a rule whose pattern binds ``bindings``."""
    if not conditions:
        return
    walk = _ConditionWalk(reporter, targets, bindings)
    for cond in conditions:
        before = reporter.errors
        walk.condition(cond)
        if reporter.errors == before:  # types are judged only on a condition whose names all check
            report_type_errors(reporter, cond)


@dataclass(slots=True)  # a worker, made for each rule: a frozen dataclass costs three times as much to make
class _ConditionWalk:
    """Checks one rule's conditions, reporting to ``reporter``."""

    reporter: Reporter
    targets: Targets
    bindings: Bindings
    loop_names: tuple[str, ...] = ()  # the names of the generators around the part being checked, outermost first

    def condition(self, cond: A.Cond) -> None:
        if isinstance(cond, A.CCapture):
            if cond.name not in self.bindings.captures:
                report_unbound_capture(self.reporter, cond.name, cond.span, self.bindings, "the condition")
        elif isinstance(cond, A.CName):
            if cond.name not in self.bindings.names and cond.name not in self.loop_names:
                self.unknown_name(cond)
        elif isinstance(cond, A.CGenerator):  # only as a call's argument (the grammar): call() checks it
            self.generator(cond)
        elif isinstance(cond, A.CLiteral):
            pass
        elif isinstance(cond, A.CAttr):
            self.attribute(cond)
        elif isinstance(cond, A.CIndex):
            self.condition(cond.value)
            self.condition(cond.index)
        elif isinstance(cond, A.CSlice):  # only as an index (the grammar)
            for part in cond.parts():
                self.condition(part)
        elif isinstance(cond, A.CCall):
            self.call(cond)
        elif isinstance(cond, A.CList):
            for item in cond.items:
                self.condition(item)
        elif isinstance(cond, A.CUnary):
            self.condition(cond.operand)
        elif isinstance(cond, A.CBinary):
            self.condition(cond.left)
            self.condition(cond.right)

    def attribute(self, cond: A.CAttr) -> None:
        """``value.attr``: a dotted constant, a module attribute (``bn.eps``) or tensor metadata."""
        if cond.attr.startswith("__"):
            self.reporter.error(cond.span, "forbidden-target",
                                f"a condition may not read the dunder attribute `{cond.attr}`")
            return
        chain = A.name_chain(cond)
        if chain is not None and chain[0] in self.loop_names:  # a generator's item: a value, as a capture is
            if len(chain) > 2 or cond.attr not in CAPTURE_ATTRIBUTES:
                self.reporter.error(cond.span, "unknown-attribute",
                                    f"`{chain[0]}` is an item of a sequence; it has no attribute `{chain[1]}`",
                                    notes=[f"an item exposes tensor metadata: {', '.join(sorted(CAPTURE_ATTRIBUTES))}"])
            return
        if chain is not None and chain[0] not in self.bindings.names:
            if self.targets.aliases.is_module_head(chain[0]):
                self.constant(A.Dotted(chain, cond.span))
            else:
                self.unknown_name(A.CName(chain[0], cond.span))
            return
        if isinstance(cond.value, A.CName) and cond.attr not in CAPTURE_ATTRIBUTES \
                and not _names_module(self.bindings.names[cond.value.name]):
            self.reporter.error(cond.span, "unknown-attribute",
                                f"`{cond.value.name}` names a node that is not a call_module, so it has no "
                                f"attribute `{cond.attr}`",
                                notes=[f"a node exposes its tensor metadata: {', '.join(sorted(CAPTURE_ATTRIBUTES))}; "
                                       f"a call_module node its module's attributes; users(), user_targets() and "
                                       f"used_only_by() describe its users"])
            return
        if cond.attr in DTYPE_ATTRIBUTES and (chain is None or isinstance(cond.value, A.CAttr)):
            return  # a dtype's data (fxrules.engine.conditions: false for a value that is not a dtype)
        if isinstance(cond.value, A.CCapture) and cond.attr not in CAPTURE_ATTRIBUTES:
            self.reporter.error(cond.span, "unknown-attribute", f"a capture has no attribute `{cond.attr}`",
                                notes=[f"captures expose: {', '.join(sorted(CAPTURE_ATTRIBUTES))}"])
        elif chain is None and cond.attr not in CAPTURE_ATTRIBUTES and not _rooted_at_name(cond.value):
            self.reporter.error(cond.span, "forbidden-target",
                                f"a condition may read only tensor metadata from a computed value, not `{cond.attr}`",
                                notes=[f"metadata: {', '.join(sorted(CAPTURE_ATTRIBUTES))}; module attributes are "
                                       f"read through a name bound with `as` (`bn.training`)"])
        self.condition(cond.value)

    def constant(self, dotted: A.Dotted) -> None:
        """A dotted constant in a condition: it must resolve, and not to a module (a value to reach through)."""
        targets = self.targets
        if targets.aliases.is_reported(dotted):
            return
        path = targets.aliases.full_path(dotted)
        resolution = targets.resolve(path)
        if resolution.is_error:
            targets.report(dotted.span, resolution, "unknown-target")
        elif targets.refused(dotted.span, allowlist.refuse_constant(path, targets.resolver.packages)):
            return
        elif resolution.ok and resolution.facts.kind is Kind.MODULE:
            self.reporter.error(dotted.span, "forbidden-target",
                                f"a condition may not use the module `{dotted.text}` as a value")

    def unknown_name(self, cond: A.CName) -> None:
        names = self.bindings.names
        if cond.name in PREDICATE_NAMES or cond.name in CONDITION_FUNCTIONS or cond.name in USER_FUNCTIONS:
            self.reporter.error(cond.span, "unknown-name",
                                f"`{cond.name}` is a function; call it, as in `{cond.name}($x)`")
            return
        notes = [f"the pattern names: {', '.join(sorted(names))}" if names
                 else "the pattern names no node with `as`"]
        notes += did_you_mean(cond.name, sorted(names) + sorted(PREDICATE_NAMES))
        self.reporter.error(cond.span, "unknown-name",
                            f"the condition uses `{cond.name}`, which is not bound or known", notes=notes)

    def generator(self, cond: A.CGenerator) -> None:
        """``ELEMENT for VAR in ITERABLE [if FILTER]``: the iterable is read where the generator is; the
        element and the filter see ``VAR`` too. ``VAR`` is a new name (not an ``as`` name, an outer
        generator's, a function's or an alias: ``duplicate-binding``), and generators nest at most
        :data:`MAX_GENERATOR_DEPTH` deep (``too-large``)."""
        self.condition(cond.iterable)
        taken = (cond.var in self.bindings.names or cond.var in self.loop_names or cond.var in PREDICATE_NAMES
                 or cond.var in CONDITION_FUNCTIONS or cond.var in USER_FUNCTIONS or cond.var in BINDING_PREDICATES
                 or self.targets.aliases.is_module_head(cond.var))
        if taken:
            self.reporter.error(cond.span, "duplicate-binding",
                                f"the generator's name `{cond.var}` is already a name here; choose another")
            return
        if len(self.loop_names) >= MAX_GENERATOR_DEPTH:
            self.reporter.error(cond.span, "too-large",
                                f"generators nest at most {MAX_GENERATOR_DEPTH} deep in a condition",
                                notes=[f"a condition visits at most {MAX_CONDITION_ITEMS} items in all"])
            return
        inner = _ConditionWalk(self.reporter, self.targets, self.bindings, self.loop_names + (cond.var,))
        inner.condition(cond.element)
        if cond.filter is not None:
            inner.condition(cond.filter)

    def range_call(self, cond: A.CCall) -> None:
        """``range(stop)``, ``range(start, stop[, step])``: at most :data:`MAX_CONDITION_ITEMS` items,
        decided here when the bounds are literals (and by the engine when they are not)."""
        if not 1 <= len(cond.args) <= 3:
            self.reporter.error(cond.span, "bad-condition", f"`range` takes 1 to 3 integers, not {len(cond.args)}")
            return
        bounds = [_int_literal(arg) for arg in cond.args]
        if any(b is None for b in bounds):
            return
        if len(cond.args) == 3 and bounds[2] == 0:
            self.reporter.error(cond.span, "bad-condition", "`range`'s step may not be 0")
        elif len(range(*bounds)) > MAX_CONDITION_ITEMS:
            self.reporter.error(cond.span, "too-large",
                                f"`range` in a condition has at most {MAX_CONDITION_ITEMS} items, not "
                                f"{len(range(*bounds))}")

    def binding_predicate(self, cond: A.CCall) -> None:
        """``is_literal($k)``: about what one capture is bound to (a name bound with ``as`` is always a node)."""
        if len(cond.args) != 1 or not isinstance(cond.args[0], A.CCapture):
            name = cond.func.name
            self.reporter.error(cond.span, "unknown-predicate", f"`{name}` takes one capture",
                                notes=[f"write `{name}($k)`"])

    def user_function(self, cond: A.CCall) -> None:
        """``users($x)``, ``user_targets(name)``, ``used_only_by($x, T, ...)``: about a matched node, so
        the first argument is a capture or an ``as`` name; ``used_only_by`` needs at least one target."""
        name = cond.func.name
        first = cond.args[0] if cond.args else None
        wanted = 1 if name != "used_only_by" else 2
        if not isinstance(first, (A.CCapture, A.CName)) or (len(cond.args) < wanted) or (
                name != "used_only_by" and len(cond.args) != 1):
            form = f"{name}($x)" if name != "used_only_by" else f"{name}($x, torch.relu, \"transpose\")"
            self.reporter.error(cond.span, "unknown-predicate", f"`{name}` takes a capture or a name bound with "
                                                                 f"`as`{', then targets' if wanted == 2 else ''}",
                                notes=[f"write `{form}`"])

    def call(self, cond: A.CCall) -> None:
        """A call: a predicate or pure builtin by bare name, a metadata method of a capture
        (``$x.is_contiguous()``), or a function by dotted path."""
        for arg in cond.args:
            self.condition(arg)
        func = cond.func
        if cond.args and isinstance(cond.args[0], A.CGenerator) and not (
                isinstance(func, A.CName) and func.name in GENERATOR_FUNCTIONS):
            self.reporter.error(cond.args[0].span, "unknown-predicate",
                                "only all, any, sum, min, max and tuple take a generator",
                                notes=[f"write `{'any' if not isinstance(func, A.CName) else func.name}(...)` "
                                       f"around a list instead, or use one of them"])
            return
        if isinstance(func, A.CName):
            if func.name == "range":
                self.range_call(cond)
                return
            if func.name in PREDICATE_NAMES or func.name in CONDITION_FUNCTIONS:
                return
            if func.name in USER_FUNCTIONS:
                self.user_function(cond)
                return
            if func.name in BINDING_PREDICATES:
                self.binding_predicate(cond)
                return
            self.reporter.error(func.span, "unknown-predicate", f"`{func.name}` is not a built-in predicate",
                                notes=[f"built-in predicates: {', '.join(sorted(PREDICATE_NAMES))}",
                                       "a Python function can be named by its dotted path, as in "
                                       "`mypkg.preds.is_small($x)`"]
                                + did_you_mean(func.name, sorted(PREDICATE_NAMES | CONDITION_FUNCTION_NAMES)))
            return
        chain = A.name_chain(func)
        if chain is None:
            if isinstance(func, A.CAttr) and isinstance(func.value, A.CCapture) and func.attr in CAPTURE_ATTRIBUTES:
                self.condition(func.value)
                return
            self.reporter.error(func.span, "unknown-predicate", "only predicates and dotted function paths can be called")
            return
        if chain[0] in self.bindings.names:
            self.reporter.error(func.span, "unknown-predicate", "only predicates and dotted function paths can be called",
                                notes=[f"`{chain[0]}` is a matched node"])
            return
        path = expand(chain, self.targets.aliases.paths) or ".".join(chain)
        check_called_path(self.reporter, self.targets, func.span, path)


def check_called_path(reporter: Reporter, targets: Targets, span: A.Span, path: str) -> None:
    """Whether a condition may call the function at the full dotted ``path``: not a builtin (the pure
    ones are called by bare name), nothing a replacement may not create, nothing private; and it must
    resolve, under the Resolver's import policy, to a callable."""
    if path.startswith("builtins.") or path in NEVER_CREATED or any(p.startswith("_") for p in path.split(".")):
        reporter.error(span, "forbidden-target", f"a condition may not call `{path}`",
                       notes=[f"the pure builtins a condition may call by bare name: "
                              f"{', '.join(sorted(CONDITION_FUNCTION_NAMES))}"])
        return
    resolution = targets.resolve(path)
    if resolution.is_error:
        targets.report(span, resolution, "unknown-predicate")
    elif targets.refused(span, allowlist.refuse_condition_call(path, targets.resolver.packages)):
        return
    elif resolution.ok and not resolution.facts.is_callable:
        reporter.error(span, "unknown-predicate", f"`{path}` is not callable")


def _int_literal(cond: A.Cond):
    """The int a literal (or a negated one) stands for, or None for anything else."""
    if isinstance(cond, A.CUnary) and cond.op == "-":
        inner = _int_literal(cond.operand)
        return None if inner is None else -inner
    if isinstance(cond, A.CLiteral) and isinstance(cond.value, int) and not isinstance(cond.value, bool):
        return cond.value
    return None


def _rooted_at_name(cond: A.Cond) -> bool:
    """An attribute chain on a bare name (``bn.weight``), possibly indexed (``conv.kernel_size[0]``)."""
    while isinstance(cond, (A.CAttr, A.CIndex)):
        cond = cond.value
    return isinstance(cond, A.CName)


def _names_module(expr: A.Expr) -> bool:
    """Whether a name bound with ``as`` to ``expr`` may have attributes beyond tensor metadata: a
    matched module (a call_module, or an alternation with one among its options), or a parameter
    (a ``get_attr``, whose value is the tensor itself)."""
    while isinstance(expr, A.Bind):
        expr = expr.expr
    if isinstance(expr, A.Call):
        return expr.op == "call_module"
    if isinstance(expr, A.Alt):
        return any(_names_module(option) for option in expr.options)
    return isinstance(expr, (A.GetAttr, A.PatternUse))  # not known here (an unknown named pattern was reported)
