"""Rule-set analysis, the torch part: loops and overlaps confirmed on host graphs, dead rules.

:mod:`fxrules.lang.analysis` decides ``shadowed`` and ``unsatisfiable`` without torch and picks
*candidates*; this module confirms them by running the engine:

``loop``
    for each cycle of rules whose replacements can produce each other's patterns, hypothesis
    draws host graphs (:mod:`fxrules.verifier.hosts`) around the patterns of the cycle's rules and
    applies the whole rule set with a small iteration cap; a host on which ``apply_rules`` raises
    :class:`~fxrules.engine.errors.RewriteLoopError` is the witness (shrunk by hypothesis).
``overlap``
    for each pair of rules whose patterns can match overlapping nodes, hosts are drawn around
    either rule's pattern; a host on which both rules match overlapping nodes is rewritten with
    the pair in both orders, and both results run on the host's inputs. Outputs that differ
    (bit for bit when both rules are ``[exact]``, beyond the ``approx`` tolerance otherwise) make
    the host a witness. Pairs with no witness after ``max_examples`` hosts are not findings; the
    report says how many hosts were tried.
``dead``
    with models to analyse against, a rule that matches nothing in any of them (before or during
    rewriting to a fixpoint) is dead; its near misses (:func:`fxrules.engine.driver.run_explain`)
    say what almost matched.

A witness comes with hypothesis' ``@reproduce_failure`` line and the command that replays it
(``fxrules analyze ... --only loop --rule A --reproduce LINE``).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import shlex
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

import torch

from fxrules.lang.analysis import (
    STATIC_CODES, AnalysisReport, Finding, FindingCode, RuleRef, Search, Witness, finding_sort_key, loop_candidates,
    overlap_candidates, static_findings,
)
from fxrules.lang.diagnostics import FxrulesError
from fxrules.lang.ruleset import CheckedRule, RuleSet
from fxrules.lang.runtime import entered

DEFAULT_LOOP_CAP = 100
"""Rewrites allowed on a host graph before a loop is declared: host graphs have a handful of nodes,
so a rule set that terminates reaches its fixpoint in far fewer."""


@dataclass(frozen=True, slots=True)
class Against:
    """A model to look for ``dead`` rules in: an ``nn.Module``, ``GraphModule`` or ``ExportedProgram``,
    with the example inputs the rules' conditions may need, and a label for reports."""

    model: Any
    example_inputs: Optional[tuple] = None
    label: str = ""

    @property
    def name(self) -> str:
        return self.label or type(self.model).__name__


@dataclass(frozen=True, slots=True)
class AnalyzeOptions:
    """How hard to look. ``max_examples``: hosts drawn per search; ``seed``: hypothesis' seed (the
    default 0 makes runs repeatable; None is a fresh one); ``checks``: the finding codes to look for;
    ``loop_cap``: rewrites before a host counts as looping; ``reproduce`` with ``names``: replay one
    witness (the ``@reproduce_failure`` line; ``checks`` one of loop/overlap, ``names`` its rules)."""

    max_examples: int = 50
    seed: Optional[int] = 0
    checks: frozenset = frozenset(FindingCode)
    loop_cap: int = DEFAULT_LOOP_CAP
    catalogue: Any = None
    reproduce: Optional[str] = None
    names: Optional[tuple[str, ...]] = None
    paths: tuple[str, ...] = ()  # the rule paths, for the replay command


# ---------------------------------------------------------------------------
# Running models
# ---------------------------------------------------------------------------

def _run(module: torch.nn.Module, inputs: tuple) -> Any:
    with torch.no_grad(), contextlib.redirect_stderr(io.StringIO()):
        return module(*[t.clone() for t in inputs])


def _ordered(rule_set: RuleSet, names: Iterable[str]) -> RuleSet:
    """The rules ``names`` of ``rule_set``, in the order given (their priority)."""
    parts = [rule_set.select(names=[name]) for name in names]
    combined = parts[0]
    for part in parts[1:]:
        combined = combined + part
    return combined


# ---------------------------------------------------------------------------
# Host-graph searches (hypothesis draws, shrinks and replays them, as for verify)
# ---------------------------------------------------------------------------

