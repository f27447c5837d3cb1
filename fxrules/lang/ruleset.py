"""Checked rules and rule sets: what ``load_rules`` and ``parse_rules`` return."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Iterable, Iterator, Mapping, Optional

import fxrules.lang.ast as A
from fxrules.lang.diagnostics import Diagnostic
from fxrules.lang.names import Resolver


@dataclass(frozen=True, slots=True)
class CheckedRule:
    """A rule that passed the checker, with everything the engine needs to compile it.

    ``aliases`` is the alias table of the rule's file (``use`` lines), so the
    engine resolves names exactly as the checker did.
    """

    name: str
    contract: str  # "exact" | "approx" | "changes"
    ast: A.Rule
    aliases: Mapping[str, str]
    index: int = 0  # position in its rule set: the priority of its matches (lower first)
    expanded: Optional[tuple] = None  # the pattern roots with named patterns expanded (None: it uses none)

    @property
    def pattern_roots(self) -> tuple:
        """The pattern roots the engine compiles: the AST's, with any named pattern expanded."""
        return self.ast.patterns if self.expanded is None else self.expanded

    @property
    def span(self) -> A.Span:
        return self.ast.span

    @property
    def source(self) -> str:
        """``file:line`` of the rule."""
        return self.ast.span.location

    @property
    def description(self) -> Optional[str]:
        return self.ast.description

    @property
    def is_multi_root(self) -> bool:
        return len(self.ast.patterns) > 1

    def __repr__(self) -> str:
        return f"<rule {self.name} [{self.contract}] at {self.source}>"


@dataclass(frozen=True, slots=True, eq=False, weakref_slot=True)
class RuleSet:
    """An ordered, immutable collection of checked rules. Rule order is match priority.

    ``sources`` keeps each file's text so diagnostics and reports can quote it;
    ``warnings`` holds non-fatal diagnostics; ``resolver`` carries the import
    policy the rules were checked under.

    A RuleSet is compared and hashed by identity (``eq=False``) and can be weakly referenced:
    the engine remembers what it compiled from each RuleSet object, for that object's lifetime
    (:func:`fxrules.engine.program.compile_rules`), without storing anything in it.
    """

    rules: tuple[CheckedRule, ...]
    sources: Mapping[str, str] = field(default_factory=dict)
    warnings: tuple[Diagnostic, ...] = ()
    resolver: Resolver = field(default_factory=Resolver, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sources", MappingProxyType(dict(self.sources)))

    def __reduce__(self):
        """Pickled by its fields (``sources`` as a dict): ``verify(jobs=N)`` sends rule sets to worker processes."""
        return (RuleSet, (self.rules, dict(self.sources), self.warnings, self.resolver))

    @property
    def names(self) -> list[str]:
        return [rule.name for rule in self.rules]

    def __len__(self) -> int:
        return len(self.rules)

    def __iter__(self) -> Iterator[CheckedRule]:
        return iter(self.rules)

    def __contains__(self, name: object) -> bool:
        return any(rule.name == name for rule in self.rules)

    def __getitem__(self, name: str) -> CheckedRule:
        for rule in self.rules:
            if rule.name == name:
                return rule
        raise KeyError(f"no rule named {name!r}; the rule set has: {', '.join(self.names) or 'no rules'}")

    def select(self, *, names: Optional[Iterable[str]] = None,
               contracts: Optional[Iterable[str]] = None) -> "RuleSet":
        """A new RuleSet with the rules whose name is in ``names`` and contract in ``contracts``."""
        wanted_names = None if names is None else set(names)
        if wanted_names is not None:
            unknown = wanted_names - set(self.names)
            if unknown:
                raise KeyError(f"no rule named {', '.join(sorted(map(repr, unknown)))}")
        wanted_contracts = None if contracts is None else set(contracts)
        if wanted_contracts is not None:
            bad = wanted_contracts - set(A.CONTRACTS)
            if bad:
                raise ValueError(f"unknown contract {', '.join(sorted(bad))}; expected {', '.join(A.CONTRACTS)}")
        kept = [
            rule for rule in self.rules
            if (wanted_names is None or rule.name in wanted_names)
            and (wanted_contracts is None or rule.contract in wanted_contracts)
        ]
        return self._renumbered(kept, self.sources, self.warnings, self.resolver)

    def __add__(self, other: "RuleSet") -> "RuleSet":
        if not isinstance(other, RuleSet):
            return NotImplemented
        clash = set(self.names) & set(other.names)
        if clash:
            from fxrules.lang.diagnostics import RuleFileError

            diags = [Diagnostic.at(other[name].ast.name_span, "duplicate-rule",
                                   f"rule `{name}` is already defined", notes=[f"first defined at {self[name].source}"])
                     for name in sorted(clash)]
            raise RuleFileError(diags, {**self.sources, **other.sources})
        resolver = self.resolver
        if other.resolver.allow_imports - resolver.allow_imports:
            resolver = Resolver(resolver.allow_imports | other.resolver.allow_imports)
        return self._renumbered(list(self.rules) + list(other.rules), {**self.sources, **other.sources},
                                self.warnings + other.warnings, resolver)

    @staticmethod
    def _renumbered(rules, sources, warnings, resolver) -> "RuleSet":
        """A rule set of ``rules`` with each rule's index its position (a rule already there is kept as it is)."""
        from dataclasses import replace

        return RuleSet(tuple(rule if rule.index == i else replace(rule, index=i) for i, rule in enumerate(rules)),
                       sources, warnings, resolver)

    def __repr__(self) -> str:
        return f"<RuleSet of {len(self.rules)} rules: {', '.join(self.names[:8])}{', ...' if len(self) > 8 else ''}>"
