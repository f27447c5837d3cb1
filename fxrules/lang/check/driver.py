"""The checker's driver: a file's items in order, each rule through the checkers of its parts.

``use`` lines and ``default [...]`` apply to the rules after them; a rule is checked (its
patterns, then ``...`` forwarding, conditions, replacements, the rule as a whole, its examples)
under the aliases above it; it is kept when it added no error. Every diagnostic goes to one
:class:`fxrules.lang.check.reporter.Reporter`, so they come out in this order.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Iterable, Optional

import fxrules.lang.ast as A
from fxrules.lang.check.conditions import check_conditions
from fxrules.lang.check.examples import check_example
from fxrules.lang.check.identity import is_identity, is_identity_as_written
from fxrules.lang.check import named as N
from fxrules.lang.check.patterns import check_body_pattern, check_patterns
from fxrules.lang.check.replacements import check_forwarded_ellipses, check_replacements
from fxrules.lang.check.reporter import Reporter, did_you_mean
from fxrules.lang.check.scope import Aliases
from fxrules.lang.check.targets import Targets, report_resolution
from fxrules.lang.diagnostics import ERROR, Diagnostic, RuleFileError
from fxrules.lang.names import Resolver, expand, torch_available
from fxrules.lang.ruleset import CheckedRule

DEFAULT_CONTRACT = "approx"
"""A rule's contract when neither it nor a ``default [...]`` line above it names one."""


def check_file(rule_file: A.RuleFile, resolver: Resolver) -> tuple[list[CheckedRule], list[Diagnostic]]:
    """Check one file. Returns the rules without errors and all diagnostics (errors and warnings)."""
    return _check(rule_file, resolver, _Library(resolver, (os.path.realpath(rule_file.path),)))


def _check(rule_file: A.RuleFile, resolver: Resolver, library: "_Library") -> tuple[list[CheckedRule], list[Diagnostic]]:
    reporter = Reporter()
    aliases = _FileAliases(reporter, resolver)
    torch = torch_available()
    targets: Optional[Targets] = None
    checked: list[CheckedRule] = []
    default = DEFAULT_CONTRACT
    named = N.NO_PATTERNS
    for item in rule_file.items:
        if isinstance(item, A.Use):
            aliases.use(item)
        elif isinstance(item, A.UseFile):
            named = library.use(reporter, rule_file.path, item, named)
        elif isinstance(item, A.PatternDef):
            here = aliases.here()
            if targets is None or targets.aliases is not here:
                targets = Targets(reporter, resolver, here, torch)
            named = check_definition(reporter, targets, item, named)
        elif isinstance(item, A.DefaultContract):
            default = contract_word(reporter, item.contract) or default
        elif isinstance(item, A.Example):
            misplaced_example(reporter, item)
        else:
            before = reporter.errors
            contract = contract_word(reporter, item.contract) if item.contract is not None else default
            here = aliases.here()
            if targets is None or targets.aliases is not here:
                targets = Targets(reporter, resolver, here, torch)
            check_rule(reporter, targets, item, contract or default, named)
            if reporter.errors == before:
                name = item.name if item.name is not None else item.span.location
                expanded = N.expand(item.patterns, named) if N.uses_named(item.patterns) else None
                # numbered in file order: a rule set of this file alone need not renumber them
                checked.append(CheckedRule(name, contract or default, item, dict(here.paths), len(checked), expanded))
    return checked, reporter.diagnostics


def check_definition(reporter: Reporter, targets: Targets, definition: A.PatternDef,
                     named: N.NamedPatterns) -> N.NamedPatterns:
    """A named pattern's definition: its body checked as a pattern root over the patterns above it;
    the patterns the rules below see (with it, when it has no error)."""
    before = reporter.errors
    earlier = named.get(definition.name)
    if earlier is not None:
        reporter.error(definition.name_span, "duplicate-pattern",
                       f"a named pattern `{definition.name}` is already defined",
                       notes=[f"first defined at {earlier.definition.span}"])
    attribute_params, getattr_params = N.check_body(reporter, definition)
    check_body_pattern(reporter, targets, definition.body, named)
    if reporter.errors != before or not expansion_fits(reporter, definition.span, (definition.body,), named):
        return named
    body, heads = N.absolute(definition.body, targets.aliases)
    body = N.expand((body,), named, prefix=definition.name + "/")[0]
    return named.with_pattern(N.NamedPattern(definition, body, attribute_params, getattr_params,
                                             N.body_ellipses(body), heads, N.repeated_params(body),
                                             N.expanded_size((body,), N.NO_PATTERNS), N.occurrences(body),
                                             N.rootable(body)))