class _Shown(Exception):
    """Raised inside a search when a host shows the finding (hypothesis then shrinks it)."""

    def __init__(self, problem: str, facts: tuple, code: str, rules: tuple):
        super().__init__(problem)
        self.problem, self.facts, self.code, self.rules = problem, facts, code, rules


@dataclass(frozen=True, slots=True)
class _HostVerdict:
    """What one host showed: whether it counts (the rules matched it), and the finding it shows, if any
    (``problem``, and the rules involved)."""

    counts: bool
    problem: Optional[str] = None
    rules: tuple[str, ...] = ()


_NOT_MATCHED = _HostVerdict(False)
"""A host the rules do not match: a valid draw that does not count as tried."""
_NOTHING = _HostVerdict(True)
"""A host the rules match that shows nothing."""


@dataclass
class _Outcome:
    """What verifying one rule of an analysis run found: hosts tried and drawn, and a failure shown."""

    tried: int = 0  # hosts the rules matched (the ones that count)
    drawn: int = 0  # hosts built and run
    shown: Optional[_Shown] = None
    blob: Optional[str] = None
    note: str = ""
    reproduced: Optional[bool] = None


@contextlib.contextmanager
def _quiet_logs():
    """Hold back torch's error logs while hosts are judged: a host a rewrite breaks makes shape
    propagation log a traceback per node (fake tensors), and such a host is only not counted."""
    previous = logging.root.manager.disable
    logging.disable(logging.ERROR)
    try:
        yield
    finally:
        logging.disable(previous)


class _Searcher:
    """Draws hosts around the patterns of some rules and tests a property on each (see the module docstring)."""

    def __init__(self, rule_set: RuleSet, options: AnalyzeOptions):
        from fxrules.engine.program import compile_rules
        from fxrules.verifier.samplers import default_catalogue

        self.rule_set = rule_set
        self.options = options
        self.catalogue = options.catalogue if options.catalogue is not None else default_catalogue()
        self.programs = {p.name: p for p in compile_rules(rule_set).programs}

    def search(self, code: FindingCode, rules: tuple[str, ...], seeds: tuple[str, ...],
               test: Callable[[Any], _HostVerdict]) -> _Outcome:
        """Draw hosts around the patterns of ``seeds`` and judge each with ``test(host)``; ``test`` may
        call ``reject()`` for a host that is no valid draw (a rule fails on it)."""
        from hypothesis import HealthCheck, Phase, given, reject, settings
        from hypothesis import strategies as st
        from hypothesis.errors import DidNotReproduce, Flaky, Unsatisfiable

        from fxrules.verifier.driver import parse_reproduce
        from fxrules.verifier.hosts import HostGraphWriter, missing_samplers

        outcome = _Outcome()
        usable = [name for name in seeds if not missing_samplers(self.programs[name].roots, self.catalogue)]
        if not usable:
            missing = sorted({m for name in seeds for m in missing_samplers(self.programs[name].roots,
                                                                            self.catalogue)})
            outcome.note = f"no sampler for {', '.join(missing)}"
            return outcome
        options = self.options

        def body(data):
            seed = data.draw(st.sampled_from(usable), label="pattern of rule")
            dtype = data.draw(st.sampled_from((torch.float32, torch.float64)), label="dtype")
            host = HostGraphWriter(data.draw, self.catalogue, dtype, False).build(self.programs[seed].roots)
            try:
                _run(host.module, host.inputs)
            except Exception:
                reject()
            facts = (f"host drawn around the pattern of `{seed}`, dtype {str(dtype).replace('torch.', '')}",
                     *host.lines)
            outcome.drawn += 1
            verdict = test(host)
            if not verdict.counts:
                return  # a valid draw that does not count: the search's cost stays max_examples hosts
            outcome.tried += 1
            if verdict.problem is not None:
                raise _Shown(verdict.problem, facts, host.module.code, verdict.rules)

        phases = (Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink)
        configured = settings(max_examples=options.max_examples, deadline=None, phases=phases, database=None,
                              suppress_health_check=list(HealthCheck), report_multiple_bugs=False, print_blob=True)
        wrapped = given(st.data())(configured(body))
        wrapped._hypothesis_internal_database_key = hashlib.sha256(
            f"fxrules-analyze:{code}:{':'.join(rules)}".encode()).digest()
        if options.seed is not None:
            from hypothesis import seed as hypothesis_seed

            wrapped = hypothesis_seed(options.seed)(wrapped)
        if options.reproduce is not None:
            wrapped._hypothesis_internal_use_reproduce_failure = parse_reproduce(options.reproduce)
        from hypothesis.reporting import with_reporter

        try:
            with with_reporter(lambda *_: None), warnings.catch_warnings(), _quiet_logs():
                warnings.simplefilter("ignore")
                wrapped()
            if options.reproduce is not None:
                outcome.reproduced = False
        except _Shown as exc:
            outcome.shown = exc
            notes = [n for n in getattr(exc, "__notes__", []) if "reproduce_failure" in n]
            if notes:
                start = notes[-1].find("@reproduce_failure")
                outcome.blob = notes[-1][start:].split(" as a decorator")[0] if start >= 0 else None
            if options.reproduce is not None:
                outcome.reproduced = True
                outcome.blob = options.reproduce
        except DidNotReproduce:
            outcome.reproduced = False
        except Unsatisfiable:
            outcome.note = "no host could be drawn (every draw was discarded)"
        except Flaky as exc:
            outcome.note = f"flaky: {str(exc).splitlines()[0]}"
        if outcome.tried == 0 and not outcome.note and outcome.shown is None:
            outcome.note = f"none of the {outcome.drawn} hosts drawn was matched by the rules"
        return outcome

    def witness(self, outcome: _Outcome, code: FindingCode, rules: tuple[str, ...]) -> Witness:
        shown = outcome.shown
        command = None
        if outcome.blob is not None:
            blob = outcome.blob
            quoted = f'"{blob}"' if not set(blob) & set('"$`\\!') else shlex.quote(blob)
            paths = " ".join(shlex.quote(p) for p in self.options.paths) or "RULES"
            names = " ".join(f"--rule {shlex.quote(n)}" for n in rules)
            command = f"fxrules analyze {paths} --only {code} {names} --reproduce {quoted}"
        return Witness(shown.problem, shown.facts, shown.code, outcome.tried, outcome.blob, command)


