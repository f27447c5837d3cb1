"""Verification: does every rule keep its contract?

For each rule, two kinds of evidence:

* **host graphs** (:mod:`fxrules.verifier.hosts`): hypothesis draws models that contain the
  rule's pattern, with module hyperparameters, weights, buffers, input shapes,
  dtypes and values drawn by the sampler catalogue (:mod:`fxrules.verifier.samplers`). The
  rule alone is applied; the models before and after run on the same inputs and
  their outputs are compared by the rule's contract. A failure is shrunk by
  hypothesis to a small counterexample, and kept in hypothesis' example database
  so the next run tries it first.
* **examples** written in the rule file (:mod:`fxrules.verifier.examples`): each positive
  example must be rewritten (as often as it says) and keep the contract; each
  negative one (``example 0``) must be left alone.

The property, by contract:

``exact``
    every output bit-identical (:func:`bit_identical`: same shape, dtype and bits; any NaN equals
    any NaN; signed zeros differ; complex by parts), and no output newly sharing memory with a
    parameter, buffer or another output (``approx`` too). Gradients w.r.t. the inputs and the
    trainable parameters are compared by the same contract unless ``grad=False``.
``approx``
    a rewrite that keeps every output's shape and dtype agrees within
    ``torch.testing.assert_close``'s tolerance for that dtype; for the low-precision
    dtypes a larger difference is still accepted when the rewritten model is no
    further from a float64 reference than 4x the original's own rounding error (a
    fold computes in another order; it must not be *less* accurate). A rewrite that
    changes a shape or dtype breaks the contract. The budget is conditioning-aware
    (:func:`_judge`, docs/verify.md "The [approx] budget"): an element may also differ by
    :data:`SPREAD_FACTOR` times the *spread* of the original model run in float64 on inputs,
    parameters and buffers perturbed by one unit of rounding of their dtype (relative
    ``±eps``, random signs, :data:`SPREAD_RUNS` fixed-seed runs): what rounding the inputs to
    the dtype could already explain. A cancelling sum (small output, huge terms) or an
    ill-conditioned gradient gets a budget as large as its conditioning; a well-conditioned
    output gets none extra. The spread is computed only when the cheaper tests fail, and its
    runs go through the allocation budget as every run does. A host whose original model
    overflows (its float64 run is inf or NaN at an element) although every input, parameter
    and buffer is finite is outside what the verifier can judge (float64 has no higher
    reference): where the rewrite differs only at such elements the host is discarded with
    :attr:`DiscardReason.ORIGINAL_OVERFLOWS`, counted in ``hosts_discarded_by``, never passed
    as checked. Non-finite inputs (drawn on purpose) are compared as before, and a rewrite
    that makes a finite original output inf or NaN is still a counterexample. Where both the original
    and the rewrite give a non-finite element (inf of either sign, or NaN) they agree: which of them
    a computation in another order overflows to depends on the order, which ``approx`` allows.
``changes``
    the rewritten model runs; the verdict says whether shapes were kept.

Grades (:class:`Grade`): ``validated`` (all evidence agrees, on at least :data:`MIN_HOSTS`
distinct host graphs), ``weak`` (nothing broke, but fewer distinct hosts), ``wrong`` (a contract broken),
``noisy`` (a negative example rewritten), ``missing`` (a positive example not
rewritten as expected), ``unverified`` (no host graphs could be drawn — no sampler
for one of its ops, or none the rule rewrites — and no positive example),
``error`` (an example cannot be built or run). Why host graphs could not verify a rule
is a :class:`HostsGap`; the verdict's note is written from it and the other facts at the end.
"""

from __future__ import annotations

import contextlib
import copy
import io
import shlex
import hashlib
import time
import warnings
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Iterable, Optional

import torch

from fxrules.engine import fxaccess
from fxrules.engine.errors import AllocationRefused
from fxrules.lang.diagnostics import FxrulesError
from fxrules.verifier.budget import refused_verdict, watch as budget_watch, within_budget
from fxrules.lang.runtime import entered
from fxrules.lang.ruleset import CheckedRule, RuleSet
from fxrules.engine.refusals import RefusalCode



class Grade(StrEnum):
    """A rule's (or an example's) verdict. String-valued: prints, compares and serialises as its value."""

    VALIDATED = "validated"
    WRONG = "wrong"
    NOISY = "noisy"
    MISSING = "missing"
    UNVERIFIED = "unverified"
    WEAK = "weak"
    ERROR = "error"

    @property
    def severity(self) -> int:
        """How bad: a rule's grade is its worst piece of evidence's."""
        return _SEVERITY[self]


GRADES = tuple(Grade)
_SEVERITY = {Grade.WRONG: 6, Grade.ERROR: 5, Grade.NOISY: 4, Grade.MISSING: 3, Grade.UNVERIFIED: 2, Grade.WEAK: 1,
             Grade.VALIDATED: 0}

MIN_HOSTS = 5
"""The fewest distinct host graphs (see :func:`host_fingerprint`) a rule must be checked on, contract
kept, to be graded ``validated``; with fewer (and no broken contract) it is ``weak``: its examples
alone, or one or two hosts, are not evidence enough."""


class HostsGap(StrEnum):
    """Why host graphs did not verify a rule (a :class:`HostsNote`'s kind)."""

    NO_SAMPLER = "no-sampler"
    """An op of the pattern has no sampler: no host can be drawn."""
    NONE_REWRITTEN = "none-rewritten"
    """Hypothesis gave up: none of the drawn hosts was rewritten (the conditions declined them)."""
    NO_HOST_REWRITTEN = "no-host-rewritten"
    """The run ended with no host rewritten."""
    DID_NOT_REPRODUCE = "did-not-reproduce"
    """A ``--reproduce`` counterexample did not reproduce."""
    FLAKY = "flaky"
    """Hypothesis found the host check flaky."""


class DiscardReason(StrEnum):
    """Why a host that was rewritten was still discarded (``hosts_discarded_by``'s keys; a host the rule
    declines or whose ops refuse the drawn dtype is discarded too, and counted in ``hosts_discarded`` only)."""

    ORIGINAL_OVERFLOWS = "original-overflows"
    """The original model's float64 run is inf or NaN where every input, parameter and buffer is finite
    (an intermediate overflows), and the rewrite differs only there: no reference can judge the host."""


@dataclass(frozen=True, slots=True)
class HostsNote:
    """The facts behind a verdict's ``hosts_note``; :meth:`text` writes the note from them.

    ``missing``: the ops without a sampler (``no-sampler``); ``declined``: hosts drawn and
    not rewritten (``none-rewritten``); ``detail``: hypothesis' message (``flaky``).
    """

    gap: HostsGap
    missing: tuple[str, ...] = ()
    declined: int = 0
    detail: str = ""

    def text(self, examples_rewrote: bool) -> str:
        """The note; when the hosts verified nothing, it says what to do about it, or that the
        rule's examples (``examples_rewrote``: one was rewritten) verify it instead."""
        advice = " (its examples verify it)" if examples_rewrote else "; add an example"
        gap = self.gap
        if gap is HostsGap.NO_SAMPLER:
            return f"not verified on host graphs: no sampler for {', '.join(self.missing)}{advice}"
        if gap is HostsGap.NONE_REWRITTEN:
            return (f"not verified on host graphs: none of the drawn hosts was rewritten by the rule "
                    f"({self.declined} declined){advice}")
        if gap is HostsGap.NO_HOST_REWRITTEN:
            return f"not verified on host graphs: no host was rewritten by the rule{advice}"
        if gap is HostsGap.DID_NOT_REPRODUCE:
            return "the given counterexample did not reproduce (the rule, its samplers or hypothesis changed)"
        return f"host check flaky: {self.detail}"


