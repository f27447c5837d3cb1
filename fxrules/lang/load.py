"""The front end's driver: sources to a checked RuleSet, or every diagnostic found.

source -> parser (with its reductions, text to AST) -> checker, per file; then
duplicate names across the whole set. Syntax errors stop their own file only: the
other files are still checked, so one run reports everything it can.

The stages here change no process-wide state; the API's entry points hold
:func:`fxrules.lang.runtime.entered` around them (the collector paused, the recursion
limit raised).
"""

from __future__ import annotations

import os
from typing import Iterable, Sequence, Union

import fxrules.lang.ast as A
from fxrules.lang.check import check_duplicates, check_file
from fxrules.lang.diagnostics import ERROR, Diagnostic, RuleFileError
from fxrules.lang.names import Resolver
from fxrules.lang.parser import parse
from fxrules.lang.ruleset import CheckedRule, RuleSet
from fxrules.lang.source import Source, expand, read

PathLike = Union[str, "os.PathLike[str]"]


def parse_source(source: Source) -> A.RuleFile:
    """Text to AST (syntax only). Raises RuleFileError with one syntax diagnostic."""
    return parse(source)


def analyze(sources: Iterable[Source], resolver: Resolver) -> tuple[RuleSet, list[Diagnostic]]:
    """Check sources; returns the rules that are free of errors and every diagnostic."""
    diagnostics: list[Diagnostic] = []
    rules: list[CheckedRule] = []
    asts: list[A.Rule] = []
    texts: dict[str, str] = {}
    for source in sources:
        texts[source.path] = source.text
        try:
            rule_file = parse_source(source)
            checked, found = check_file(rule_file, resolver)
        except RuleFileError as exc:
            diagnostics.extend(exc.diagnostics)
            continue
        except RecursionError:  # a backstop: the parser's limits keep nesting well below the stack's
            diagnostics.append(Diagnostic(source.path, 1, 1, "too-deep", "the file nests too deeply to check"))
            continue
        rules.extend(checked)
        asts.extend(rule_file.rules)
        diagnostics.extend(found)
    duplicates = check_duplicates(asts)
    diagnostics.extend(duplicates)
    clashing = {(d.path, d.line, d.column) for d in duplicates}
    if clashing:
        rules = [r for r in rules
                 if (r.ast.name_span.path, r.ast.name_span.line, r.ast.name_span.column) not in clashing]
    warnings = tuple(d for d in diagnostics if d.severity != ERROR)
    return RuleSet._renumbered(rules, texts, warnings, resolver), diagnostics


def load_sources(sources: Iterable[Source], resolver: Resolver) -> RuleSet:
    sources = list(sources)
    rule_set, diagnostics = analyze(sources, resolver)
    errors = [d for d in diagnostics if d.severity == ERROR]
    if errors:
        raise RuleFileError(errors, {s.path: s.text for s in sources})
    return rule_set


def read_sources(paths: Iterable[PathLike]) -> tuple[list[Source], list[Diagnostic]]:
    """Read every file under ``paths``; unreadable files become diagnostics, not exceptions."""
    sources: list[Source] = []
    diagnostics: list[Diagnostic] = []
    try:
        files = expand(paths)
    except RuleFileError as exc:
        return [], list(exc.diagnostics)
    for path in files:
        try:
            sources.append(read(path))
        except RuleFileError as exc:
            diagnostics.extend(exc.diagnostics)
    return sources, diagnostics


def load_paths(paths: Iterable[PathLike], resolver: Resolver) -> RuleSet:
    """Read, parse and check the rule files at ``paths`` (files or directories); raise on any error.

    Every file is checked, even when another one could not be read: the
    :class:`RuleFileError` lists every problem found.
    """
    sources, diagnostics = read_sources(paths)
    rule_set, found = analyze(sources, resolver)
    errors = diagnostics + [d for d in found if d.severity == ERROR]
    if errors:
        raise RuleFileError(errors, {s.path: s.text for s in sources})
    return rule_set


def as_rule_set(rules: Union[RuleSet, PathLike, Sequence[PathLike]], allow_imports: Iterable[str] = ()) -> RuleSet:
    """``rules`` as a RuleSet: itself, or the rule files at a path or a list of paths."""
    if isinstance(rules, RuleSet):
        return rules
    if isinstance(rules, (str, os.PathLike)):
        return load_paths([rules], Resolver(allow_imports))
    if isinstance(rules, (list, tuple)) and rules and all(isinstance(r, (str, os.PathLike)) for r in rules):
        return load_paths(rules, Resolver(allow_imports))
    raise TypeError(f"rules must be a RuleSet or rule file path(s), not {type(rules).__name__}")
