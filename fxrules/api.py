"""The Python API: a few functions that chain the stages.

``load_rules``/``parse_rules`` run the front end (no torch needed). ``apply_rules``,
``find_matches`` and ``explain`` call the engine (:mod:`fxrules.engine.driver`), which imports
torch when first used. ``capture`` and ``apply_and_compare`` chain them the way ``fxrules apply``
does (the command line only renders what they return).

``load_rules``, ``parse_rules``, ``apply_rules``, ``find_matches`` and ``explain`` are entry
points: each holds :func:`fxrules.lang.runtime.entered` (the garbage collector paused, the
recursion limit raised) for its duration, and restores both.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional, Union

from fxrules.engine.errors import ComparisonError
from fxrules.lang.config import ConfigLike
from fxrules.lang.load import as_rule_set, load_project, load_sources
from fxrules.lang.names import Resolver
from fxrules.lang.ruleset import RuleSet
from fxrules.lang.runtime import entered
from fxrules.lang.source import Source

PathLike = Union[str, "os.PathLike[str]"]


def load_rules(*paths: PathLike, allow_imports: Iterable[str] = (), config: ConfigLike = None) -> RuleSet:
    """Load and check rule files: each path is a ``.fxr`` file or a directory (all ``*.fxr`` under it, sorted,
    skipping excluded and gitignored folders: :mod:`fxrules.lang.discover`).

    Raises :class:`fxrules.RuleFileError` listing every problem found in every file.
    ``allow_imports`` names packages (beyond torch, operator, math and fxrules) whose
    modules rule files may name as targets, builders or predicates.

    ``config``: the project configuration (:mod:`fxrules.lang.config`). None (the default) finds
    each path's own, ``[tool.fxrules]`` in the nearest pyproject.toml or an fxrules.toml, from the
    path upward, as ``fxrules check`` does; a ``fxrules.Config`` or the path of such a file applies
    that one to every path. Its ``allow-imports`` add to ``allow_imports``; its ``python-path``
    folders are put on ``sys.path``; unknown keys warn (:class:`fxrules.ConfigWarning`); a malformed
    file raises :class:`fxrules.ConfigError`.
    """
    if not paths:
        raise TypeError("load_rules() needs at least one path")
    if len(paths) == 1 and isinstance(paths[0], (list, tuple)):
        paths = tuple(paths[0])
    with entered():
        return load_project(paths, allow_imports, config)


def parse_rules(text: str, source: str = "<string>", *, allow_imports: Iterable[str] = ()) -> RuleSet:
    """Parse and check rules given as text; ``source`` is the name diagnostics use."""
    if not isinstance(text, str):
        raise TypeError(f"parse_rules() takes the rule text as str, not {type(text).__name__}")
    with entered():
        return load_sources([Source(source, text)], Resolver(allow_imports))


def apply_rules(model, rules, *, example_inputs=None, max_iterations=None, tracer=None, concrete_args=None,
                allow_imports: Iterable[str] = (), config: ConfigLike = None, inplace: bool = False):
    """Rewrite ``model`` with ``rules`` to a fixpoint; returns a :class:`fxrules.engine.report.RewriteResult`.

    ``model``: an ``nn.Module`` (traced with ``torch.fx``; pass ``tracer`` or ``concrete_args`` to
    control tracing), a ``torch.fx.GraphModule``, or a ``torch.export.ExportedProgram`` (its
    unlifted module is rewritten). ``rules``: a RuleSet or rule file path(s).
    ``example_inputs``: used to compute shape/dtype metadata when a rule's conditions need it.
    ``max_iterations``: the most rewrites before :class:`fxrules.RewriteLoopError`
    (default 10,000 + 10 per node). ``allow_imports`` and ``config`` are :func:`load_rules`'s, for paths.

    By default the input is never modified: the result is a new module, and on any error
    (RewriteError, RewriteLoopError, ModelError) the input is exactly as it was.

    ``inplace=True`` (a GraphModule only; ModelError otherwise): the GraphModule itself is rewritten
    and recompiled, as torch.fx passes do, and is the result's ``module``: no copy of the graph, no new
    module tree (faster, less memory), modules the rewrite left unused deleted from it; a run that
    rewrites nothing does not recompile (the graph is the one the code was written from). It is still
    all or nothing: every edit is journaled first, and on any error, a KeyboardInterrupt included,
    the journal puts the module back exactly as it was (nodes, names, arguments, metadata, submodules,
    parameters, buffers, code). The report is the one a copying run gives. See docs/api.md.
    """
    with entered():  # before the engine's first import too (fxrules.lang.runtime)
        from fxrules.engine.driver import COPYING, IN_PLACE, run_apply

        destination = IN_PLACE if inplace else COPYING  # chosen once: the engine runs either strategy whole
        return run_apply(model, as_rule_set(rules, allow_imports, config), example_inputs=example_inputs,
                         max_iterations=max_iterations, tracer=tracer, concrete_args=concrete_args,
                         destination=destination)


def find_matches(model, rules, *, example_inputs=None, tracer=None, concrete_args=None,
                 allow_imports: Iterable[str] = (), config: ConfigLike = None):
    """Every match of every rule in ``model``, without rewriting (one pass, graph order)."""
    with entered():
        from fxrules.engine.driver import run_find

        return run_find(model, as_rule_set(rules, allow_imports, config), example_inputs=example_inputs, tracer=tracer,
                        concrete_args=concrete_args)


def explain(model, rules, *, rule=None, example_inputs=None, tracer=None, concrete_args=None,
            allow_imports: Iterable[str] = (), config: ConfigLike = None):
    """Near misses: nodes where a rule's root target matched but the rule did not apply, and why.

    Each :class:`fxrules.engine.report.NearMiss` names the rule, the rule file:line:col of the pattern
    part (or condition) that failed, the node, the reason, and the node's stack trace.
    """
    with entered():
        from fxrules.engine.driver import run_explain

        return run_explain(model, as_rule_set(rules, allow_imports, config), rule=rule, example_inputs=example_inputs,
                           tracer=tracer, concrete_args=concrete_args)


# ---------------------------------------------------------------------------
# Capture, apply and compare: what `fxrules apply` does, as values
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Capture:
    """A model captured as a graph: what to hand to ``apply_rules``/``explain``, and the graph before.

    ``subject`` is the ``torch.export.ExportedProgram`` when exported (the engine unlifts its own
    copy, with the same node names), else ``before`` itself (the engine copies its graph).
    ``before`` is a ``torch.fx.GraphModule`` of the graph before any rewrite: for an export, the
    unlifted module. ``example_inputs`` are the inputs given (None when none were).
    """

    subject: Any
    before: Any
    example_inputs: Optional[tuple]
    exported: bool

    @property
    def nodes(self) -> int:
        """Nodes in the graph before (placeholders and output included)."""
        return len(self.before.graph.nodes)

    @property
    def engine_inputs(self) -> Optional[tuple]:
        """The inputs the engine needs for metadata: none for an export (its nodes carry meta['val'])."""
        return None if self.exported else self.example_inputs


def capture(model, *, example_inputs: Optional[tuple] = None, export: bool = False,
            stack_traces: bool = False) -> Capture:
    """Capture ``model`` (an ``nn.Module``) as a graph: ``torch.fx`` symbolic tracing, or ``torch.export``.

    ``export=True`` runs ``torch.export.export(model, example_inputs)`` (so it needs
    ``example_inputs``); what torch logs while an export fails (pages of graph dumps) is held
    back and dropped, and passed on when it succeeds. ``stack_traces=True`` records where each
    node was created in the model's code (``explain`` shows it; tracing takes about twice as
    long); an export records its own. Raises :class:`fxrules.ModelError` when the model does
    not trace or export, with the first line of torch's message.
    """
    import torch

    inputs = None if example_inputs is None else tuple(example_inputs)
    if export:
        if inputs is None:
            raise ValueError("capture(export=True) needs example_inputs")
        program, module = _export(model, inputs)
        return Capture(program, module, inputs, True)
    from torch import fx

    from fxrules.engine.errors import ModelError

    if not isinstance(model, torch.nn.Module):
        raise ModelError(f"expected an nn.Module, got {type(model).__name__}")
    tracer = fx.Tracer()
    tracer.record_stack_traces = stack_traces
    # The tracer stores the tensor constants it meets on the module it traces: trace a shallow copy
    # (its own attribute dictionary, the same parameters and submodules) so the model is left as it was.
    root = copy.copy(model)
    try:
        graph = tracer.trace(root)
    except Exception as exc:
        raise ModelError(f"{type(model).__name__} does not trace with torch.fx ({type(exc).__name__}: "
                         f"{_first_line(exc)}); try export=True with example_inputs") from exc
    module = fx.GraphModule(root, graph, class_name=type(model).__name__)
    return Capture(module, module, inputs, False)


def _export(model, inputs: tuple) -> tuple[Any, Any]:
    import torch

    from fxrules.engine.errors import ModelError

    with _held_output() as replay:
        try:
            program = torch.export.export(model, inputs)
            module = program.module()
        except Exception as exc:  # what torch logged on the way (pages of graph dumps) is dropped
            raise ModelError(f"torch.export failed: {type(exc).__name__}: {_first_line(exc)}") from exc
        replay.append(True)  # it worked: pass on whatever torch printed
    return program, module


@contextlib.contextmanager
def _held_output() -> Iterator[list]:
    """Hold back what is written to file descriptors 1 and 2 (torch's logging, C++ warnings included).

    Yields a list: append to it to have the output written out at the end; otherwise it is dropped.
    """
    import tempfile

    replay: list = []
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = [(fd, os.dup(fd)) for fd in (1, 2)]
    except (OSError, ValueError, AttributeError):
        yield replay
        return
    files = {fd: tempfile.TemporaryFile() for fd, _ in saved}
    try:
        for fd, _ in saved:
            os.dup2(files[fd].fileno(), fd)
        yield replay
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        for fd, copy in saved:
            os.dup2(copy, fd)
            os.close(copy)
        for fd, handle in files.items():
            if replay:
                handle.seek(0)
                data = handle.read()
                if data:
                    os.write(fd, data)
            handle.close()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@dataclass(frozen=True, slots=True)
class OutputDifference:
    """One output compared, before and after the rewrite.

    ``path`` says where the value sits in what the model returns: ``""`` for a lone tensor,
    ``"[1]"``, ``"['a'][0]"``. ``max_abs_difference`` is the largest absolute difference
    (in float64); ``inf`` when the shapes differ or the two values do not compare equal
    (non-tensors, or structures that differ), ``nan`` when a value is nan.
    """

    path: str
    max_abs_difference: float
    shape_before: Optional[tuple[int, ...]]  # None for a value that is not a tensor
    shape_after: Optional[tuple[int, ...]]

    @property
    def equal(self) -> bool:
        return self.max_abs_difference == 0.0

    @property
    def shape_changed(self) -> bool:
        return self.shape_before != self.shape_after


def compare_outputs(before: Any, after: Any) -> tuple[OutputDifference, ...]:
    """Compare two model outputs leaf by leaf (tensors, lists, tuples, dicts, other values), in order."""
    found: list[OutputDifference] = []
    _compare(before, after, "", found)
    return tuple(found)


def max_abs_difference(differences: Iterable[OutputDifference]) -> float:
    """The largest difference of several (0.0 for none: an empty output is equal to itself)."""
    return max((d.max_abs_difference for d in differences), default=0.0)


def _compare(a: Any, b: Any, path: str, found: list[OutputDifference]) -> None:
    import torch

    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape:
            difference = math.inf
        else:
            difference = float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
        found.append(OutputDifference(path, difference, tuple(a.shape), tuple(b.shape)))
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        for index, (x, y) in enumerate(zip(a, b)):
            _compare(x, y, f"{path}[{index}]", found)
    elif isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        for key in a:
            _compare(a[key], b[key], f"{path}[{key!r}]", found)
    else:
        found.append(OutputDifference(path, 0.0 if _same(a, b) else math.inf, _shape(a), _shape(b)))


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # values that do not compare to a bool (a tensor against a list, ...)
        return False


def _shape(value: Any) -> Optional[tuple[int, ...]]:
    shape = getattr(value, "shape", None)
    return tuple(shape) if shape is not None and not isinstance(value, (list, tuple, dict)) else None


@dataclass(frozen=True, slots=True)
class Timings:
    """Seconds per phase of :func:`apply_and_compare`."""

    capture: float  # tracing or exporting (0.0 when the engine traced the model itself: keep_before=False)
    rewrite: float  # apply_rules (report.seconds is the engine's share of it)
    compare: float  # running the model before and after on the example inputs (0.0 without them)


@dataclass(frozen=True, slots=True)
class ApplyComparison:
    """What :func:`apply_and_compare` found: the rewrite, the code and outputs before and after, timings."""

    result: Any  # a RewriteResult
    before: Any  # the GraphModule of the graph before the rewrite; None with keep_before=False
    example_inputs: Optional[tuple]
    outputs: Optional[tuple[OutputDifference, ...]]  # per output; None without example inputs
    outputs_after: Any  # what the rewritten module returned on the example inputs (None without them)
    exported: bool
    timings: Timings

    @property
    def module(self) -> Any:
        return self.result.module

    @property
    def report(self) -> Any:
        return self.result.report

    @property
    def max_abs_difference(self) -> Optional[float]:
        """The largest difference over every output; None without example inputs."""
        return None if self.outputs is None else max_abs_difference(self.outputs)

    @property
    def equal(self) -> Optional[bool]:
        """Every output identical before and after; None without example inputs."""
        return None if self.outputs is None else all(d.equal for d in self.outputs)

    @property
    def code_before(self) -> Optional[str]:
        """The Python code torch.fx generates for the graph before (None with keep_before=False)."""
        return None if self.before is None else _code(self.before)

    @property
    def code_after(self) -> str:
        return _code(self.result.module)


def _code(module: Any) -> str:
    """A module's generated code without the blank and whitespace-only lines around it and line ends."""
    return "\n".join(line.rstrip() for line in module.code.strip().splitlines()) + "\n"


def apply_and_compare(model, rules, *, example_inputs: Optional[tuple] = None, export: bool = False,
                      keep_before: bool = True, max_iterations: Optional[int] = None,
                      allow_imports: Iterable[str] = (), config: ConfigLike = None,
                      on_phase: Optional[Callable[[str], None]] = None) -> ApplyComparison:
    """Capture ``model``, apply ``rules`` to a fixpoint, and compare the model before and after.

    ``model``: an ``nn.Module``, traced with ``torch.fx`` or, with ``export=True``, exported with
    ``torch.export`` (which needs ``example_inputs``). ``rules``: a RuleSet or rule file path(s).
    With ``example_inputs`` the engine gets shape metadata, and the original model (for an
    export, its unlifted module) and the rewritten one both run on them under ``no_grad``:
    ``outputs`` compares them output by output. ``keep_before=False`` skips building the graph
    before as a GraphModule when nothing needs it (``before`` and ``code_before`` are then None;
    on a 20,000-node graph that saves seconds); an export always keeps it. ``on_phase`` is
    called with a short note as each phase starts (``"tracing"``, ``"rewriting 19 nodes"``,
    ``"comparing outputs"``): for progress displays.

    Raises :class:`fxrules.ModelError` when the model does not trace, export or run on the
    inputs, the errors of :func:`apply_rules` when a rule fails on it, and
    :class:`fxrules.api.ComparisonError` when the rewritten module does not run on inputs the
    original runs on. The model is never modified.
    """
    from fxrules.engine.errors import ModelError

    note = on_phase if on_phase is not None else _quiet
    rule_set = as_rule_set(rules, allow_imports, config)
    inputs = None if example_inputs is None else tuple(example_inputs)
    if export and inputs is None:
        raise ValueError("apply_and_compare(export=True) needs example_inputs")
    note("exporting" if export else "tracing")
    start = time.perf_counter()
    captured = capture(model, example_inputs=inputs, export=export) if export or keep_before else None
    captured_at = time.perf_counter()
    note("rewriting" if captured is None else f"rewriting {captured.nodes} nodes")
    subject = model if captured is None else captured.subject
    result = apply_rules(subject, rule_set, example_inputs=None if export else inputs,
                         max_iterations=max_iterations)
    rewritten_at = time.perf_counter()
    outputs = after = None
    if inputs is not None:
        note("comparing outputs")
        reference_model = captured.before if export else model
        try:
            reference = run_on_copies(reference_model, inputs)
        except Exception as exc:
            raise ModelError(f"the model does not run on the example inputs: {type(exc).__name__}: "
                             f"{_first_line(exc)}") from exc
        try:
            after = run_on_copies(result.module, inputs)
        except Exception as exc:  # the rules broke the model
            raise ComparisonError(f"the rewritten module does not run on the example inputs (the original "
                                  f"does): {type(exc).__name__}: {_first_line(exc)}", result) from exc
        outputs = compare_outputs(reference, after)
    timings = Timings(captured_at - start if captured is not None else 0.0, rewritten_at - captured_at,
                      time.perf_counter() - rewritten_at if inputs is not None else 0.0)
    return ApplyComparison(result, None if captured is None else captured.before, inputs, outputs, after, export,
                           timings)


def run_on_copies(module: Any, inputs: tuple) -> Any:
    """``module(*inputs)`` under no_grad, on a copy of the inputs (:func:`_copied`). A GraphModule that raises
    prints the traceback of its generated code to sys.stderr before the exception leaves it; that print is
    dropped (the exception says it)."""
    import io

    import torch

    held = io.StringIO()
    with torch.no_grad(), contextlib.redirect_stderr(held):
        value = module(*_copied(inputs))
    sys.stderr.write(held.getvalue())  # it ran: whatever it printed is the model's own
    return value


def _copied(inputs: tuple) -> tuple:
    """A deep copy of the example inputs, so that each run sees the values the caller gave: a model that
    writes an input in place (``x.mul_(2)``) otherwise hands the run after it other values, and the
    comparison reports a difference the rules did not make (or hides one). ``copy.deepcopy`` keeps
    strides, dtypes, ``requires_grad`` and which inputs share storage. Inputs it cannot copy (a tensor
    computed with autograd history) are used as given."""
    try:
        return copy.deepcopy(inputs)
    except Exception:
        return inputs


def _quiet(note: str) -> None:
    """The default ``on_phase``: no progress display."""


# ---------------------------------------------------------------------------
# Analysing a rule set as a whole
# ---------------------------------------------------------------------------


def analyze(rules, *, against: Iterable[Any] = (), checks: Optional[Iterable[str]] = None,
            max_examples: int = 50, seed: Optional[int] = 0, loop_cap: Optional[int] = None,
            names: Optional[Iterable[str]] = None, reproduce: Optional[str] = None, catalogue=None, paths: Optional[Iterable[str]] = None,
            allow_imports: Iterable[str] = ()):
    """Analyse a rule set as a whole; returns a :class:`fxrules.lang.analysis.AnalysisReport`.

    Findings (docs/analyze.md), each a :class:`fxrules.lang.analysis.Finding` with a stable
    :class:`~fxrules.lang.analysis.FindingCode`, the rules involved (file:line:col) and a witness
    host graph where one exists: ``shadowed``, ``unsatisfiable`` (decided without torch),
    ``loop`` and ``overlap`` (candidates confirmed on host graphs drawn by hypothesis,
    ``max_examples`` per search, ``seed`` 0 by default so runs repeat), ``dead`` (only with
    ``against``: models, ``(model, example_inputs)`` pairs or
    :class:`fxrules.verifier.analysis.Against` values).

    ``checks``: the finding codes to look for (default: all). ``reproduce`` with ``names`` and one
    check (``loop`` or ``overlap``): replay the witness a finding printed (its
    ``@reproduce_failure`` line); the report's ``reproduced`` says whether it showed the finding again.
    ``paths``: the rule paths a witness's replay command names (default: the paths ``rules`` names,
    else the rules' files).
    """
    from fxrules.lang.analysis import FindingCode
    from fxrules.verifier.analysis import DEFAULT_LOOP_CAP, AnalyzeOptions, analyze_rule_set

    with entered():
        rule_set = as_rule_set(rules, allow_imports)
    wanted = frozenset(FindingCode(c) for c in checks) if checks is not None else frozenset(FindingCode)
    if max_examples < 1:
        raise ValueError("max_examples must be at least 1")
    if paths is None:
        given = [rules] if isinstance(rules, (str, os.PathLike)) else rules if isinstance(rules, (list, tuple)) else ()
        paths = tuple(dict.fromkeys(os.fspath(p) for p in given))
    paths = tuple(paths)
    options = AnalyzeOptions(max_examples=max_examples, seed=seed, checks=wanted,
                             loop_cap=loop_cap if loop_cap is not None else DEFAULT_LOOP_CAP, catalogue=catalogue,
                             reproduce=reproduce, names=None if names is None else tuple(names),
                             paths=paths or tuple(dict.fromkeys(r.ast.span.path for r in rule_set.rules)))
    return analyze_rule_set(rule_set, tuple(_against(item) for item in against), options)


def _against(item: Any):
    """A model to analyse against, as an ``Against``: given as one, as a model, or as (model, example_inputs)."""
    from fxrules.verifier.analysis import Against

    if isinstance(item, Against):
        return item
    if isinstance(item, tuple) and len(item) == 2:
        model, inputs = item
        return Against(model, None if inputs is None else tuple(inputs))
    return Against(item)
