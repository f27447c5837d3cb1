"""The Python API: a few functions that chain the stages.

``load_rules``/``parse_rules`` run the front end (no torch needed). The engine
functions are added by the engine modules and import torch when called.

Each function is an entry point: it holds :func:`fxrules.lang.runtime.entered` (the
garbage collector paused, the recursion limit raised) for its duration, and restores both.
"""

from __future__ import annotations

import os
from typing import Iterable, Union

from fxrules.lang.load import as_rule_set, load_paths, load_sources
from fxrules.lang.names import Resolver
from fxrules.lang.ruleset import RuleSet
from fxrules.lang.runtime import entered
from fxrules.lang.source import Source

PathLike = Union[str, "os.PathLike[str]"]


def load_rules(*paths: PathLike, allow_imports: Iterable[str] = ()) -> RuleSet:
    """Load and check rule files: each path is a ``.fxr`` file or a directory (all ``*.fxr`` under it, sorted).

    Raises :class:`fxrules.RuleFileError` listing every problem found in every file.
    ``allow_imports`` names packages (beyond torch, operator, math and fxrules) whose
    modules rule files may name as targets, builders or predicates.
    """
    if not paths:
        raise TypeError("load_rules() needs at least one path")
    if len(paths) == 1 and isinstance(paths[0], (list, tuple)):
        paths = tuple(paths[0])
    with entered():
        return load_paths(paths, Resolver(allow_imports))


def parse_rules(text: str, source: str = "<string>", *, allow_imports: Iterable[str] = ()) -> RuleSet:
    """Parse and check rules given as text; ``source`` is the name diagnostics use."""
    if not isinstance(text, str):
        raise TypeError(f"parse_rules() takes the rule text as str, not {type(text).__name__}")
    with entered():
        return load_sources([Source(source, text)], Resolver(allow_imports))


def apply_rules(model, rules, *, example_inputs=None, max_iterations=None, tracer=None, concrete_args=None,
                allow_imports: Iterable[str] = ()):
    """Rewrite ``model`` with ``rules`` to a fixpoint; returns a :class:`fxrules.engine.report.RewriteResult`.

    ``model``: an ``nn.Module`` (traced with ``torch.fx``; pass ``tracer`` or ``concrete_args`` to
    control tracing), a ``torch.fx.GraphModule``, or a ``torch.export.ExportedProgram`` (its
    unlifted module is rewritten). ``rules``: a RuleSet or rule file path(s).
    ``example_inputs``: used to compute shape/dtype metadata when a rule's conditions need it.
    ``max_iterations``: the most rewrites before :class:`fxrules.RewriteLoopError`
    (default 10,000 + 10 per node).

    The input is never modified; on any error (RewriteError, RewriteLoopError, ModelError)
    it is exactly as it was.
    """
    from fxrules.engine.driver import run_apply

    with entered():
        return run_apply(model, as_rule_set(rules, allow_imports), example_inputs=example_inputs,
                         max_iterations=max_iterations, tracer=tracer, concrete_args=concrete_args)


def find_matches(model, rules, *, example_inputs=None, tracer=None, concrete_args=None,
                 allow_imports: Iterable[str] = ()):
    """Every match of every rule in ``model``, without rewriting (one pass, graph order)."""
    from fxrules.engine.driver import run_find

    with entered():
        return run_find(model, as_rule_set(rules, allow_imports), example_inputs=example_inputs, tracer=tracer,
                        concrete_args=concrete_args)


def explain(model, rules, *, rule=None, example_inputs=None, tracer=None, concrete_args=None,
            allow_imports: Iterable[str] = ()):
    """Near misses: nodes where a rule's root target matched but the rule did not apply, and why.

    Each :class:`fxrules.engine.report.NearMiss` names the rule, the rule file:line:col of the pattern
    part (or condition) that failed, the node, the reason, and the node's stack trace.
    """
    from fxrules.engine.driver import run_explain

    with entered():
        return run_explain(model, as_rule_set(rules, allow_imports), rule=rule, example_inputs=example_inputs,
                           tracer=tracer, concrete_args=concrete_args)
