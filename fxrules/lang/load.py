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
import re
import threading
import warnings
from collections import OrderedDict
from dataclasses import replace
from typing import Iterable, Mapping, Optional, Sequence, Union

import fxrules.lang.ast as A
from fxrules.lang.check import check_duplicates, check_file
from fxrules.lang.check.reporter import closest
from fxrules.lang.config import Config, ConfigLike, configs_for, merged_allow_imports
from fxrules.lang.diagnostics import ERROR, Diagnostic, RuleFileError
from fxrules.lang.names import Resolver
from fxrules.lang.parser import parse
from fxrules.lang.ruleset import CheckedRule, RuleSet
from fxrules.lang.discover import IgnoreRules, collect
from fxrules.lang.source import Source, read

PathLike = Union[str, "os.PathLike[str]"]


def parse_source(source: Source) -> A.RuleFile:
    """Text to AST (syntax only). Raises RuleFileError with one syntax diagnostic."""
    return parse(source)


RECOVERABLE = frozenset({"unexpected-token", "unexpected-end", "invalid-character", "unterminated-string"})
"""Syntax errors after which the rest of the file is still worth checking."""

MAX_SYNTAX_ERRORS = 20


def parse_recovering(source: Source) -> tuple[Optional[A.RuleFile], list[Diagnostic]]:
    """Text to AST, going on past syntax errors: each is reported, the top-level statement holding it
    (from its unindented first line to the next unindented line) is blanked, keeping every line where it
    was, and the text is parsed again; so a typo in one rule does not hide the errors of the others.

    Returns the AST of what parsed (None when nothing did) and the syntax diagnostics, at most
    :data:`MAX_SYNTAX_ERRORS`. Errors about the file as a whole (too deep, too large) stop at the first.
    """
    diagnostics: list[Diagnostic] = []
    text = source.text
    while True:
        try:
            return parse(Source(source.path, text)), diagnostics
        except RuleFileError as exc:
            found = [_with_opcode_hint(d, text) for d in exc.diagnostics]
            diagnostics.extend(found)
            if len(diagnostics) >= MAX_SYNTAX_ERRORS or any(d.code not in RECOVERABLE for d in found):
                return None, diagnostics
            blanked = _blank_statement(text, found[0].line)
            if blanked == text:
                return None, diagnostics
            text = blanked


def _blank_statement(text: str, line: int) -> str:
    """``text`` with the top-level statement holding ``line`` (1-based) replaced by empty lines."""
    lines = text.split("\n")
    index = min(max(line, 1), len(lines)) - 1
    start = index
    while start > 0 and not _starts_statement(lines[start]):
        start -= 1
    end = index + 1
    while end < len(lines) and not _starts_statement(lines[end]):
        end += 1
    return "\n".join(lines[:start] + [""] * (end - start) + lines[end:])


def _starts_statement(line: str) -> bool:
    return bool(line.strip()) and not line[0].isspace() and not line.startswith("#")


def _with_opcode_hint(diagnostic: Diagnostic, text: str) -> Diagnostic:
    """A syntax error right after a misspelt opcode (``call_methd relu($x)``) gets "did you mean"."""
    if diagnostic.code != "unexpected-token" or diagnostic.line < 1:
        return diagnostic
    lines = text.split("\n")
    if diagnostic.line > len(lines):
        return diagnostic
    before = re.search(r"([A-Za-z_][A-Za-z_0-9]*)\s*$", lines[diagnostic.line - 1][: diagnostic.column - 1])
    if before is None or before[1] in A.OPCODES:
        return diagnostic
    close = closest(before[1], A.OPCODES)
    if close is None:
        return diagnostic
    return replace(diagnostic, notes=(*diagnostic.notes, f"`{before[1]}` is not an opcode: did you mean `{close}`?"))


def analyze(sources: Iterable[Source], resolver: Resolver) -> tuple[RuleSet, list[Diagnostic]]:
    """Check sources; returns the rules that are free of errors and every diagnostic."""
    diagnostics: list[Diagnostic] = []
    rules: list[CheckedRule] = []
    asts: list[A.Rule] = []
    texts: dict[str, str] = {}
    for source in sources:
        texts[source.path] = source.text
        try:
            rule_file, syntax = parse_recovering(source)
            diagnostics.extend(syntax)
            if rule_file is None:
                continue
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
    """The checked RuleSet of ``sources``; raises :class:`RuleFileError` listing every error. Sources
    checked before under the same policy give the same RuleSet again (:data:`CHECKED`)."""
    return _checked(list(sources), resolver, [])


