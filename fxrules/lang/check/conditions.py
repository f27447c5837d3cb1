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
from fxrules.lang.names import CONDITION_FUNCTIONS, PREDICATE_NAMES, USER_FUNCTIONS, expand
from fxrules.lang.torch_index import Kind

CONDITION_FUNCTION_NAMES = frozenset(CONDITION_FUNCTIONS)
"""The pure builtins a condition may call by bare name."""

CAPTURE_ATTRIBUTES = frozenset({"shape", "ndim", "dtype", "device", "numel", "requires_grad", "is_contiguous"})
"""What a condition may read from a captured value (tensor metadata)."""

def check_conditions(reporter: Reporter, targets: Targets, bindings: Bindings, conditions: tuple[A.Cond, ...]) -> None:
    """Check the ``where`` clauses of a rule whose pattern binds ``bindings``."""
    if not conditions:
        return
    walk = _ConditionWalk(reporter, targets, bindings)
    for cond in conditions:
        walk.condition(cond)


@dataclass(slots=True)  # a worker, made for each rule: a frozen dataclass costs three times as much to make
class _ConditionWalk:
    reporter: Reporter
    targets: Targets
    bindings: Bindings

    def condition(self, cond: A.Cond) -> None:
        if isinstance(cond, A.CCapture):
            if cond.name not in self.bindings.captures:
                report_unbound_capture(self.reporter, cond.name, cond.span, self.bindings, "the condition")
        elif isinstance(cond, A.CName):
            if cond.name not in self.bindings.names:
                self.unknown_name(cond)
        elif isinstance(cond, A.CLiteral):
            pass
        elif isinstance(cond, A.CAttr):
            self.attribute(cond)
        elif isinstance(cond, A.CIndex):
            self.condition(cond.value)
            self.condition(cond.index)
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
        if isinstance(func, A.CName):
            if func.name in PREDICATE_NAMES or func.name in CONDITION_FUNCTIONS:
                return
            if func.name in USER_FUNCTIONS:
                self.user_function(cond)
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