# ---------------------------------------------------------------------------
# Loops
# ---------------------------------------------------------------------------

def _needs_metadata(rule_set: RuleSet) -> bool:
    """Whether a rule's conditions read anything of a node: only then do hosts get shape metadata
    (a propagation per run)."""
    from fxrules.engine.program import compile_rules

    return any(p.needs_metadata or p.conditions for p in compile_rules(rule_set).programs)


def _loop_test(rule_set: RuleSet, cap: int):
    from fxrules.engine.driver import run_apply
    from fxrules.engine.errors import RewriteLoopError

    metadata = _needs_metadata(rule_set)

    def test(host) -> _HostVerdict:
        try:
            run_apply(host.module, rule_set, example_inputs=host.inputs if metadata else None, max_iterations=cap)
        except RewriteLoopError as exc:
            firing = tuple(r.name for r in rule_set.rules if r.name in set(exc.rules))
            return _HostVerdict(True, f"apply_rules did not reach a fixpoint in {cap} rewrites; these kept "
                                      f"firing: {', '.join(firing)}", firing)
        except Exception:  # a rule fails on this host (FxrulesError), or the host cannot be prepared:
            return _NOT_MATCHED  # not a loop, and not a host to judge (a valid draw: the search stays bounded)
        return _NOTHING

    return test


def _loops(searcher: _Searcher, groups: list[tuple[str, ...]]) -> tuple[list[Finding], list[Search]]:
    rule_set = searcher.rule_set
    findings: list[Finding] = []
    searches: list[Search] = []
    seen: set = set()
    test = _loop_test(rule_set, searcher.options.loop_cap)
    for group in groups:
        outcome = searcher.search(FindingCode.LOOP, group, group, test)
        searches.append(Search(FindingCode.LOOP, group, outcome.tried, outcome.shown is not None, outcome.note))
        if outcome.shown is None:
            continue
        firing = outcome.shown.rules or group
        if frozenset(firing) in seen:
            continue
        seen.add(frozenset(firing))
        refs = tuple(RuleRef.of(rule_set[name]) for name in firing)
        findings.append(Finding(
            FindingCode.LOOP,
            _loop_message(firing),
            refs, (f"found among the candidate cycle {' -> '.join(group)}",),
            searcher.witness(outcome, FindingCode.LOOP, group)))
    return findings, searches


