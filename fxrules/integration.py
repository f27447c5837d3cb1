"""fxrules inside the pass machinery people already run: a torch.fx pass and a torch.compile backend.

* :class:`RulePass` is a ``torch.fx.passes.infra.pass_base.PassBase``: give it to a
  ``PassManager`` (or call it on a GraphModule) and it returns
  ``PassResult(graph_module, modified)``, the rewritten module and whether any rule fired.
* :func:`compile_backend` returns a backend for ``torch.compile(model, backend=...)``: every
  graph dynamo captures is rewritten by the rules, then compiled by inductor (or run eagerly,
  or handed to any other backend).

Both keep the report of every run in ``.reports`` (one :class:`fxrules.Report` per graph) and
the rewrites per rule, summed over all runs, in ``.counts``.

What dynamo captures is a *functional* graph: since torch 2.5 it inlines ``nn.Module`` calls,
so modules become ``call_function`` nodes (``torch.conv2d``, ``F.batch_norm``,
``F.dropout(x, p, False, False)``, ``torch._C._nn.linear``) and parameters become
placeholders. Rules written for ``call_module`` nodes (``call_module Dropout``, conv/bn
folding) do not match there; rules on functions and methods do. Use :class:`RulePass` (or
:func:`fxrules.apply_rules`) on a ``torch.fx.symbolic_trace`` for module rules.

This module imports torch; ``import fxrules`` does not import it (``fxrules.RulePass`` and
``fxrules.compile_backend`` load it on first use).
"""

from __future__ import annotations

import threading
import warnings
from typing import Any, Callable, Iterable, Optional, Union

from torch import fx
from torch.fx.passes.infra.pass_base import PassBase, PassResult

from fxrules.api import apply_rules
from fxrules.lang.load import as_rule_set
from fxrules.lang.runtime import entered
from fxrules.engine.report import Report
from fxrules.lang.ruleset import RuleSet

__all__ = ["RulePass", "RuleBackend", "compile_backend"]


def _sum_counts(reports: Iterable[Report]) -> dict[str, int]:
    total: dict[str, int] = {}
    for report in reports:
        for rule, count in report.counts.items():
            total[rule] = total.get(rule, 0) + count
    return total


class RulePass(PassBase):
    """A torch.fx pass that applies a rule set to a fixpoint.

    ``rules``: a :class:`fxrules.RuleSet` or rule file path(s). ``example_inputs``: inputs for
    the graphs this pass will see, used to compute shape/dtype metadata when a rule's conditions
    read it (graphs from ``torch.export`` carry it already). ``max_iterations``: as in
    :func:`fxrules.apply_rules`.

    ``call(graph_module)`` rewrites ``graph_module`` in place, as torch.fx passes do
    (``apply_rules(..., inplace=True)``: no copy of the graph, no new module tree) and returns
    ``PassResult(graph_module, modified)``, ``modified`` being True when at least one rule fired
    (when none did, the module is not recompiled either).
    It is still all or nothing: errors (:class:`fxrules.RewriteError`, :class:`fxrules.ModelError`,
    ...) propagate with the module rolled back exactly as it was. Each run's :class:`fxrules.Report`
    is appended to ``reports``.
    """

    def __init__(self, rules: Union[RuleSet, str, Any], *, example_inputs: Optional[tuple] = None,
                 max_iterations: Optional[int] = None, allow_imports: Iterable[str] = ()):
        super().__init__()
        with entered():  # an entry point: loading rules (each run goes through apply_rules, another)
            self.rules: RuleSet = as_rule_set(rules, allow_imports)
        self.example_inputs = tuple(example_inputs) if example_inputs is not None else None
        self.max_iterations = max_iterations
        self.reports: list[Report] = []

    def call(self, graph_module: fx.GraphModule) -> PassResult:
        result = apply_rules(graph_module, self.rules, example_inputs=self.example_inputs,
                             max_iterations=self.max_iterations, inplace=True)
        self.reports.append(result.report)
        return PassResult(graph_module, bool(result.report.applied))

    @property
    def counts(self) -> dict[str, int]:
        """Rewrites per rule, summed over every run of this pass."""
        return _sum_counts(self.reports)

    def __repr__(self) -> str:
        return f"RulePass({len(self.rules)} rules)"


def _is_fake(value: Any) -> bool:
    from fxrules.engine.fxaccess import is_fake_tensor

    return is_fake_tensor(value)