class CheckedRuleSets:
    """The rule sets this process checked, by what they were checked from: the sources (each file's
    path and text, in order) and the import policy. ``apply_rules(model, "rules.fxr")`` in a loop then
    reads the file each call, and parses, checks and compiles it only when its text changed: the
    engine's compiled matcher is kept per RuleSet object (:func:`fxrules.engine.program.compile_rules`),
    so it is reused with it. Parsing, checking and compiling 50 rules costs a quarter of what rewriting
    a 2,000-node graph with them does, and 500 rules more than the rewrite.

    The key is the text itself, not a modification time: an edit is seen whatever the clock or the
    file system's time resolution. Only rule sets that name nothing outside torch, operator, math,
    builtins and fxrules are kept (an import policy without user packages): a user's builder or
    predicate module can be reloaded (``importlib.reload``) while its name stays, and a kept rule set
    would go on calling the old function. Failed checks are not kept, nor rule sets of more than
    :attr:`MAX_TEXT` characters. At most :attr:`SIZE` rule sets, the least recently used dropped
    first. Safe to share between threads. :meth:`clear` forgets all."""

    SIZE = 32
    MAX_TEXT = 4 * 1024 * 1024
    """Rule sets checked from more text than this (in characters, all files together; the bundled
    library is about 130,000) are not kept: what is kept stays alive, and a process checking large
    untrusted files would otherwise hold 32 of them."""

    def __init__(self) -> None:
        self._kept: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def key(self, sources: Sequence[Source], resolver: Resolver) -> Optional[tuple]:
        """What a rule set is kept under, or None when it is not kept (user packages allowed, or
        more than :attr:`MAX_TEXT` of text)."""
        if resolver.packages or sum(len(source.text) for source in sources) > self.MAX_TEXT:
            return None
        return tuple(sources), resolver.allow_imports

    def get(self, key: tuple) -> Optional[RuleSet]:
        with self._lock:
            found = self._kept.get(key)
            if found is not None:
                self._kept.move_to_end(key)
            return found

    def put(self, key: tuple, rule_set: RuleSet) -> None:
        with self._lock:
            self._kept[key] = rule_set
            self._kept.move_to_end(key)
            while len(self._kept) > self.SIZE:
                self._kept.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()

    def __len__(self) -> int:
        return len(self._kept)


CHECKED = CheckedRuleSets()
"""The process's :class:`CheckedRuleSets`, used by :func:`load_sources` and :func:`load_paths` (so by
``load_rules``, ``parse_rules`` and ``apply_rules`` given paths)."""


def _checked(sources: list[Source], resolver: Resolver, found: list[Diagnostic]) -> RuleSet:
    """The RuleSet of ``sources`` (kept ones reused), or RuleFileError with ``found`` (problems met
    before checking: unreadable files) and every error the check finds."""
    key = CHECKED.key(sources, resolver) if not found else None
    if key is not None:
        kept = CHECKED.get(key)
        if kept is not None:
            return kept
    rule_set, diagnostics = analyze(sources, resolver)
    errors = found + [d for d in diagnostics if d.severity == ERROR]
    if errors:
        raise RuleFileError(errors, {s.path: s.text for s in sources})
    if key is not None:
        CHECKED.put(key, rule_set)
    return rule_set


class ConfigWarning(UserWarning):
    """A project configuration with something fxrules does not understand (an unknown key)."""


def read_sources(paths: Iterable[PathLike], configs: Optional[Mapping[str, Config]] = None,
                 exclude: Optional[IgnoreRules] = None) -> tuple[list[Source], list[Diagnostic]]:
    """Read every rule file ``paths`` name (:mod:`fxrules.lang.discover`: excludes and .gitignore
    apply to directories walked); unreadable files become diagnostics, not exceptions.

    ``configs`` maps each path to its project's settings; by default each path's is discovered.
    ``exclude``: more patterns to skip while walking (``--exclude``).
    """
    paths = [os.fspath(p) for p in paths]
    files, diagnostics = collect(paths, configs if configs is not None else configs_for(paths), exclude)
    sources: list[Source] = []
    for path in files:
        try:
            sources.append(read(path))
        except RuleFileError as exc:
            diagnostics.extend(exc.diagnostics)
    return sources, diagnostics


def project(paths: Iterable[PathLike], allow_imports: Iterable[str] = (), config: ConfigLike = None
            ) -> tuple[dict[str, Config], Resolver]:
    """The settings of each path (``config`` for all, or each discovered) and the resolver they call for.

    Each configuration's unknown keys are a :class:`ConfigWarning`, and its ``python-path`` folders are
    put on ``sys.path`` (builders and models of the project import from there).
    """
    configs = configs_for(paths, config)
    distinct = list({id(c): c for c in configs.values()}.values())
    for found in distinct:
        for message in found.warnings:
            warnings.warn(message, ConfigWarning, stacklevel=3)
        found.put_on_sys_path()
    return configs, Resolver(merged_allow_imports(distinct, allow_imports))


def load_paths(paths: Iterable[PathLike], resolver: Resolver, configs: Optional[Mapping[str, Config]] = None,
               exclude: Optional[IgnoreRules] = None) -> RuleSet:
    """Read, parse and check the rule files at ``paths`` (files or directories); raise on any error.

    Every file is checked, even when another one could not be read: the
    :class:`RuleFileError` lists every problem found. Files read with the same text as before, under
    the same policy, give the RuleSet checked then (:data:`CHECKED`).
    """
    sources, diagnostics = read_sources(paths, configs, exclude)
    return _checked(sources, resolver, diagnostics)


def load_project(paths: Iterable[PathLike], allow_imports: Iterable[str] = (), config: ConfigLike = None
                 ) -> RuleSet:
    """:func:`load_paths` under the projects' settings (:func:`project`)."""
    paths = [os.fspath(p) for p in paths]
    configs, resolver = project(paths, allow_imports, config)
    return load_paths(paths, resolver, configs)


def as_rule_set(rules: Union[RuleSet, PathLike, Sequence[PathLike]], allow_imports: Iterable[str] = (),
                config: ConfigLike = None) -> RuleSet:
    """``rules`` as a RuleSet: itself, or the rule files at a path or a list of paths (with their
    projects' settings, or ``config``'s)."""
    if isinstance(rules, RuleSet):
        return rules
    if isinstance(rules, (str, os.PathLike)):
        return load_project([rules], allow_imports, config)
    if isinstance(rules, (list, tuple)) and rules and all(isinstance(r, (str, os.PathLike)) for r in rules):
        return load_project(rules, allow_imports, config)
    raise TypeError(f"rules must be a RuleSet or rule file path(s), not {type(rules).__name__}")