def expansion_fits(reporter: Reporter, span: A.Span, patterns: tuple, named: N.NamedPatterns) -> bool:
    """Whether ``patterns`` stay within :data:`~fxrules.lang.check.named.MAX_EXPANDED_NODES` once expanded."""
    size = N.expanded_size(patterns, named)
    if size <= N.MAX_EXPANDED_NODES:
        return True
    reporter.error(span, "too-large", f"with its named patterns expanded, this has more than "
                                      f"{N.MAX_EXPANDED_NODES} pattern nodes",
                   notes=["each argument is copied into every place its parameter stands: uses nested in uses "
                          "multiply"])
    return False


@dataclass(slots=True)
class _Library:
    """The files ``use "..."`` lines read while one file is checked: each read and checked once
    (``found``), ``loading`` the chain of files being read (a cycle is an error)."""

    resolver: Resolver
    loading: tuple[str, ...]
    found: dict = field(default_factory=dict)  # real path -> (NamedPatterns, error diagnostics)

    def use(self, reporter: Reporter, using: str, item: A.UseFile, named: N.NamedPatterns) -> N.NamedPatterns:
        """The named patterns after ``use "path"``: ``named`` and those the file defines."""
        path, why = N.used_file(using, item.path)
        if path is None:
            reporter.error(item.span, "bad-use", f"cannot use `{item.path}`: {why}")
            return named
        if path in self.loading:
            reporter.error(item.span, "bad-use", f"`{item.path}` uses this file in turn: a cycle of `use` lines")
            return named
        if len(self.loading) > N.MAX_USE_DEPTH:
            reporter.error(item.span, "bad-use", f"`use` lines nest more than {N.MAX_USE_DEPTH} files deep")
            return named
        if path not in self.found:
            self.found[path] = self.read(path)
        defined, errors = self.found[path]
        if errors:
            reporter.error(item.span, "bad-use", f"`{item.path}` has {len(errors)} error{'s' * (len(errors) != 1)}",
                           notes=[f"{d.path}:{d.line}:{d.column}: {d.code}: {d.message}" for d in errors[:5]])
            return named
        for name, pattern in defined.patterns.items():
            earlier = named.get(name)
            if earlier is not None and earlier is not pattern:
                reporter.error(item.span, "duplicate-pattern",
                               f"`{item.path}` defines `{name}`, a named pattern already defined here",
                               notes=[f"first defined at {earlier.definition.span}"])
                return named
        return N.NamedPatterns({**named.patterns, **defined.patterns})

    def read(self, path: str) -> tuple:
        """The named patterns the file at ``path`` defines, and its errors (its rules are not checked)."""
        from fxrules.lang.parser import parse
        from fxrules.lang.source import read

        try:
            rule_file = parse(read(path))
        except RuleFileError as exc:
            return N.NO_PATTERNS, [d for d in exc.diagnostics if d.severity == ERROR]
        definitions = A.RuleFile(rule_file.path, tuple(i for i in rule_file.items if not isinstance(i, (A.Rule, A.Example))))
        inner = _Library(self.resolver, self.loading + (path,), self.found)
        reporter = Reporter()
        named = N.NO_PATTERNS
        aliases = _FileAliases(reporter, self.resolver)
        torch = torch_available()
        for item in definitions.items:
            if isinstance(item, A.Use):
                aliases.use(item)
            elif isinstance(item, A.UseFile):
                named = inner.use(reporter, rule_file.path, item, named)
            elif isinstance(item, A.PatternDef):
                named = check_definition(reporter, Targets(reporter, self.resolver, aliases.here(), torch), item, named)
        own = N.NamedPatterns({name: pattern for name, pattern in named.patterns.items()
                               if pattern.definition.span.path == rule_file.path})
        return own, [d for d in reporter.diagnostics if d.severity == ERROR]


