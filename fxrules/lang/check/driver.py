"""The checker's driver: a file's items in order, each rule through the checkers of its parts.

``use`` lines and ``default [...]`` apply to the rules after them; a rule is checked (its
patterns, then ``...`` forwarding, conditions, replacements, the rule as a whole, its examples)
under the aliases above it; it is kept when it added no error. Every diagnostic goes to one
:class:`fxrules.lang.check.reporter.Reporter`, so they come out in this order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

import fxrules.lang.ast as A
from fxrules.lang.check.conditions import check_conditions
from fxrules.lang.check.examples import check_example
from fxrules.lang.check.identity import is_identity
from fxrules.lang.check.patterns import check_patterns
from fxrules.lang.check.replacements import check_forwarded_ellipses, check_replacements
from fxrules.lang.check.reporter import Reporter, did_you_mean
from fxrules.lang.check.scope import Aliases
from fxrules.lang.check.targets import Targets, report_resolution
from fxrules.lang.diagnostics import Diagnostic
from fxrules.lang.names import Resolver, expand, torch_available
from fxrules.lang.ruleset import CheckedRule

DEFAULT_CONTRACT = "approx"
"""A rule's contract when neither it nor a ``default [...]`` line above it names one."""


def check_file(rule_file: A.RuleFile, resolver: Resolver) -> tuple[list[CheckedRule], list[Diagnostic]]:
    """Check one file. Returns the rules without errors and all diagnostics (errors and warnings)."""
    reporter = Reporter()
    aliases = _FileAliases(reporter, resolver)
    torch = torch_available()
    targets: Optional[Targets] = None
    checked: list[CheckedRule] = []
    default = DEFAULT_CONTRACT
    for item in rule_file.items:
        if isinstance(item, A.Use):
            aliases.use(item)
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
            check_rule(reporter, targets, item, contract or default)
            if reporter.errors == before:
                name = item.name if item.name is not None else item.span.location
                # numbered in file order: a rule set of this file alone need not renumber them
                checked.append(CheckedRule(name, contract or default, item, dict(here.paths), len(checked)))
    return checked, reporter.diagnostics


def check_rule(reporter: Reporter, targets: Targets, rule: A.Rule, contract: str = DEFAULT_CONTRACT) -> None:
    """Every check of one rule (of ``contract``), in the order its diagnostics come out."""
    bindings = check_patterns(reporter, targets, rule.patterns)
    check_forwarded_ellipses(reporter, rule.replacements, bindings)
    check_conditions(reporter, targets, bindings, rule.conditions)
    check_replacements(reporter, targets, bindings, rule.replacements, patterns=rule.patterns, contract=contract)
    if len(rule.patterns) != len(rule.replacements):
        reporter.error(rule.span, "arity-mismatch",
                       f"the pattern has {len(rule.patterns)} root{'s' * (len(rule.patterns) != 1)} but the "
                       f"replacement has {len(rule.replacements)}",
                       notes=["each pattern root is replaced by the replacement at the same position"])
    elif is_identity(rule.patterns, rule.replacements, targets.aliases):
        reporter.error(rule.span, "identity-rewrite", "the replacement is identical to the pattern, so the rule "
                                                      "could only rewrite forever")
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
        resolution = self.resolver.resolve(path)
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
