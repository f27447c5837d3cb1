"""Verify your own rules in your own test suite: one pytest test per rule, with readable ids.

    # tests/test_my_rules.py
    import pytest
    from fxrules.testing import assert_rule_verified, rule_cases

    @pytest.mark.parametrize("case", rule_cases("rules/"))
    def test_rule_keeps_its_contract(case):
        assert_rule_verified(case, max_examples=20, seed=0)

Each case's id is the rule's name (``test_rule_keeps_its_contract[fold_conv2d_bn]``), so a
failure names the rule, and ``pytest -k fold_conv2d_bn`` runs one. A failing rule fails
its test with the verdict: grade, broken examples, and the shrunk counterexample with
hypothesis' reproduce line. Rule files are loaded once, when the cases are collected;
a bad rule file fails collection with its diagnostics (file:line:col).

The cases run under pytest-xdist, the standard distributed runner (``pytest -n 4``, or ``-n auto``;
docs/verify.md): each worker collects the same cases, with the same ids, and verifies its share.
``fxrules verify -j N`` does the same without pytest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from fxrules.api import load_rules
from fxrules.lang.ruleset import RuleSet


@dataclass(frozen=True)
class RuleCase:
    """One rule of a loaded rule set; ``str(case)`` is the rule's name (pytest uses it as the id)."""

    rule_set: RuleSet
    name: str

    def __str__(self) -> str:
        return self.name


def rule_cases(*paths: Any, allow_imports: Iterable[str] = ()) -> list:
    """A ``pytest.param`` per rule of the rule files under ``paths`` (id: the rule name).

    Without pytest installed, plain :class:`RuleCase` objects."""
    rule_set = paths[0] if len(paths) == 1 and isinstance(paths[0], RuleSet) else load_rules(
        *paths, allow_imports=allow_imports)
    cases = [RuleCase(rule_set, name) for name in rule_set.names]
    try:
        import pytest
    except ImportError:  # pragma: no cover - the helper is meant for pytest, but works without it
        return cases
    return [pytest.param(case, id=case.name) for case in cases]


def assert_rule_verified(case: RuleCase, **options: Any) -> None:
    """Verify one rule (options as for :func:`fxrules.verify`); raise AssertionError unless validated."""
    from fxrules.verifier.driver import verify

    options.setdefault("database", "default")
    report = verify(case.rule_set, names=[case.name], **options)
    verdict = report.verdicts[0]
    if not verdict.ok:
        raise AssertionError(verdict.render())
