"""Bounded evaluation: what one run of a graph may allocate, decided before it runs.

Rule files are untrusted, and a replacement can ask for any amount of memory with a few bytes
(``call_function torch.zeros(100000, 100000)``, ``call_method expand($x, ...)`` then
``contiguous``, ``repeat``, ``torch.arange(0, 10**11)``). fxrules runs graphs that rules made in
two places: ``fxrules verify`` (host and example models, before and after the rewrite) and the
real-tensor fallback of ``apply_rules``' shape propagation. Each such run is measured first on
fake tensors (no data is allocated) and refused when it would exceed a :class:`Budget`:

* **one value** (the storage one op makes): at most ``max(64 MiB, F x the largest input,
  parameter or buffer)``; F is 16 in verification (its models are small: host tensors of a few
  KB, example inputs of at most 4M elements), capped at 1 GiB; 64 for the caller's own model in
  ``apply_rules`` (activations of real networks reach a few dozen times their largest tensor), not
  capped: that model is the caller's and runs anyway;
* **everything alive at once** (storages made by ops and still referenced): at most 4x that, so
  a ``torch.cat`` of many values each under the first limit is refused too.

64 MiB is the floor so that small graphs (tiny inputs) may still make values far larger than their
inputs (an outer product, a one-hot, a padded copy) while a rule cannot reach gigabytes.

A refusal is :class:`~fxrules.engine.errors.AllocationRefused` with code ``allocation-budget``
naming the node and the size. When the fake run itself fails (an op without a fake kernel, an
output shape that depends on the data), the run's memory cannot be known beforehand:
:func:`measure` refuses with ``allocation-unknown`` (the verifier's policy: it runs graphs rules
made). A fake run that stops at an ordinary error (a shape mismatch, which the real run finds too)
is followed by a real run under :class:`RealRunGuard`: each op is first run on fake tensors and
refused if its outputs would exceed the budget. The real fallback of shape propagation (it runs only
when the fake run of the caller's model failed) runs under the guard too; there an op whose output
size depends on the data runs and is counted right after (the model is the caller's: documented in
SECURITY.md).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Callable, Iterable, Iterator

import torch
from torch import fx, nn

from fxrules.engine import fxaccess
from fxrules.engine.errors import AllocationRefused

MIB = 1 << 20
FLOOR_BYTES = 64 * MIB
"""The smallest budget for one value, whatever the inputs (see the module docstring)."""
VERIFY_FACTOR, VERIFY_CAP_BYTES = 16, 1 << 30
"""In verification: one value may be 16x the largest input, parameter or buffer, and at most 1 GiB."""
MODEL_FACTOR = 64
"""In ``apply_rules``' real fallback: 64x the caller's largest tensor (no cap: the model is the caller's)."""
LIVE_FACTOR = 4
"""Everything alive at once may be 4x the budget of one value."""


class BudgetCode(StrEnum):
    """The stable codes of a refused run."""

    OVER = "allocation-budget"
    """The run would allocate more than its budget."""
    UNKNOWN = "allocation-unknown"
    """The fake run failed, so what the run allocates cannot be known before it runs."""


@dataclass(frozen=True, slots=True)
class Budget:
    """Bytes one value (``value_bytes``) and all values alive at once (``live_bytes``) may take;
    ``basis_bytes``: the largest input, parameter or buffer it was made from."""

    value_bytes: int
    live_bytes: int
    basis_bytes: int

    @classmethod
    def scaled(cls, basis_bytes: int, factor: int, cap: int | None = None) -> "Budget":
        value = max(FLOOR_BYTES, factor * basis_bytes)
        if cap is not None:
            value = min(value, max(cap, FLOOR_BYTES))
        return cls(value, LIVE_FACTOR * value, basis_bytes)

    @classmethod
    def for_verification(cls, module: nn.Module, inputs: Iterable[Any]) -> "Budget":
        return cls.scaled(largest_tensor_bytes(module, inputs), VERIFY_FACTOR, VERIFY_CAP_BYTES)

    @classmethod
    def for_model(cls, module: nn.Module, inputs: Iterable[Any]) -> "Budget":
        return cls.scaled(largest_tensor_bytes(module, inputs), MODEL_FACTOR)

    def describe(self) -> str:
        return (f"{human_bytes(self.value_bytes)} per value, {human_bytes(self.live_bytes)} alive at once "
                f"(largest input, parameter or buffer: {human_bytes(self.basis_bytes)})")


def human_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def tensor_bytes(t: torch.Tensor) -> int:
    """What ``t``'s storage takes (its whole storage: a view keeps it alive)."""
    return int(t.untyped_storage().nbytes())


def largest_tensor_bytes(module: nn.Module, inputs: Iterable[Any]) -> int:
    values = [t for t in _leaves(tuple(inputs)) if isinstance(t, torch.Tensor)]
    values += list(module.parameters()) + list(module.buffers())
    return max((tensor_bytes(t) for t in values), default=0)


def _leaves(value: Any) -> Iterator[Any]:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        else:
            yield item


@dataclass(frozen=True, slots=True)
class Footprint:
    """What a measured run allocated: the largest value and the most alive at once, in bytes.
    ``failure``: empty when the fake run completed; else what stopped it (an ordinary error, such as
    a shape mismatch, at the node named): what ran before was within budget, and the rest must run
    under a :class:`RealRunGuard`."""

    largest_value: int
    peak_live: int
    failure: str = ""

    @property
    def complete(self) -> bool:
        return not self.failure


class Unsized(StrEnum):
    """What a :class:`RealRunGuard` does with an op that fake tensors cannot size (its output shape
    depends on the data)."""

    REFUSE = "refuse"
    """Refuse the run (``allocation-unknown``): for graphs rules made (verification)."""
    RUN_AND_COUNT = "run-and-count"
    """Run the op and count its outputs right after: for the caller's own model (shape propagation)."""


class _Ledger:
    """Storages that ops made and that are still referenced (weakly held: a freed value stops counting)."""

    def __init__(self, budget: Budget):
        self.budget = budget
        self.entries: list[tuple[weakref.ref, int, int]] = []  # (tensor, storage key, bytes)
        self.largest = 0
        self.peak = 0

    def live(self) -> int:
        alive = [e for e in self.entries if e[0]() is not None]
        self.entries = alive
        return sum({key: size for _, key, size in alive}.values())

    def new_storages(self, outputs: Any, known: set) -> list[tuple[torch.Tensor, int, int]]:
        """The tensors among ``outputs`` whose storage is not in ``known`` (an input's: views and
        in-place results allocate nothing), with their storage keys and sizes."""
        fresh = []
        for t in _leaves(outputs):
            if isinstance(t, torch.Tensor):
                key = fxaccess.storage_key(t)
                if key not in known:
                    fresh.append((t, key, tensor_bytes(t)))
        return fresh

    def admit(self, fresh: list[tuple[torch.Tensor, int, int]], where: str, node: str) -> None:
        """Refuse when one new storage or everything alive with the new ones exceeds the budget
        (``where``: the node and op, for the message; ``node``: the node's name, or empty)."""
        for _, _, size in fresh:
            self.largest = max(self.largest, size)
            if size > self.budget.value_bytes:
                raise AllocationRefused(f"{where} would allocate {human_bytes(size)}, over the budget of "
                                        f"{self.budget.describe()}", code=BudgetCode.OVER, node=node, nbytes=size,
                                        limit=self.budget.value_bytes)
        live = self.live() + sum({key: size for _, key, size in fresh}.values())
        self.peak = max(self.peak, live)
        if live > self.budget.live_bytes:
            raise AllocationRefused(f"at {where} the values alive would take {human_bytes(live)}, over the budget of "
                                    f"{self.budget.describe()}", code=BudgetCode.OVER, node=node, nbytes=live,
                                    limit=self.budget.live_bytes)

    def keep(self, fresh: list[tuple[torch.Tensor, int, int]]) -> None:
        self.entries.extend((weakref.ref(t), key, size) for t, key, size in fresh)


def _input_keys(args: Any, kwargs: Any) -> set:
    return {fxaccess.storage_key(t) for t in _leaves((args, kwargs)) if isinstance(t, torch.Tensor)}


class _Place:
    """Where a run is: the graph node being run (set by :class:`_NamedRun`), for refusals' wording."""

    def __init__(self) -> None:
        self.node = ""

    def where(self, func: Any) -> str:
        return f"node %{self.node} ({func})" if self.node else f"op {func}"


class _FakeMeter(fxaccess.DispatchMode):
    """On fake tensors: counts the storages each op makes, refusing over the budget."""

    def __init__(self, ledger: _Ledger, place: _Place):
        super().__init__()
        self.ledger, self.place = ledger, place

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        fresh = self.ledger.new_storages(out, _input_keys(args, kwargs))
        self.ledger.admit(fresh, self.place.where(func), self.place.node)
        self.ledger.keep(fresh)
        return out


class _NamedRun(fx.Interpreter):
    """Runs a GraphModule node by node, telling ``place`` which node runs (the Interpreter frees each
    value after its last use, as the generated code does)."""

    def __init__(self, module: fx.GraphModule, place: _Place):
        super().__init__(module)
        self.place = place

    def run_node(self, n: fx.Node) -> Any:
        self.place.node = n.name
        return super().run_node(n)


class _FakeGraphRun(_NamedRun):
    """Runs a GraphModule on fake tensors without copying it: its attributes are read as fake
    tensors, and each submodule is called with fake parameters and buffers in their place
    (``torch.func.functional_call``: in-place buffer updates go to the fakes). A deep copy of the
    module in a fake copy mode made the measure three times slower."""

    def __init__(self, module: fx.GraphModule, place: _Place, mode: Any):
        super().__init__(module, place)
        self.mode = mode

    def fetch_attr(self, target: str) -> Any:
        value = super().fetch_attr(target)
        return self.mode.from_tensor(value) if isinstance(value, torch.Tensor) else value

    def call_module(self, target, args, kwargs):
        module = self.fetch_submodule(target)
        state = {name: self.mode.from_tensor(t) for name, t in
                 [*module.named_parameters(), *module.named_buffers()]}
        return torch.func.functional_call(module, state, tuple(args), dict(kwargs))


def measure(module: nn.Module, inputs: tuple, budget: Budget) -> Footprint:
    """Run ``module`` on fake copies of itself and ``inputs``; what it would allocate, or
    :class:`AllocationRefused` (``allocation-budget`` over ``budget``; ``allocation-unknown`` when
    fake tensors cannot size an op). A fake run that stops at an ordinary error (a shape mismatch)
    gives an incomplete :class:`Footprint`. Nothing of the caller's is touched and no tensor data is
    allocated."""
    mode = fxaccess.new_strict_fake_mode()
    ledger, place = _Ledger(budget), _Place()
    try:
        fake_inputs = tuple(mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in inputs)
        if isinstance(module, fx.GraphModule):
            run = _FakeGraphRun(module, place, mode).run
        else:
            run = fxaccess.fake_module_copy(mode, module)
        with torch.no_grad(), fxaccess.quiet_meta_failures(), mode, _FakeMeter(ledger, place):
            run(*fake_inputs)
    except AllocationRefused as exc:
        raise exc.again() from None
    except Exception as exc:
        where = f" at node %{place.node}" if place.node else ""
        first = str(exc).splitlines()[0] if str(exc) else ""
        if not fxaccess.fake_cannot_size(exc):
            return Footprint(ledger.largest, ledger.peak, f"{type(exc).__name__}{where}: {first}")
        raise AllocationRefused(f"fake tensors cannot size the graph{where} ({type(exc).__name__}: {first}), so "
                                f"what it allocates cannot be known before it runs; fxrules does not run it",
                                code=BudgetCode.UNKNOWN, node=place.node) from exc
    return Footprint(ledger.largest, ledger.peak)


class RealRunGuard(fxaccess.DispatchMode):
    """For a run on real tensors: each op runs first on fake tensors, and is refused before it runs
    when its outputs would exceed the budget. An op whose fake run fails with an ordinary error (a
    shape mismatch) runs, to raise that error; one that fake tensors cannot size (its output shape
    depends on the data) is refused or run and counted right after, as ``unsized`` says."""

    def __init__(self, budget: Budget, unsized: Unsized, place: Callable[[], str] = lambda: ""):
        super().__init__()
        self.ledger = _Ledger(budget)
        self.fake = fxaccess.new_strict_fake_mode()
        self.unsized = unsized
        self.place = place

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        node = self.place()
        where = f"node %{node} ({func})" if node else f"op {func}"
        predicted = self._predict(func, args, kwargs, where, node)
        if predicted is not None:
            self.ledger.admit(predicted, where, node)
        out = func(*args, **kwargs)
        fresh = self.ledger.new_storages(out, _input_keys(args, kwargs))
        if predicted is None:
            self.ledger.admit(fresh, where, node)
        self.ledger.keep(fresh)
        return out

    def _predict(self, func, args, kwargs, where: str, node: str) -> list | None:
        """The storages the op would make, sized on fake copies of its arguments; None when the fake
        run fails (refused first when it cannot size the op and ``unsized`` says so)."""
        try:
            with fxaccess.quiet_meta_failures(), self.fake:
                fake_args = fxaccess.to_fake(self.fake, args)
                fake_kwargs = fxaccess.to_fake(self.fake, kwargs)
                known = _input_keys(fake_args, fake_kwargs)
                return self.ledger.new_storages(func(*fake_args, **fake_kwargs), known)
        except AllocationRefused:
            raise
        except Exception as exc:
            if self.unsized is Unsized.REFUSE and fxaccess.fake_cannot_size(exc):
                raise AllocationRefused(f"fake tensors cannot size {where} ({type(exc).__name__}), so what it "
                                        f"allocates cannot be known before it runs; fxrules does not run it",
                                        code=BudgetCode.UNKNOWN, node=node) from None
            return None


