"""Host graphs for conditions over users (issue 19): a rule whose `used_only_by(name, T, ...)` asks for
its root's users gets hosts where a listed op reads the root (a function or method called on it alone)
and hosts where the root is returned as it is, so such rules are verified on hosts, not by their
examples alone, and one whose condition lets an observable user through is found wrong."""

from __future__ import annotations

import pytest
import fxrules
from fxrules.verifier.driver import Grade, VerifyOptions, verify_rule
from fxrules.verifier.hosts import user_consumers

OPTIONS = VerifyOptions(max_examples=40, seed=0, database=None)

SHARED = """
rule shared [{contract}]:
    call_method to($x, $d) as a, call_method to($x, $d) as b
    where [$x.dtype, $d] in [[torch.float32, torch.float64]]
    where used_only_by(a, {users}) and used_only_by(b, {users})
    -> call_method to($x, $d) as c, c
"""


def test_the_users_a_condition_lists_are_read_from_it():
    rules = fxrules.parse_rules(SHARED.format(contract="approx", users='torch.relu, "sigmoid", "output"'), "u.fxr")
    rule = rules.rules[0]
    from fxrules.engine.program import RuleCompiler

    program = RuleCompiler(rule, rules).program()
    import torch

    assert user_consumers(program.conditions, rule.aliases, rules.resolver) == {
        "a": (torch.relu, "sigmoid"), "b": (torch.relu, "sigmoid")}


@pytest.mark.slow
def test_the_library_duplicate_cast_is_validated_on_hosts():
    rules = fxrules.load_rules(fxrules.LIBRARY / "fuse" / "casts.fxr")
    verdict = verify_rule(rules, "duplicate_cast", OPTIONS)
    assert verdict.grade is Grade.VALIDATED and verdict.hosts_checked >= 5, verdict


@pytest.mark.slow
def test_a_users_condition_that_lets_a_view_through_is_found_wrong():
    """transpose returns a view: the two results then share storage, which a drawn write shows."""
    rules = fxrules.parse_rules(SHARED.format(contract="exact", users='torch.relu, "t"'), "wrong.fxr")
    assert verify_rule(rules, "shared", OPTIONS).grade is Grade.WRONG