DEFAULT_DTYPES = (torch.float32, torch.float64, torch.float32, torch.float64, torch.float16, torch.bfloat16,
                  torch.float32, torch.float64, torch.int64, torch.int32, torch.bool, torch.complex64)
"""The host dtypes drawn (repeats weigh the draw): mostly float32 and float64, sometimes the half types,
integers, bool and complex (a host whose ops refuse the dtype is discarded and another drawn)."""


@dataclass(frozen=True)
class Counterexample:
    """A host (or example) on which a rule broke its contract, in terms a person can act on."""

    problem: str
    facts: tuple[str, ...]  # modules with their hyperparameters, inputs with shapes and dtypes
    max_abs: Optional[float]
    max_rel: Optional[float]
    code: str  # the host model's forward before the rewrite
    reproduce: Optional[str] = None  # hypothesis' @reproduce_failure line
    command: Optional[str] = None  # the command line that replays exactly this host

    def render(self, indent: str = "    ") -> str:
        lines = [self.problem]
        if self.max_abs is not None:
            lines.append(f"max |difference| = {self.max_abs:.3g}, max relative difference = {self.max_rel:.3g}")
        lines += list(self.facts)
        lines.append("host model:")
        lines += ["  " + line for line in self.code.strip("\n").splitlines()]
        if self.command:
            lines.append(f"replay it: {self.command}")
        elif self.reproduce:
            lines.append(f"reproduce: {self.reproduce}")
        return "\n".join(indent + line for line in lines)

    def to_json(self) -> dict:
        return {"problem": self.problem, "facts": list(self.facts), "max_abs": self.max_abs, "max_rel": self.max_rel,
                "code": self.code, "reproduce": self.reproduce, "command": self.command}


@dataclass(frozen=True)
class ExampleOutcome:
    """One example of a rule: what it asked for and what happened."""

    location: str  # file:line:col
    expected: str
    rewrites: int
    problem: Optional[str]  # None when the example behaved
    grade: Grade  # validated, missing, noisy, wrong, error

    def to_json(self) -> dict:
        return {"location": self.location, "expected": self.expected, "rewrites": self.rewrites,
                "problem": self.problem, "grade": str(self.grade)}


@dataclass(frozen=True)
class RuleVerdict:
    """Everything verification found out about one rule."""

    rule: str
    source: str  # file:line
    contract: str
    grade: Grade
    hosts_checked: int
    hosts_discarded: int
    hosts_note: Optional[str]  # why hosts could not be checked ("no sampler for ...")
    examples: tuple[ExampleOutcome, ...] = ()
    counterexample: Optional[Counterexample] = None
    shapes_kept: Optional[bool] = None  # for [changes] rules: did every checked rewrite keep shapes?
    hosts_gap: Optional[HostsGap] = None  # hosts_note's kind, for programs
    refusal: Optional[str] = None  # a stable code (allocation-budget, allocation-unknown) when a run was refused
    hosts_discarded_by: tuple = ()  # (DiscardReason, count) pairs: rewritten hosts discarded, and why

    @property
    def ok(self) -> bool:
        return self.grade is Grade.VALIDATED

    def render(self) -> str:
        head = f"{self.source}: {self.rule} [{self.contract}]: {self.grade}"
        detail = [f"{self.hosts_checked} distinct host graph{'s' * (self.hosts_checked != 1)} checked"]
        if self.counterexample is not None and self.hosts_checked and self.hosts_note is None:
            detail = [f"{self.hosts_checked} distinct host graph{'s' * (self.hosts_checked != 1)} checked, "
                      f"the last broke the contract"]
        if self.hosts_note:
            detail = [self.hosts_note]
        if self.grade is Grade.WEAK:
            detail.append(f"weak: {self.hosts_checked} distinct host graph{'s' * (self.hosts_checked != 1)} "
                          f"kept the contract, {MIN_HOSTS} needed")
        if self.examples:
            good = sum(e.problem is None for e in self.examples)
            detail.append(f"{good}/{len(self.examples)} examples behaved")
        if self.shapes_kept is not None:
            detail.append("shapes kept" if self.shapes_kept else "shapes changed")
        lines = [f"{head} ({'; '.join(detail)})"]
        for example in self.examples:
            if example.problem is not None:
                lines.append(f"  {example.location}: example ({example.expected}): {example.problem}")
        if self.counterexample is not None:
            lines.append("  counterexample:")
            lines.append(self.counterexample.render())
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"rule": self.rule, "source": self.source, "contract": self.contract, "grade": str(self.grade),
                "hosts_checked": self.hosts_checked, "hosts_discarded": self.hosts_discarded,
                "hosts_discarded_by": {str(reason): count for reason, count in self.hosts_discarded_by},
                "hosts_note": self.hosts_note, "hosts_gap": None if self.hosts_gap is None else str(self.hosts_gap),
                "refusal": self.refusal,
                "shapes_kept": self.shapes_kept,
                "examples": [e.to_json() for e in self.examples],
                "counterexample": None if self.counterexample is None else self.counterexample.to_json()}


@dataclass(frozen=True)
class VerifyReport:
    """The verdicts of a verification run, in rule order."""

    verdicts: tuple[RuleVerdict, ...]
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """Every rule validated."""
        return all(v.ok for v in self.verdicts)

    def counts(self) -> dict[str, int]:
        return {str(grade): sum(v.grade is grade for v in self.verdicts) for grade in GRADES}

    def __getitem__(self, rule: str) -> RuleVerdict:
        for verdict in self.verdicts:
            if verdict.rule == rule:
                return verdict
        raise KeyError(rule)

    def summary(self) -> str:
        counts = {g: n for g, n in self.counts().items() if n}
        parts = ", ".join(f"{n} {g}" for g, n in counts.items()) or "no rules"
        return f"fxrules verify: {len(self.verdicts)} rule{'s' * (len(self.verdicts) != 1)}: {parts} " \
               f"({self.seconds:.1f} s)"

    def __str__(self) -> str:
        return "\n".join([v.render() for v in self.verdicts] + [self.summary()])

    def to_json(self) -> dict:
        return {"version": 1, "ok": self.ok, "counts": self.counts(), "seconds": round(self.seconds, 3),
                "rules": [v.to_json() for v in self.verdicts]}


@dataclass(frozen=True)
class VerifyOptions:
    """How hard to look. ``seed`` None: a fresh random seed (hypothesis' default), else reproducible.
    ``database``: hypothesis' example database (a directory path), ``None`` for none, or the
    string ``"default"`` for hypothesis' own default (``.hypothesis/`` in the working directory)."""

    max_examples: int = 50
    seed: Optional[int] = None
    dtypes: tuple = DEFAULT_DTYPES
    grad: bool = True
    database: Any = "default"
    catalogue: Any = None
    reproduce: Optional[str] = None  # a @reproduce_failure(...) line: replay that one host
    min_hosts: int = MIN_HOSTS  # fewer distinct hosts checked: graded weak (tests of the grading lower it)


# ---------------------------------------------------------------------------
# Comparing outputs by contract
# ---------------------------------------------------------------------------

def _flatten(value: Any) -> list:
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _flatten(item)]
    if isinstance(value, dict):
        return [leaf for key in sorted(value, key=str) for leaf in _flatten(value[key])]
    return [value]


@dataclass
class _Comparison:
    """Outputs compared: the problem found (None: none), the largest differences, and whether shapes held."""

    problem: Optional[str] = None
    max_abs: Optional[float] = None
    max_rel: Optional[float] = None
    shapes_kept: bool = True
    overflowed: bool = False  # kept only by excusing elements where the float64 original overflowed