def _loop_message(firing: tuple[str, ...]) -> str:
    if len(firing) == 1:
        return f"rule `{firing[0]}` rewrites forever: its replacement makes a node it matches again"
    return (f"rules {', '.join(f'`{n}`' for n in firing)} rewrite forever: each replacement makes a node another "
            f"of them matches")


# ---------------------------------------------------------------------------
# Overlaps
# ---------------------------------------------------------------------------

def _overlap_test(rule_set: RuleSet, first: CheckedRule, second: CheckedRule, cap: int):
    from fxrules.engine.driver import run_apply, run_find
    from fxrules.verifier.driver import compare

    forward = _ordered(rule_set, [first.name, second.name])
    backward = _ordered(rule_set, [second.name, first.name])
    contract = "exact" if first.contract == second.contract == "exact" else "approx"
    metadata = _needs_metadata(forward)

    def test(host) -> _HostVerdict:
        inputs = host.inputs if metadata else None
        try:
            found = run_find(host.module, forward, example_inputs=inputs)
        except Exception:  # a rule fails on this host, or the host cannot be prepared: not a host to judge
            return _NOT_MATCHED
        nodes = {name: set() for name in (first.name, second.name)}
        for match in found:
            if match.rejected is None:
                nodes[match.rule].update(match.nodes)
        if not nodes[first.name] & nodes[second.name]:
            return _NOT_MATCHED  # the two rules do not both match a node here
        try:
            one = run_apply(host.module, forward, example_inputs=inputs, max_iterations=cap)
            other = run_apply(host.module, backward, example_inputs=inputs, max_iterations=cap)
            after_one, after_other = _run(one.module, host.inputs), _run(other.module, host.inputs)
        except Exception:  # a rule fails, the pair loops (a loop finding), or a rewritten host does not run
            return _NOT_MATCHED
        if one.module.code == other.module.code:
            return _NOTHING
        outcome = compare(after_other, after_one, contract)
        if outcome.problem is None:
            return _NOTHING
        difference = "" if outcome.max_abs is None else f" (max |difference| {outcome.max_abs:.3g})"
        return _HostVerdict(True, f"`{first.name}` first and `{second.name}` first give different outputs: "
                            f"{outcome.problem.replace('after the rewrite', 'between the two orders')}{difference}; "
                            f"{first.name} first applied {_counts(one)}, {second.name} first applied "
                            f"{_counts(other)}", (first.name, second.name))

    return test


def _counts(result) -> str:
    counts = result.report.counts
    return ", ".join(f"{name} x{n}" for name, n in counts.items()) or "nothing"


def _overlaps(searcher: _Searcher, pairs: list[tuple[str, str]]) -> tuple[list[Finding], list[Search]]:
    rule_set = searcher.rule_set
    findings: list[Finding] = []
    searches: list[Search] = []
    for first_name, second_name in pairs:
        first, second = rule_set[first_name], rule_set[second_name]
        outcome = searcher.search(FindingCode.OVERLAP, (first_name, second_name), (first_name, second_name),
                                  _overlap_test(rule_set, first, second, searcher.options.loop_cap))
        searches.append(Search(FindingCode.OVERLAP, (first_name, second_name), outcome.tried,
                               outcome.shown is not None, outcome.note))
        if outcome.shown is None:
            continue
        both_exact = first.contract == second.contract == "exact"
        findings.append(Finding(
            FindingCode.OVERLAP,
            f"rules `{first_name}` and `{second_name}` match overlapping nodes and disagree: the result depends "
            f"on their order",
            (RuleRef.of(second), RuleRef.of(first)),
            (f"compared {'bit for bit (both are [exact])' if both_exact else 'within the approx tolerance'}; "
             f"{outcome.tried} host{'s' * (outcome.tried != 1)} tried",),
            searcher.witness(outcome, FindingCode.OVERLAP, (first_name, second_name))))
    return findings, searches