class RuleBackend:
    """The callable :func:`compile_backend` returns: ``backend(graph_module, example_inputs)``."""

    def __init__(self, rules: RuleSet, then: Union[str, Callable], *, max_iterations: Optional[int],
                 on_error: str):
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
        if isinstance(then, str):
            from torch.compiler import list_backends

            from fxrules.engine.fxaccess import compile_backend_named

            try:
                self._then = compile_backend_named(then)
            except Exception:
                known = ", ".join(sorted(set(list_backends(exclude_tags=())) | {"eager", "inductor"}))
                raise ValueError(f"no torch.compile backend named {then!r}; known: {known}") from None
        elif callable(then):
            self._then = then
        else:
            raise TypeError(f"then must be a backend name or a callable, not {type(then).__name__}")
        self.then = then
        self.rules = rules
        self.max_iterations = max_iterations
        self.on_error = on_error
        self.reports: list[Report] = []
        self.errors: list[Exception] = []
        self._lock = threading.Lock()

    def __call__(self, graph_module: fx.GraphModule, example_inputs: list) -> Callable:
        # Shape/dtype metadata for the rules' conditions: dynamo records a fake value of every
        # node in meta['example_value'], in its own shape environment, so a condition on a
        # dynamic size adds a guard there and the compiled graph is reused only where the
        # decision holds. The engine reads meta['val']: lend it the example values for the run.
        # A graph without them (a backend called by hand) gets metadata from real example inputs.
        lent = _lend_example_values(graph_module)
        inputs = None
        if lent is None and example_inputs and not any(_is_fake(v) for v in example_inputs):
            inputs = tuple(example_inputs)
        try:
            result = apply_rules(graph_module, self.rules, example_inputs=inputs,
                                 max_iterations=self.max_iterations)
        except Exception as exc:
            if self.on_error == "raise":
                raise
            with self._lock:
                self.errors.append(exc)
            warnings.warn(f"fxrules: rules not applied to a captured graph: {exc}", RuntimeWarning, stacklevel=2)
            result = None
        finally:
            for node in lent or ():  # dynamo's graph goes on exactly as it came
                node.meta.pop("val", None)
        if result is None:
            return self._then(graph_module, example_inputs)
        with self._lock:
            self.reports.append(result.report)
        _keep_dynamo_attributes(graph_module, result.module)
        return self._then(result.module, example_inputs)

    @property
    def counts(self) -> dict[str, int]:
        """Rewrites per rule, summed over every graph this backend compiled."""
        return _sum_counts(self.reports)

    def __repr__(self) -> str:
        then = self.then if isinstance(self.then, str) else getattr(self.then, "__name__", repr(self.then))
        return f"RuleBackend({len(self.rules)} rules, then={then!r}, graphs={len(self.reports)})"


def _lend_example_values(graph_module: fx.GraphModule) -> Optional[list]:
    """Set meta['val'] from dynamo's meta['example_value'] where missing; the nodes changed, or None.

    None when the graph is not a dynamo graph (a placeholder has neither key).
    """
    placeholders = graph_module.graph.find_nodes(op="placeholder")
    if not placeholders or not all("example_value" in n.meta or "val" in n.meta for n in placeholders):
        return None
    lent = []
    for node in graph_module.graph.nodes:
        if "val" not in node.meta and "example_value" in node.meta:
            node.meta["val"] = node.meta["example_value"]
            lent.append(node)
    return lent


def _keep_dynamo_attributes(captured: fx.GraphModule, rewritten: fx.GraphModule) -> None:
    """Carry the attributes dynamo sets on placeholder nodes (``_dynamo_source``) over to the rewrite.

    The engine rewrites a copy of the graph; node ``meta`` and ``graph_module.meta`` are copied,
    but plain attributes on nodes are not, and inductor reads ``node._dynamo_source`` of every
    placeholder. Placeholders keep their names through a rewrite, so they are paired by name.
    """
    rewritten_placeholders = {n.name: n for n in rewritten.graph.find_nodes(op="placeholder")}
    for node in captured.graph.find_nodes(op="placeholder"):
        twin = rewritten_placeholders.get(node.name)
        if twin is None:
            continue
        for key, value in getattr(node, "__dict__", {}).items():
            if key not in twin.__dict__:
                setattr(twin, key, value)
    for node in rewritten.graph.nodes:  # nodes the rules created: metadata under dynamo's key too
        if "val" in node.meta and "example_value" not in node.meta:
            node.meta["example_value"] = node.meta["val"]


def compile_backend(rules: Union[RuleSet, str, Any], then: Union[str, Callable] = "inductor", *,
                    max_iterations: Optional[int] = None, on_error: str = "raise",
                    allow_imports: Iterable[str] = ()) -> RuleBackend:
    """A ``torch.compile`` backend that applies ``rules`` to every captured graph, then compiles it.

    ``then``: ``"inductor"`` (the default), ``"eager"`` (run the rewritten graph as is), any other
    registered backend name, or a backend callable ``(graph_module, example_inputs) -> callable``.
    ``on_error``: ``"raise"`` (a rule that fails fails the compile, as any backend error does) or
    ``"skip"`` (warn, record the error in ``backend.errors`` and compile the graph unrewritten).

    The backend keeps one :class:`fxrules.Report` per captured graph in ``backend.reports`` and the
    total rewrites per rule in ``backend.counts``::

        backend = fxrules.compile_backend("rules/", then="inductor")
        compiled = torch.compile(model, backend=backend)
        compiled(x)
        print(backend.counts)
    """
    with entered():  # an entry point: loading rules (each run goes through apply_rules, another)
        rule_set = as_rule_set(rules, allow_imports)
    return RuleBackend(rule_set, then, max_iterations=max_iterations, on_error=on_error)