def _differences(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    if a.numel() == 0 or a.shape != b.shape:
        return 0.0, 0.0
    a64, b64 = a.detach().to(torch.complex128 if a.is_complex() else torch.float64), \
        b.detach().to(torch.complex128 if b.is_complex() else torch.float64)
    both_nan = torch.isnan(a64) & torch.isnan(b64) if not a64.is_complex() else torch.zeros_like(a64, dtype=torch.bool)
    diff = (a64 - b64).abs()
    diff = torch.where(both_nan, torch.zeros_like(diff), diff)
    diff = torch.nan_to_num(diff, nan=float("inf"))
    # where the original is NaN or inf and the rewrite is not, the relative difference is infinite, not NaN
    # (max() would skip a NaN and report 0)
    rel = torch.where(diff == 0, torch.zeros_like(diff), diff / b64.abs().clamp_min(1e-12)).nan_to_num(nan=float("inf"))
    return float(diff.max()), float(rel.max())


def compare(before: Any, after: Any, contract: str, reference: Optional[Any] = None, *,
            noun: str = "output", spread: Optional[Any] = None, inputs_finite: bool = False) -> _Comparison:
    """Outputs ``after`` (rewritten) against ``before`` (original) by ``contract``.

    ``reference``: the original's outputs computed in float64, used by ``approx`` for the
    low-precision dtypes (see the module docstring). ``noun``: what the compared values are,
    for the problem's wording (``"input gradient"`` when comparing gradients). ``spread``: a
    callable giving the original's perturbation spread per output (:func:`_spread`), called only
    when an output fails the cheaper tests. ``inputs_finite``: every input, parameter and buffer
    is finite, so a non-finite float64 original is an overflow (``overflowed`` is then set where
    only such elements differ)."""
    old, new = _flatten(before), _flatten(after)
    out = _Comparison()
    if len(old) != len(new):
        out.shapes_kept = False
        if contract != "changes":
            out.problem = f"the model had {len(old)} {noun}s and has {len(new)} after the rewrite"
        return out
    refs = _flatten(reference) if reference is not None else [None] * len(old)
    spreads: list = []

    def spread_of(index: int) -> Optional[torch.Tensor]:
        if spread is None:
            return None
        if not spreads:
            spreads.append(spread())
        found = spreads[0]
        return found[index] if found is not None and index < len(found) else None

    for index, (a, b, ref) in enumerate(zip(new, old, refs)):
        where = f"{noun} {index}" if len(old) > 1 else f"the {noun}"
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
            if type(a) is not type(b) or a != b:
                out.shapes_kept = out.shapes_kept and type(a) is type(b)
                if contract != "changes":
                    out.problem = out.problem or f"{where} was {b!r} and is {a!r} after the rewrite"
            continue
        if a.shape != b.shape or a.dtype != b.dtype:
            out.shapes_kept = False
            if contract != "changes" and out.problem is None:
                out.problem = (f"{where} changed from {_describe(b)} to {_describe(a)}, so the rewrite does not keep "
                               f"shapes and dtypes")
            continue
        max_abs, max_rel = _differences(a, b)
        out.max_abs = max(out.max_abs or 0.0, max_abs)
        out.max_rel = max(out.max_rel or 0.0, max_rel)
        if contract == "changes" or out.problem is not None:
            continue
        if contract == "exact":
            if not bit_identical(a, b):
                out.problem = f"{where} is not bit-identical after the rewrite"
        else:
            verdict = _judge(a, b, ref, lambda index=index: spread_of(index), inputs_finite)
            if verdict == "overflow":
                out.overflowed = True
            elif verdict != "close":
                out.problem = f"{where} differs beyond the tolerance for {str(a.dtype).replace('torch.', '')}"
    return out


_BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def bit_identical(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``[exact]``'s equality: same shape and dtype, and every element the same bits, except that
    any NaN equals any NaN (payload and sign of a NaN are not compared: torch does not promise
    how they propagate). ``+0.0`` and ``-0.0`` differ. A complex element is compared as its real
    and imaginary parts, each by that rule; integers and bools by value. Strides are not
    compared here (a ``.view`` user in the host catches a rewrite that changes them)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_complex():
        return bit_identical(torch.view_as_real(a.detach().resolve_conj()), torch.view_as_real(b.detach().resolve_conj()))
    if not a.is_floating_point():
        return torch.equal(a, b)
    a, b = a.detach().contiguous(), b.detach().contiguous()
    bits = _BITS[a.element_size()]
    same = (a.view(bits) == b.view(bits)) | (torch.isnan(a) & torch.isnan(b))
    return bool(same.all())


SPREAD_FACTOR = 16
"""How many times the original's perturbation spread (:func:`_spread`) an ``approx`` element may differ by:
the spread measures one unit of input rounding, a recomputation rounds at every step (docs/verify.md)."""

SPREAD_RUNS = 3
"""Perturbed float64 runs of the original per host (each as costly as the float64 reference run)."""


def _close(a: torch.Tensor, b: torch.Tensor, ref: Optional[torch.Tensor], spread: Optional[torch.Tensor] = None) -> bool:
    """``approx``'s test for one tensor: ``a`` (rewritten) against ``b`` (original); ``ref``: the original in
    float64 (low-precision dtypes); ``spread``: the original's perturbation spread (:func:`_spread`)."""
    return _judge(a, b, ref, lambda: spread) == "close"


def _judge(a: torch.Tensor, b: torch.Tensor, ref: Optional[torch.Tensor], spread=lambda: None,
           inputs_finite: bool = False) -> str:
    """``"close"``, ``"far"``, or ``"overflow"`` (close once the elements where the float64 original is
    non-finite from finite inputs are excused: the host is then discarded, not passed). Tests, cheapest
    first: ``assert_close``; the reference budget (4x the original's own error plus 16 units of rounding at
    the output's magnitude); then, per element, plus :data:`SPREAD_FACTOR` x the spread. ``spread()`` is
    called only when needed. A float64 tensor has no higher reference: the original itself is the truth."""
    try:
        torch.testing.assert_close(a, b, equal_nan=True)
        return "close"
    except AssertionError:
        pass
    if not a.is_floating_point() or a.shape != b.shape:
        return "far"
    new, old = a.detach().to(torch.float64), b.detach().to(torch.float64)
    referenced = a.dtype != torch.float64 and ref is not None and ref.shape == a.shape
    # the truth: the float64 reference; a float64 tensor's own original (no higher reference); or, for a
    # low-precision host whose float64 copy cannot run, its own original with no budget but the spread's
    truth = ref.detach().to(torch.float64) if referenced else old
    in_float64 = referenced or a.dtype == torch.float64
    # any NaN equals any NaN (assert_close's equal_nan above): where both models give NaN they agree, and a
    # NaN in the reference (an inf input) must not make the budget NaN, which failed every comparison
    # and where both are non-finite (inf of either sign, or NaN) they agree too: a value computed in another
    # order overflows to +inf, -inf or NaN depending on which partial result overflowed first (a fold scales
    # each product where the original scales the sum); a finite value on one side only is still judged
    agree = (~torch.isfinite(new) & ~torch.isfinite(old)) | (new == old)
    new_error = torch.where(agree, 0.0, (new - truth).abs()).nan_to_num(nan=float("inf"))
    old_error = float(torch.where(agree, 0.0, (old - truth).abs()).nan_to_num(nan=float("inf")).max()) \
        if referenced else 0.0
    # a few units of rounding at the output's magnitude: what recomputing in another order costs
    finite = truth[torch.isfinite(truth)]
    budget = 16 * torch.finfo(a.dtype).eps * float(finite.abs().max()) if finite.numel() and in_float64 else 0.0
    allowed = 4 * old_error + budget
    if float(new_error.max()) <= allowed:
        return "close"
    extra = spread()
    if extra is not None and extra.shape == a.shape:
        # nan spread (a perturbed run gave NaN where the original did not): no evidence either way, none allowed
        extra = extra.detach().to(torch.float64).abs().nan_to_num(nan=0.0)
        limit = allowed + SPREAD_FACTOR * extra
    else:
        limit = torch.full_like(new_error, allowed)
    over = new_error > limit
    if not bool(over.any()):
        return "close"
    if inputs_finite and in_float64 and not bool(torch.isfinite(truth[over]).any()):
        return "overflow"  # every offending element is one the float64 original overflowed at
    return "far"


def _all_finite(module: torch.nn.Module, inputs: tuple) -> bool:
    """Whether every floating (or complex) input, parameter and buffer is finite."""
    tensors = list(inputs) + list(module.parameters()) + list(module.buffers())
    return all(bool(torch.isfinite(t.detach()).all()) for t in tensors
               if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()))


def _perturbed(module: torch.nn.Module, inputs: tuple, generator: torch.Generator, double: bool = True) -> tuple:
    """A copy of ``module`` and ``inputs`` with every floating tensor scaled by ``1 ± eps`` of its own dtype
    (random signs from ``generator``): one unit of rounding of each value. ``double``: in float64 (else each
    tensor keeps its dtype, for hosts whose float64 copy cannot run)."""
    def scale(t: torch.Tensor) -> torch.Tensor:
        eps = torch.finfo(t.dtype).eps
        signs = torch.randint(0, 2, t.shape, generator=generator).to(torch.float64) * 2 - 1
        shaken = t.detach().double() * (1 + eps * signs)
        return shaken if double else shaken.to(t.dtype)

    copied = copy.deepcopy(module)
    with torch.no_grad():
        for tensor in list(copied.parameters()) + list(copied.buffers()):
            if tensor.is_floating_point():
                tensor.data = scale(tensor.data)
    if double:
        copied = copied.double()
    return copied, tuple(scale(t) if t.is_floating_point() else t for t in inputs)


def _spread(module: torch.nn.Module, inputs: tuple, seed: int, center: Any, run, double: bool = True) -> Optional[list]:
    """Per element, the largest ``|perturbed - center|`` over :data:`SPREAD_RUNS` runs of ``run(module,
    inputs)`` on :func:`_perturbed` copies (fixed seeds: deterministic per host); ``center``: the unperturbed
    result (the float64 reference, the float64 original itself, or with ``double=False`` the original in its
    own dtype: a host whose float64 copy cannot run, such as one casting to float32 inside; that spread also
    holds the original's own rounding noise). A list aligned with ``_flatten(center)`` (None for a
    non-tensor leaf); None when the perturbed original cannot run."""
    centers = _flatten(center)
    found: list = [None] * len(centers)
    default = torch.get_default_dtype()
    try:
        if double:
            torch.set_default_dtype(torch.float64)
        for index in range(SPREAD_RUNS):
            generator = torch.Generator().manual_seed(0x5EED + index)
            double_copy, shaken = _perturbed(module, inputs, generator, double)
            with _widened() if double else contextlib.nullcontext():
                leaves = _flatten(run(double_copy, shaken))
            if len(leaves) != len(centers):
                return None
            for position, (leaf, middle) in enumerate(zip(leaves, centers)):
                if not isinstance(leaf, torch.Tensor) or not isinstance(middle, torch.Tensor) \
                        or leaf.shape != middle.shape or not leaf.is_floating_point():
                    continue
                gap = (leaf.detach().double() - middle.detach().double()).abs()
                gap = torch.where(torch.isnan(leaf) & torch.isnan(middle), 0.0, gap)
                found[position] = gap if found[position] is None else torch.maximum(found[position], gap)
    except Exception:  # a refusal of the allocation budget is noted in the rule's watch (budget.py)
        return None
    finally:
        torch.set_default_dtype(default)
    return found


def _describe(t: torch.Tensor) -> str:
    return f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}"