def check_rule(reporter: Reporter, targets: Targets, rule: A.Rule, contract: str = DEFAULT_CONTRACT,
               named: N.NamedPatterns = N.NO_PATTERNS) -> None:
    """Every check of one rule (of ``contract``), in the order its diagnostics come out."""
    before = reporter.errors
    bindings = check_patterns(reporter, targets, rule.patterns, named)
    expands = N.uses_named(rule.patterns) and reporter.errors == before \
        and expansion_fits(reporter, rule.span, rule.patterns, named)
    check_forwarded_ellipses(reporter, rule.replacements, bindings)
    check_conditions(reporter, targets, bindings, rule.conditions)
    # what the replacement introduces is judged against the pattern as matched: named patterns expanded
    matched = N.expand(rule.patterns, named) if expands else rule.patterns
    check_replacements(reporter, targets, bindings, rule.replacements, patterns=matched, contract=contract)
    if len(rule.patterns) != len(rule.replacements):
        reporter.error(rule.span, "arity-mismatch",
                       f"the pattern has {len(rule.patterns)} root{'s' * (len(rule.patterns) != 1)} but the "
                       f"replacement has {len(rule.replacements)}",
                       notes=["each pattern root is replaced by the replacement at the same position"])
    elif is_identity(rule.patterns, rule.replacements, targets.aliases):
        if is_identity_as_written(rule.patterns, rule.replacements, targets.aliases):
            reporter.error(rule.span, "identity-rewrite", "the replacement is identical to the pattern, so the rule "
                                                          "could only rewrite forever")
        else:
            reporter.error(rule.span, "identity-rewrite",
                           "the replacement is the pattern with a commutative call's two operands exchanged, and "
                           "the pattern matches either order, so the rule could only rewrite forever",
                           notes=["the engine tries a commutative call's operands both ways round"])
    for example in rule.examples:
        check_example(reporter, targets, example)


def contract_word(reporter: Reporter, contract: Optional[A.Contract]) -> Optional[str]:
    """The contract's word when it is one of :data:`fxrules.lang.ast.CONTRACTS`; else reported, None."""
    if contract is None:
        return None
    if contract.word not in A.CONTRACTS:
        reporter.error(contract.span, "bad-contract", f"`{contract.word}` is not a contract",
                       notes=[f"a contract is one of: {', '.join(A.CONTRACTS)}"]
                       + did_you_mean(contract.word, A.CONTRACTS))
        return None
    return contract.word


def misplaced_example(reporter: Reporter, item: A.Example) -> None:
    reporter.error(A.Span(item.span.path, item.span.line, item.span.column, item.span.line,
                          item.span.column + len("example")), "misplaced-example",
                   "an example must follow the rule it illustrates",
                   notes=["write it on the lines after the rule, before the next rule or `use`"])


@dataclass(slots=True)
class _FileAliases:
    """The file's ``use`` lines so far. ``here()`` is them as a frozen value, made again only after a ``use``."""

    reporter: Reporter
    resolver: Resolver
    paths: dict[str, str] = field(default_factory=dict)
    reported: set[str] = field(default_factory=set)  # aliases whose `use` line got an error
    frozen: Optional[Aliases] = None

    def use(self, item: A.Use) -> None:
        if item.alias in self.paths:
            self.reporter.error(item.span, "duplicate-alias", f"`{item.alias}` is already an alias in this file",
                                notes=[f"it stands for `{self.paths[item.alias]}`"])
            return
        path = expand(item.path.parts, self.paths) or item.path.text
        self.paths[item.alias] = path
        self.frozen = None
        resolution = self.resolver.look_up(path)
        if resolution.is_error:
            self.reported.add(item.alias)
            report_resolution(self.reporter, self.resolver, item.path.span, resolution, "unknown-target",
                              self.reported)

    def here(self) -> Aliases:
        if self.frozen is None:
            self.frozen = Aliases(dict(self.paths), frozenset(self.reported))
        return self.frozen


def check_duplicates(rules: Iterable[A.Rule]) -> list[Diagnostic]:
    """``duplicate-rule`` for every named rule whose name an earlier rule of the set already has."""
    first: dict[str, A.Rule] = {}
    diagnostics = []
    for rule in rules:
        if rule.name is None:
            continue
        if rule.name in first:
            diagnostics.append(Diagnostic.at(rule.name_span, "duplicate-rule",
                                             f"a rule named `{rule.name}` is already defined",
                                             notes=[f"first defined at {first[rule.name].span.location}"]))
        else:
            first[rule.name] = rule
    return diagnostics
