"""The verifier's allocation budget: every model it runs is measured on fake tensors first.

``fxrules verify`` runs graphs that rule files made (host graphs around a pattern, a rule's
examples, and both after the rewrite). Before each real run, :func:`within_budget` measures the
run on fake tensors (:func:`fxrules.engine.budget.measure`, :meth:`Budget.for_verification`:
``max(64 MiB, 16x the largest input, parameter or buffer)`` per value, at most 1 GiB, and 4x that
alive at once) and raises :class:`~fxrules.engine.errors.AllocationRefused` instead of running
when the run would exceed it, or when the fake run fails (``allocation-unknown``: then nothing
bounds what the real run would allocate).

The verifier's own handlers catch exceptions of host and example runs (a host that does not run is
discarded, a rewritten model that raises is a counterexample), so a refusal is also noted in the
:class:`BudgetWatch` of the rule being verified (:func:`watch`): whatever handler caught it, the
rule's grade is ``error`` with the refusal's code.
"""

from __future__ import annotations

import contextlib
import contextvars
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import torch
from torch import nn

from fxrules.engine.budget import Budget, RealRunGuard, Unsized, measure
from fxrules.engine.errors import AllocationRefused


@dataclass(slots=True)
class BudgetWatch:
    """The refusals of one rule's verification (the first decides its verdict), and the runs
    already measured (a module with inputs of the same shapes is measured once)."""

    refusals: list[AllocationRefused] = field(default_factory=list)
    measured: "weakref.WeakKeyDictionary[nn.Module, set]" = field(default_factory=weakref.WeakKeyDictionary)

    @property
    def refusal(self) -> Optional[AllocationRefused]:
        return self.refusals[0] if self.refusals else None


_WATCH: contextvars.ContextVar[Optional[BudgetWatch]] = contextvars.ContextVar("fxrules_budget_watch", default=None)


@contextlib.contextmanager
def watch() -> Iterator[BudgetWatch]:
    """Note every refusal made while verifying one rule."""
    current = BudgetWatch()
    token = _WATCH.set(current)
    try:
        yield current
    finally:
        _WATCH.reset(token)


def _signature(inputs: tuple) -> tuple:
    return tuple((tuple(t.shape), t.dtype, t.device.type) if isinstance(t, torch.Tensor) else repr(t)
                 for t in inputs)


def within_budget(module: nn.Module, inputs: tuple) -> contextlib.AbstractContextManager:
    """The context to run ``module`` on ``inputs`` in: nothing more when its fake run measured it
    within the verification budget; a :class:`RealRunGuard` (each op sized before it runs, unsized
    ones refused) when the fake run stopped at an ordinary error. Raises :class:`AllocationRefused`
    (noted in the current :func:`watch`) over the budget or when fake tensors cannot size an op."""
    current = _WATCH.get()
    signature = _signature(inputs)
    if current is not None and signature in current.measured.get(module, ()):
        return contextlib.nullcontext()
    budget = Budget.for_verification(module, inputs)
    try:
        footprint = measure(module, inputs, budget)
    except AllocationRefused as refusal:
        _note(current, refusal)
        raise
    if not footprint.complete:
        return _Guarded(RealRunGuard(budget, Unsized.REFUSE), current)
    if current is not None:
        current.measured.setdefault(module, set()).add(signature)
    return contextlib.nullcontext()


def _note(current: Optional[BudgetWatch], refusal: AllocationRefused) -> None:
    if current is not None:
        current.refusals.append(refusal)


@dataclass(slots=True)
class _Guarded:
    """A real run under a :class:`RealRunGuard`, its refusals noted in the watch."""

    guard: RealRunGuard
    current: Optional[BudgetWatch]

    def __enter__(self) -> None:
        self.guard.__enter__()

    def __exit__(self, kind, exc, tb) -> None:
        self.guard.__exit__(kind, exc, tb)
        if isinstance(exc, AllocationRefused):
            _note(self.current, exc)


def refused_verdict(rule: Any, refusal: AllocationRefused) -> Any:
    """The verdict of a rule whose verification ran a model the budget refused: grade ``error``,
    ``refusal`` the stable code, the note naming the node and the size."""
    from fxrules.verifier.driver import Grade, RuleVerdict

    return RuleVerdict(rule.name, rule.source, rule.contract, Grade.ERROR, 0, 0,
                       f"refused to run a model of this rule: {refusal}", refusal=refusal.code)