# ---------------------------------------------------------------------------
# Running models
# ---------------------------------------------------------------------------

@contextlib.contextmanager
def draws_independent_of_loaded_modules():
    """Hypothesis' draws made from the seed and the test's outcomes alone, not from which modules this
    process happens to have imported.

    Hypothesis (6.13x and later) mixes into its draws, with a small probability, literals it harvests
    from every *local* module in ``sys.modules`` (an editable install of fxrules counts, and so do the
    user's own modules). Which modules are loaded differs between a ``-j N`` worker and the parent, the
    command line and the Python API, and grows during a run as lazy imports happen: the same ``seed``
    then drew different hosts (``-j 2`` and ``-j 1`` checked and discarded different host counts on 20
    of 24 rules). Within this block the harvested pool is empty, so a fixed seed draws the same hosts in
    any process; hypothesis' own pool of awkward values (its ``GLOBAL_CONSTANTS``) is still used.

    This reaches into hypothesis' provider module (``_get_local_constants``, ``CONSTANTS_CACHE``): there
    is no public switch. ``tests/verifier/test_parallel.py`` pins that the names exist and that a run is
    the same with and without extra local modules loaded; a hypothesis without them harvests nothing,
    and the block does nothing."""
    from hypothesis.internal.conjecture import providers

    harvest = getattr(providers, "_get_local_constants", None)
    cache = getattr(providers, "CONSTANTS_CACHE", None)
    if harvest is None or cache is None:
        yield
        return
    empty = providers.Constants()
    cache.cache.clear()  # cached pools were built from the harvested constants
    providers._get_local_constants = lambda: empty
    try:
        yield
    finally:
        providers._get_local_constants = harvest
        cache.cache.clear()


@contextlib.contextmanager
def seeded(seed: int):
    """Every random state a model run may read (torch's CPU generator, Python's ``random``, numpy's
    global state), set from ``seed`` and restored afterwards: the original and the rewritten
    model draw the same random numbers, and a replayed host runs as it ran."""
    import random

    numpy = _numpy()
    saved_python = random.getstate()
    saved_numpy = numpy.random.get_state() if numpy is not None else None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        random.seed(seed)
        if numpy is not None:
            numpy.random.seed(seed % 2**32)
        try:
            yield
        finally:
            random.setstate(saved_python)
            if numpy is not None:
                numpy.random.set_state(saved_numpy)


def _numpy():
    try:
        import numpy
    except ImportError:  # pragma: no cover - torch's wheels bring numpy
        return None
    return numpy


def _run(module: torch.nn.Module, inputs: tuple, seed: int = 0) -> Any:
    from fxrules.verifier.hosts import fresh

    # torch.fx prints the generated code to stderr when it raises; the verdict says what went wrong.
    # within_budget: measured on fake tensors first (fxrules.engine.budget)
    with within_budget(module, inputs), torch.no_grad(), contextlib.redirect_stderr(io.StringIO()), seeded(seed):
        return module(*[fresh(t) for t in inputs])


def _aliases(module: torch.nn.Module, outputs: Any) -> set:
    """Which outputs share memory with a parameter or buffer of ``module`` or with another output:
    ``("output 0", "parameter w")`` pairs, for the rule that a rewrite adds no aliasing."""
    tensors = [(f"output {i}", o) for i, o in enumerate(_flatten(outputs)) if isinstance(o, torch.Tensor)]
    owned = [(f"parameter {n}", t) for n, t in module.named_parameters()] + \
            [(f"buffer {n}", t) for n, t in module.named_buffers()]
    found = set()
    for index, (name, tensor) in enumerate(tensors):
        if tensor.numel() == 0:
            continue
        where = tensor.untyped_storage().data_ptr()
        for other, value in owned + tensors[index + 1:]:
            if value.numel() and value.untyped_storage().data_ptr() == where:
                found.add((name, other))
    return found