# ---------------------------------------------------------------------------
# Dead rules
# ---------------------------------------------------------------------------

MAX_NEAR_MISSES = 3


def _dead(rule_set: RuleSet, against: tuple[Against, ...], skip: set) -> list[Finding]:
    from fxrules.engine.driver import run_apply, run_explain, run_find

    matched: set = set()
    for target in against:
        for match in run_find(target.model, rule_set, example_inputs=target.example_inputs):
            matched.add(match.rule)
        try:
            result = run_apply(target.model, rule_set, example_inputs=target.example_inputs)
            matched.update(name for name, n in result.report.counts.items() if n)
        except FxrulesError:
            pass  # the rewrite fails on this model: the matches found before it still count
    findings = []
    names = ", ".join(t.name for t in against)
    for rule in rule_set.rules:
        if rule.name in matched or rule.name in skip:
            continue
        notes = []
        for target in against:
            misses = run_explain(target.model, rule_set, rule=rule.name, example_inputs=target.example_inputs)
            for miss in sorted(misses, key=lambda m: -m.depth)[:MAX_NEAR_MISSES]:
                notes.append(f"near miss in {target.name} at %{miss.node}: {miss.reason} ({miss.location})")
        if not notes:
            notes.append("no node of these models has the op its pattern starts with")
        findings.append(Finding(FindingCode.DEAD, f"rule `{rule.name}` matches nothing in {names}",
                                (RuleRef.of(rule),), tuple(notes)))
    return findings


# ---------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------

def analyze_rule_set(rule_set: RuleSet, against: Iterable[Against] = (),
                     options: AnalyzeOptions = AnalyzeOptions()) -> AnalysisReport:
    """Every finding about ``rule_set`` that ``options.checks`` asks for (see the module docstring)."""
    start = time.perf_counter()
    targets = tuple(against)
    checks = frozenset(options.checks)
    if options.reproduce is not None:
        return _reproduce(rule_set, options, start)
    with entered():
        static = [f for f in static_findings(rule_set) if f.code in checks]
        never = {f.rule.name for f in static_findings(rule_set)}
        loops = loop_candidates(rule_set) if FindingCode.LOOP in checks else []
        pairs = overlap_candidates(rule_set, never) if FindingCode.OVERLAP in checks else []
    searcher = _Searcher(rule_set, options) if loops or pairs else None
    findings = list(static)
    searches: list[Search] = []
    for found, searched in ((_loops(searcher, loops) if loops else ([], [])),
                            (_overlaps(searcher, pairs) if pairs else ([], []))):
        findings += found
        searches += searched
    if FindingCode.DEAD in checks and targets:
        with entered(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            findings += _dead(rule_set, targets, never)
    return AnalysisReport(tuple(sorted(findings, key=finding_sort_key)), len(rule_set), tuple(searches),
                          tuple(t.name for t in targets), time.perf_counter() - start)


def _reproduce(rule_set: RuleSet, options: AnalyzeOptions, start: float) -> AnalysisReport:
    """Replay one witness: ``options.checks`` holds loop or overlap, ``options.names`` its rules."""
    from fxrules.verifier.driver import parse_reproduce

    parse_reproduce(options.reproduce)  # a malformed line is a ValueError before any work
    codes = set(options.checks) - set(STATIC_CODES) - {FindingCode.DEAD}
    names = tuple(options.names or ())
    if len(codes) != 1 or not names:
        raise ValueError("reproduce replays one witness: give one check (loop or overlap) and its rules")
    for name in names:
        rule_set[name]  # an unknown name is a KeyError naming it
    code = codes.pop()
    searcher = _Searcher(rule_set, options)
    if code is FindingCode.LOOP:
        found, searches = _loops(searcher, [names])
    else:
        if len(names) != 2:
            raise ValueError("an overlap witness names two rules (the earlier first)")
        found, searches = _overlaps(searcher, [(names[0], names[1])])
    return AnalysisReport(tuple(found), len(rule_set), tuple(searches), (), time.perf_counter() - start,
                          reproduced=bool(found))