def _low_precision(module: torch.nn.Module, inputs: tuple) -> bool:
    """Whether a floating input, parameter or buffer is below float64 (a host may read its tensors from
    parameters alone, with no input): then ``approx`` compares against a float64 run."""
    tensors = list(inputs) + list(module.parameters()) + list(module.buffers())
    return any(t.is_floating_point() and t.dtype != torch.float64 for t in tensors)


_WIDER = {torch.float32: torch.float64, torch.float16: torch.float64, torch.bfloat16: torch.float64,
          torch.complex64: torch.complex128, torch.complex32: torch.complex128}


def _widened() -> contextlib.AbstractContextManager:
    """A dispatch mode for the float64 runs of the original: every dtype an op is asked for below float64
    (``aten.to.dtype(x, torch.float32)``, a factory's ``dtype=``) is float64 instead, so a host that casts
    explicitly (inductor's spelling of attention, ``softmax(...).to(float32)``) still runs in float64 end to
    end; without it the float64 copy failed at the next op mixing dtypes and the host had no reference."""
    return fxaccess.dtype_mapping_mode(_WIDER)


def _reference(module: torch.nn.Module, inputs: tuple, seed: int = 0) -> Optional[Any]:
    """The original model in float64, for ``approx`` on low-precision dtypes; None when it cannot run so."""
    if not _low_precision(module, inputs):
        return None
    default = torch.get_default_dtype()
    try:
        # float64 by default too: a host that makes floats from integers (`int64 + 0.25`) must make
        # float64 ones here, or the float64 model cannot run (and the reference was silently missing)
        torch.set_default_dtype(torch.float64)
        double = copy.deepcopy(module).double()
        with _widened():
            return _run(double, tuple(t.double() if t.is_floating_point() else t for t in inputs), seed)
    except Exception:
        return None
    finally:
        torch.set_default_dtype(default)


@dataclass(frozen=True)
class _Gradients:
    """Gradients of one run: ``inputs`` (one per floating input, zeros where unused) and ``parameters``
    (name -> gradient, None where the parameter is off the gradient path) for the trainable ones."""

    inputs: tuple
    parameters: dict


def trained_parameters(module: torch.nn.Module) -> tuple:
    """(name, parameter) for the parameters whose gradients the verifier compares: those requiring grad
    in a model in training mode, and none in a model in ``eval()``. The engine's guards draw the same
    line (docs/semantics.md, "Which models train"): an eval-mode model is rewritten for inference, so
    a fold may drop or replace its parameters even where they require grad; in training mode it may not."""
    if not module.training:
        return ()
    return tuple((name, p) for name, p in module.named_parameters() if p.requires_grad)


def _gradients(module: torch.nn.Module, inputs: tuple, seed: int, names: tuple) -> Optional[_Gradients]:
    """Gradients of the sum of the floating outputs w.r.t. the floating inputs and the parameters of
    ``module`` named in ``names`` (None when no output is differentiable or nothing is compared)."""
    from fxrules.verifier.hosts import fresh

    leaves = [fresh(t).requires_grad_(t.is_floating_point() or t.is_complex()) for t in inputs]
    owned = dict(module.named_parameters())
    params = [(name, owned[name]) for name in names if name in owned and owned[name].requires_grad]
    with within_budget(module, inputs), torch.enable_grad(), contextlib.redirect_stderr(io.StringIO()), \
            seeded(seed):
        outputs = [o for o in _flatten(module(*leaves)) if isinstance(o, torch.Tensor) and o.requires_grad]
        wanted = [t for t in leaves if t.requires_grad] + [p for _, p in params]
        if not outputs or not wanted:
            return None
        loss = sum(torch.view_as_real(o).double().sum() if o.is_complex() else o.double().sum() for o in outputs)
        grads = torch.autograd.grad(loss, wanted, allow_unused=True)
    count = sum(t.requires_grad for t in leaves)
    found = [torch.zeros_like(t) if g is None else g for t, g in zip(wanted[:count], grads[:count])]
    return _Gradients(tuple(found), {name: g for (name, _), g in zip(params, grads[count:])})


def _reference_gradients(module: torch.nn.Module, inputs: tuple, seed: int, names: tuple) -> Optional[_Gradients]:
    """The original model's gradients computed in float64, for ``approx`` on low-precision dtypes (the
    same reference as the outputs': a rewrite computing in another order must not be *less* accurate);
    None when not needed or when it cannot run so."""
    if not _low_precision(module, inputs):
        return None
    try:
        double = copy.deepcopy(module).double()
        with _widened():
            return _gradients(double, tuple(t.double() if t.is_floating_point() else t for t in inputs), seed, names)
    except Exception:
        return None


def _gradient_leaves(gradients: Optional[_Gradients], names: tuple) -> Optional[list]:
    """The gradients as one flat list (inputs, then the named parameters), for :func:`_spread`."""
    if gradients is None:
        return None
    return list(gradients.inputs) + [gradients.parameters.get(name) for name in names]


def _compare_gradients(before: _Gradients, after: _Gradients, contract: str,
                       reference: Optional[_Gradients] = None, spread: Optional[Any] = None,
                       inputs_finite: bool = False) -> _Comparison:
    """Input gradients by the contract; then every trainable parameter of the original must still be a
    trainable parameter of the rewritten model, on the gradient path where it was, with its gradient
    kept by the contract (a rule that folds a trainable parameter away breaks training). ``reference``:
    the original's gradients in float64 (``approx`` on low-precision dtypes, as for outputs)."""
    names = tuple(before.parameters)
    spreads: list = []

    def spread_all() -> Optional[list]:
        if spread is None:
            return None
        if not spreads:
            spreads.append(spread())
        return spreads[0]

    def spread_of(position: int):
        found = spread_all()
        return found[position] if found is not None and position < len(found) else None

    count = len(before.inputs)
    outcome = compare(list(before.inputs), list(after.inputs), contract,
                      list(reference.inputs) if reference is not None else None, noun="input gradient",
                      spread=lambda: None if spread_all() is None else spread_all()[:count],
                      inputs_finite=inputs_finite)
    if outcome.problem is not None:
        return outcome
    for name, grad in before.parameters.items():
        if name not in after.parameters:
            return _Comparison(f"the trainable parameter {name} is gone from the rewritten model (or no longer "
                               f"requires grad), so training it stops")
        new = after.parameters[name]
        if (grad is None) != (new is None):
            state = "is no longer" if new is None else "is now"
            return _Comparison(f"the trainable parameter {name} {state} on the gradient path after the rewrite")
        if grad is None:
            continue
        truth = reference.parameters.get(name) if reference is not None else None
        position = count + names.index(name)
        found = compare(grad, new, contract, truth, noun=f"gradient of parameter {name}",
                        spread=lambda position=position: [spread_of(position)], inputs_finite=inputs_finite)
        if found.problem is not None:
            return found
        outcome.overflowed = outcome.overflowed or found.overflowed
    return outcome


class _Discarded(Exception):
    """Raised by :func:`_check_rewrite` when a rewritten host is outside what the verifier can judge."""

    def __init__(self, reason: DiscardReason):
        super().__init__(str(reason))
        self.reason = reason


def _reference64(module: torch.nn.Module, inputs: tuple, seed: int) -> Optional[Any]:
    """The float64 original's own outputs (a float64 host: its run is its own reference)."""
    try:
        return _run(module, inputs, seed)
    except Exception:
        return None


class _Broken(Exception):
    """Raised inside the hypothesis test when a host breaks the contract (hypothesis shrinks it)."""

    def __init__(self, counterexample: Counterexample):
        super().__init__(counterexample.problem)
        self.counterexample = counterexample


_CONTRACT_REFUSALS = frozenset({RefusalCode.SHAPE_CHANGED, RefusalCode.DTYPE_CHANGED, RefusalCode.DEVICE_CHANGED})
"""Guard refusals that say the rule would break its contract on this host: the engine decides them only
with metadata, so applied without example inputs the same rule would change the value's shape, dtype or
device. Not ``layout-changed``: the engine refuses a root a later node reads the strides of in every
mode (with metadata where the strides differ; without, wherever it would replace it by an existing
value: fxrules.engine.guards.layout_unknown), so the model is kept on that host and the host is a
non-application, as a false condition is (hosts without a stride reader still check the rule's values),
provided the engine without metadata refuses it too: a replacement that is a new call is not refused there
(its layout is taken to be the op's), so on such a host the rule is also applied without example inputs
(:func:`_layout_without_metadata`) and that rewrite judged by the contract: ``reshape(reshape(x, a), b) ->
reshape(x, b)`` on a transposed x makes a later ``.view`` raise.
Not the training-mode ones (they depend on the host's mode, and a rule may rely on them), nor
``output-alias-introduced`` (where the root is the host's output an identity rule such as ``x * 1 -> x``
is refused, and applies everywhere else): docs/semantics.md."""


def _apply_one(module: torch.nn.Module, single: RuleSet, name: str, inputs: tuple):
    from fxrules.engine.driver import run_apply

    # with metadata, always: the engine's contract guards decide on it (fxrules.engine.guards)
    result = run_apply(module, single, example_inputs=inputs)
    return result, result.report.counts.get(name, 0)


def _layout_without_metadata(module: torch.nn.Module, single: RuleSet, name: str, inputs: tuple, before: Any,
                             seed: int) -> Optional[str]:
    """The rule applied to ``module`` without example inputs (where the engine cannot compare strides), judged
    as ``[exact]``: what breaks, or None (not applied there, or applied and bit-identical)."""
    from fxrules.engine.driver import run_apply

    try:
        result = run_apply(module, single)
    except FxrulesError:
        return None  # the metadata run is the one judged; it applied nothing and raised nothing
    if not result.report.counts.get(name, 0):
        return None
    try:
        after = _run(result.module, inputs, seed)
    except Exception as exc:
        return f"applied without example inputs, the rewritten model raised {type(exc).__name__}: {exc}"
    outcome = compare(before, after, "exact")
    if outcome.problem is not None:
        return f"applied without example inputs: {outcome.problem}"
    return None


def _check_rewrite(module, inputs, single: RuleSet, rule: CheckedRule, options: VerifyOptions,
                   facts: tuple, code: str, seed: int = 0) -> tuple[int, Optional[Counterexample], Optional[bool]]:
    """Apply the rule to ``module``; (rewrites, counterexample or None, shapes kept). ``seed``: the
    random state both models run from (see :func:`seeded`)."""
    before = _run(module, inputs, seed)
    try:
        result, count = _apply_one(module, single, rule.name, inputs)
    except FxrulesError as exc:
        return 0, Counterexample(f"applying the rule failed: {exc}", facts, None, None, code), None
    if count == 0:
        refused = next((r for r in result.report.rejected if r.rule == rule.name and r.code in _CONTRACT_REFUSALS),
                       None)
        if refused is not None:  # the engine kept the model right, but the rule's conditions admit this host
            return 0, Counterexample(f"the engine refused the rewrite ({refused.code}): {refused.reason}", facts,
                                     None, None, code), None
        layout = next((r for r in result.report.rejected
                       if r.rule == rule.name and r.code is RefusalCode.LAYOUT_CHANGED), None)
        if layout is not None and rule.contract == "exact":
            problem = _layout_without_metadata(module, single, rule.name, inputs, before, seed)
            if problem is not None:
                return 0, Counterexample(f"{problem} (with metadata the engine refuses it: {layout.reason})", facts,
                                         None, None, code), None
        return 0, None, None
    try:
        after = _run(result.module, inputs, seed)
    except Exception as exc:
        return count, Counterexample(f"the rewritten model raised {type(exc).__name__}: {exc}", facts, None, None,
                                     code), False
    approx = rule.contract == "approx"
    reference = _reference(module, inputs, seed) if approx else None
    finite = approx and _all_finite(module, inputs)

    def output_spread():
        low = _low_precision(module, inputs)
        center = reference if reference is not None else before if low else _reference64(module, inputs, seed)
        return None if center is None else _spread(module, inputs, seed, center, lambda m, x: _run(m, x, seed),
                                                   double=reference is not None or not low)

    outcome = compare(before, after, rule.contract, reference, spread=output_spread if approx else None,
                      inputs_finite=finite)
    if outcome.problem is None and rule.contract != "changes":
        added = _aliases(result.module, after) - _aliases(module, before)
        if added:
            output, other = sorted(added)[0]
            outcome = _Comparison(f"{output} shares memory with {other} after the rewrite (it did not before)",
                                  outcome.max_abs, outcome.max_rel)
    if outcome.problem is None and options.grad and rule.contract != "changes" and outcome.shapes_kept:
        names = tuple(name for name, _ in trained_parameters(module))  # none in eval mode: inference
        try:
            grads_before = _gradients(module, inputs, seed, names)
            grads_after = _gradients(result.module, inputs, seed, names)
        except RuntimeError:
            grads_before = grads_after = None
        if grads_before is not None and grads_after is not None:
            reference = _reference_gradients(module, inputs, seed, names) if approx else None

            def gradient_spread(reference=reference):
                center = reference if reference is not None else grads_before
                compared = tuple(grads_before.parameters)  # the order _compare_gradients reads the spread in
                return _spread(module, inputs, seed, _gradient_leaves(center, compared),
                               lambda m, x: _gradient_leaves(_gradients(m, x, seed, names), compared),
                               double=reference is not None or not _low_precision(module, inputs))

            grad_outcome = _compare_gradients(grads_before, grads_after, rule.contract, reference,
                                              spread=gradient_spread if approx else None, inputs_finite=finite)
            if grad_outcome.problem is not None:
                outcome = _Comparison("gradients: " + grad_outcome.problem, grad_outcome.max_abs, grad_outcome.max_rel)
            elif grad_outcome.overflowed:
                outcome.overflowed = True
        elif grads_before is not None:
            outcome = _Comparison("gradients: the rewritten model's outputs no longer require grad")
    if outcome.problem is not None:
        return count, Counterexample(outcome.problem, facts, outcome.max_abs, outcome.max_rel, code), \
            outcome.shapes_kept
    if outcome.overflowed:
        raise _Discarded(DiscardReason.ORIGINAL_OVERFLOWS)
    return count, None, outcome.shapes_kept


def host_fingerprint(code: str, facts: tuple) -> str:
    """What makes two hosts distinct for :data:`MIN_HOSTS`: the graph's code and the facts a
    counterexample prints (dtype, mode, shapes, layouts, fills, modules and their hyperparameters).
    Hosts that differ only in their random values are the same host."""
    return hashlib.sha256("\n".join((code, *facts)).encode()).hexdigest()


# ---------------------------------------------------------------------------
# Host graphs
# ---------------------------------------------------------------------------

@dataclass
class _HostResult:
    """What the hosts drawn for one rule gave: the hosts checked, those discarded (and why), a counterexample."""

    hosts: set = field(default_factory=set)  # fingerprints of the distinct hosts checked (the broken one too)
    discarded: int = 0
    discarded_by: dict = field(default_factory=dict)  # DiscardReason -> count
    note: Optional[HostsNote] = None
    counterexample: Optional[Counterexample] = None
    shapes_kept: set = field(default_factory=set)

    @property
    def checked(self) -> int:
        return len(self.hosts)


def _check_hosts(rule: CheckedRule, rule_set: RuleSet, single: RuleSet, options: VerifyOptions) -> _HostResult:
    from hypothesis import HealthCheck, Phase, given, reject, settings
    from hypothesis import strategies as st
    from hypothesis.errors import DidNotReproduce, Flaky, Unsatisfiable

    from fxrules.verifier.attention_hosts import host_writer
    from fxrules.verifier.hosts import missing_samplers, user_consumers
    from fxrules.engine.program import RuleCompiler
    from fxrules.verifier.samplers import default_catalogue

    catalogue = options.catalogue if options.catalogue is not None else default_catalogue()
    program = RuleCompiler(rule, rule_set).program()
    result = _HostResult()
    consumers = user_consumers(program.conditions, rule.aliases, rule_set.resolver)
    missing = missing_samplers(program.roots, catalogue)
    if missing:
        result.note = HostsNote(HostsGap.NO_SAMPLER, missing=tuple(missing))
        return result

    def test(data):
        with seeded(0):  # module constructors read the global generator before their weights are drawn
            check(data)

    def check(data):
        dtype = data.draw(st.sampled_from(options.dtypes), label="dtype")
        training = data.draw(st.sampled_from([False, False, False, True]), label="training")
        writer = host_writer(program.roots)(data.draw, catalogue, dtype, training)
        writer.consumers = consumers
        host = writer.build(program.roots)
        try:
            _run(host.module, host.inputs, host.seed)
        except Exception:
            reject()  # the drawn host itself does not run (a dtype an op lacks on CPU, ...)
        facts = (f"dtype {str(dtype).replace('torch.', '')}, {'training' if training else 'eval'} mode",
                 *host.lines)
        try:
            count, counterexample, kept = _check_rewrite(host.module, host.inputs, single, rule, options, facts,
                                                         host.module.code, host.seed)
        except _Discarded as exc:
            result.discarded += 1
            result.discarded_by[exc.reason] = result.discarded_by.get(exc.reason, 0) + 1
            reject()
        if counterexample is not None:  # applying the rule may fail before any rewrite: still a broken host
            result.hosts.add(host_fingerprint(host.module.code, facts))
            raise _Broken(counterexample)
        if count == 0:
            result.discarded += 1
            reject()
        result.hosts.add(host_fingerprint(host.module.code, facts))
        if kept is not None:
            result.shapes_kept.add(kept)

    from hypothesis.database import DirectoryBasedExampleDatabase

    database_kw = {}
    if options.database is None:
        database_kw["database"] = None
    elif options.database != "default":
        database_kw["database"] = DirectoryBasedExampleDatabase(str(options.database))
    phases = (Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink)  # no "explain": it reruns hundreds of times
    configured = settings(max_examples=options.max_examples, deadline=None, derandomize=False, phases=phases,
                          suppress_health_check=list(HealthCheck), report_multiple_bugs=False, print_blob=True,
                          **database_kw)
    wrapped = given(st.data())(configured(test))
    wrapped._hypothesis_internal_database_key = database_key(rule)
    if options.seed is not None:
        from hypothesis import seed as hypothesis_seed

        wrapped = hypothesis_seed(options.seed)(wrapped)
    if options.reproduce is not None:
        wrapped._hypothesis_internal_use_reproduce_failure = parse_reproduce(options.reproduce)
    from hypothesis.reporting import with_reporter

    try:
        # the verdict tells what matters; hypothesis' own printout is noise
        with with_reporter(lambda *_: None), draws_independent_of_loaded_modules():
            wrapped()
    except _Broken as exc:
        notes = [n for n in getattr(exc, "__notes__", []) if "reproduce_failure" in n]
        blob = None
        if notes:
            text = notes[-1]
            start = text.find("@reproduce_failure")
            blob = text[start:].split(" as a decorator")[0] if start >= 0 else None
        counterexample = exc.counterexample
        command = None
        if blob is not None:
            path = rule.ast.span.path
            quoted = f'"{blob}"' if not set(blob) & set('"$`\\!') else shlex.quote(blob)
            command = f"fxrules verify {shlex.quote(path)} --rule {shlex.quote(rule.name)} --reproduce {quoted}" \
                + ("" if options.grad else " --no-grad")
        result.counterexample = Counterexample(counterexample.problem, counterexample.facts, counterexample.max_abs,
                                               counterexample.max_rel, counterexample.code, blob, command)
    except DidNotReproduce:
        result.note = HostsNote(HostsGap.DID_NOT_REPRODUCE)
    except Unsatisfiable:
        result.note = HostsNote(HostsGap.NONE_REWRITTEN, declined=result.discarded)
    except Flaky as exc:
        result.note = HostsNote(HostsGap.FLAKY, detail=str(exc).splitlines()[0])
    if result.checked == 0 and result.counterexample is None and result.note is None:
        result.note = HostsNote(HostsGap.NO_HOST_REWRITTEN)
    return result


def database_key(rule: CheckedRule) -> bytes:
    """Where hypothesis' example database keeps this rule's counterexamples (one key per rule)."""
    return hashlib.sha256(f"fxrules-verify:{rule.source}:{rule.name}:{rule.ast.span.location}".encode()).digest()


def parse_reproduce(text: str) -> tuple[str, bytes]:
    """``@reproduce_failure('6.170.17', b'...')`` (or just its arguments) -> (version, blob), without eval."""
    import ast as pyast

    body = text.strip()
    if body.startswith("@"):
        body = body[1:]
    if body.startswith("reproduce_failure"):
        body = body[len("reproduce_failure"):]
    try:
        value = pyast.literal_eval(body)
    except (ValueError, SyntaxError):
        value = None
    if not (isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str)
            and isinstance(value[1], (bytes, str))):
        raise ValueError(f"not a reproduce line: {text!r} (expected @reproduce_failure('VERSION', b'BLOB'))")
    blob = value[1].encode() if isinstance(value[1], str) else value[1]
    return value[0], blob


# ---------------------------------------------------------------------------
# Examples
# ---------------------------------------------------------------------------

def _check_examples(rule: CheckedRule, rule_set: RuleSet, single: RuleSet,
                    options: VerifyOptions) -> tuple[list[ExampleOutcome], Optional[Counterexample], set]:
    from fxrules.verifier.examples import build_example

    outcomes: list[ExampleOutcome] = []
    first_counterexample = None
    kept: set = set()
    for example in rule.ast.examples:
        location = str(example.span)
        try:
            model = build_example(rule, rule_set, example)
            _run(model.module, model.inputs)
        except Exception as exc:
            outcomes.append(ExampleOutcome(location, "build and run", 0,
                                           f"the example model cannot be built or run: {type(exc).__name__}: {exc}",
                                           Grade.ERROR))
            continue
        facts = tuple(f"module {name}: {module!r}" for name, module in model.module.named_children()) + tuple(
            f"input ${spec.name}: {spec.dtype or 'float32'}{list(spec.shape)}" for spec in example.inputs)
        try:
            count, counterexample, shapes = _check_rewrite(model.module, model.inputs, single, rule, options,
                                                           (f"example at {location}",) + facts, model.module.code)
        except _Discarded as exc:  # an example is not drawn: one the verifier cannot judge is an error
            outcomes.append(ExampleOutcome(location, model.expected, 0,
                                           f"the original model overflows from finite inputs ({exc.reason}): the "
                                           f"example cannot be judged", Grade.ERROR))
            continue
        if shapes is not None:
            kept.add(shapes)
        if counterexample is not None:
            first_counterexample = first_counterexample or counterexample
            problem = counterexample.problem
            if not model.accepts(count):
                problem = f"rewritten {count} time{'s' * (count != 1)} (it should {model.expected}), and {problem}"
            outcomes.append(ExampleOutcome(location, model.expected, count, problem, Grade.WRONG))
        elif not model.accepts(count):
            grade = Grade.NOISY if example.count == 0 else Grade.MISSING
            outcomes.append(ExampleOutcome(location, model.expected, count,
                                           f"rewritten {count} time{'s' * (count != 1)}", grade))
        else:
            outcomes.append(ExampleOutcome(location, model.expected, count, None, Grade.VALIDATED))
    return outcomes, first_counterexample, kept


# ---------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------

def verify_rule(rule_set: RuleSet, name: str, options: VerifyOptions = VerifyOptions()) -> RuleVerdict:
    """Verify one rule of ``rule_set`` (host graphs and examples); when a model it would run is over
    the allocation budget (fxrules.verifier.budget), the grade is ``error`` with the refusal's code."""
    with budget_watch() as watched:
        try:
            verdict = _verify_rule_runs(rule_set, name, options)
        except AllocationRefused as refusal:
            return refused_verdict(rule_set[name], watched.refusal or refusal)
    return verdict if watched.refusal is None else refused_verdict(rule_set[name], watched.refusal)


def _verify_rule_runs(rule_set: RuleSet, name: str, options: VerifyOptions) -> RuleVerdict:
    rule = rule_set[name]
    single = rule_set.select(names=[name])
    with warnings.catch_warnings():  # host and example models may use deprecated spellings on purpose
        warnings.simplefilter("ignore")
        hosts = _check_hosts(rule, rule_set, single, options)
        examples, example_counterexample, kept = _check_examples(rule, rule_set, single, options)
    counterexample = hosts.counterexample or example_counterexample
    grade = _grade(examples, counterexample, hosts.checked, options.min_hosts)
    note = hosts.note
    text = None if note is None else note.text(examples_rewrote=any(e.rewrites > 0 for e in examples))
    shapes = hosts.shapes_kept | kept
    shapes_kept = None if rule.contract != "changes" or not shapes else all(shapes)
    return RuleVerdict(rule.name, rule.source, rule.contract, grade, hosts.checked, hosts.discarded, text,
                       tuple(examples), counterexample, shapes_kept, None if note is None else note.gap,
                       hosts_discarded_by=tuple(sorted(hosts.discarded_by.items())))


def verify_examples(rule_set: RuleSet, name: str, options: VerifyOptions = VerifyOptions()) -> list[ExampleOutcome]:
    """Run only the ``example:`` lines of one rule (no host graphs drawn): ``fxrules test``, fast enough to
    run on every save. Each outcome is graded as :func:`verify_rule` grades examples."""
    rule = rule_set[name]
    with warnings.catch_warnings(), entered():  # example models may use deprecated spellings on purpose
        warnings.simplefilter("ignore")
        outcomes, _, _ = _check_examples(rule, rule_set, rule_set.select(names=[name]), options)
    return outcomes


def _grade(examples: list[ExampleOutcome], counterexample: Optional[Counterexample], hosts_checked: int,
           min_hosts: int = MIN_HOSTS) -> Grade:
    """A rule's grade: ``wrong`` with a counterexample, else its worst example's; ``unverified``
    rather than ``validated`` when neither a host nor a positive example checked the contract, and
    ``weak`` when fewer than ``min_hosts`` distinct hosts did (examples or not)."""
    if counterexample is not None:
        return Grade.WRONG
    grade = max((e.grade for e in examples), key=_SEVERITY.__getitem__, default=Grade.VALIDATED)
    positive_checked = any(e.grade is Grade.VALIDATED and e.rewrites > 0 for e in examples)
    if grade.severity < Grade.UNVERIFIED.severity and hosts_checked == 0 and not positive_checked:
        return Grade.UNVERIFIED
    if grade.severity < Grade.WEAK.severity and hosts_checked < min_hosts:
        return Grade.WEAK
    return grade


def verify(rules, *, max_examples: int = 50, seed: Optional[int] = None, grad: bool = True,
           dtypes: Optional[Iterable[torch.dtype]] = None, database: Any = "default", catalogue=None,
           names: Optional[Iterable[str]] = None, allow_imports: Iterable[str] = (), progress=None,
           reproduce: Optional[str] = None, jobs: int = 1) -> VerifyReport:
    """Check that every rule keeps its contract; see the module docstring.

    ``rules``: a RuleSet or rule file path(s). ``max_examples``: host graphs per rule.
    ``seed``: fix hypothesis' seed (reproducible runs). ``grad``: compare gradients too (w.r.t. the
    inputs and the trainable parameters; on by default, ``grad=False`` for forward only).
    ``names``: verify only these rules. ``progress``: called with (done, total, rule name).
    ``reproduce``: a counterexample's ``@reproduce_failure(...)`` line: replay that one host
    (give one rule in ``names``). ``jobs``: verify rules in this many worker processes
    (:mod:`fxrules.verifier.parallel`; the same verdicts, in the same order, for a fixed ``seed``;
    ``progress`` is then called as rules finish, with the rule just finished).
    """
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a positive int, not {jobs!r}")
    from fxrules.lang.load import as_rule_set

    from fxrules.verifier.samplers import default_catalogue

    with entered():
        rule_set = as_rule_set(rules, allow_imports)
    catalogue_given = catalogue
    catalogue = catalogue if catalogue is not None else default_catalogue()  # built once per run
    options = VerifyOptions(max_examples=max_examples, seed=seed, grad=grad,
                            dtypes=tuple(dtypes) if dtypes is not None else DEFAULT_DTYPES, database=database,
                            catalogue=catalogue, reproduce=reproduce)
    if reproduce is not None:
        parse_reproduce(reproduce)  # a malformed line is a ValueError before any work
    selected = list(names) if names is not None else rule_set.names
    for name in selected:
        rule_set[name]  # an unknown name is a KeyError naming it, before any work
    start = time.perf_counter()
    if jobs > 1 and len(selected) > 1:
        from fxrules.verifier.parallel import verify_parallel

        verdicts = verify_parallel(rule_set, selected, replace(options, catalogue=catalogue_given), jobs, progress)
        if progress is not None:
            progress(len(selected), len(selected), None)
        return VerifyReport(tuple(verdicts), time.perf_counter() - start)
    verdicts = []
    for index, name in enumerate(selected):
        if progress is not None:
            progress(index, len(selected), name)
        # An entry per rule, not one for the whole run: a run is long, and a paused collector
        # would hold every garbage cycle of every host graph until its end.
        with entered():
            verdicts.append(verify_rule(rule_set, name, options))
    if progress is not None:
        progress(len(selected), len(selected), None)
    return VerifyReport(tuple(verdicts), time.perf_counter() - start)


# ---------------------------------------------------------------------------
# Coverage
# ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Uncovered:
    """An op named by the patterns of ``rules`` that the catalogue has no sampler for."""

    op: str
    rules: tuple[str, ...]


def coverage(rules, *, catalogue=None, allow_imports: Iterable[str] = ()) -> tuple[Uncovered, ...]:
    """The ops named by the rules' patterns that no sampler covers (hosts cannot be drawn for the
    rules naming them), in first-seen order; empty when coverage is complete. Replacement ops need
    no sampler: only patterns are drawn."""
    from fxrules.engine.program import RuleCompiler
    from fxrules.lang.load import as_rule_set
    from fxrules.verifier.hosts import missing_samplers
    from fxrules.verifier.samplers import default_catalogue

    with entered():
        rule_set = as_rule_set(rules, allow_imports)
        catalogue = catalogue if catalogue is not None else default_catalogue()
        found: dict[str, list[str]] = {}
        for name in rule_set.names:
            program = RuleCompiler(rule_set[name], rule_set).program()
            for op in missing_samplers(program.roots, catalogue):
                found.setdefault(op, []).append(name)
    return tuple(Uncovered(op, tuple(names)) for op, names in found.items())
