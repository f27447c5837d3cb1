"""Host graphs for variadic captures (fxrules.verifier.variadic_hosts, issue 19).

`x.permute(*$dims)`, `x.view($a, *$rest)`: the sequence is drawn whole by its kind and the capture
binds the rest, so such rules are verified on hosts; where no sampler draws the sequence (a list
of tensors of any length), the verifier says so.
"""

from __future__ import annotations

import pytest
import fxrules
from fxrules.engine.program import compile_rules
from fxrules.verifier.driver import Grade, VerifyOptions, verify_rule
from fxrules.verifier.hosts import missing_samplers
from fxrules.verifier.samplers import default_catalogue

OPTIONS = VerifyOptions(max_examples=40, seed=0, database=None)


def roots(text: str):
    rules = fxrules.parse_rules(text, source="variadic.fxr")
    [program] = compile_rules(rules).programs
    return program.roots


def test_a_variadic_capture_of_a_drawn_sequence_has_a_sampler_and_others_do_not():
    catalogue = default_catalogue()
    assert missing_samplers(roots("rule r [changes]: call_method permute($x, *$dims) -> $x"), catalogue) == []
    assert missing_samplers(roots("rule r [changes]: call_method view($x, $a, *$rest) -> $x"), catalogue) == []
    [missing] = missing_samplers(roots("rule r [changes]: call_function torch.cat([$a, *$rest], 0) -> $a"), catalogue)
    assert missing.startswith("*$rest")


@pytest.mark.slow
def test_the_library_permute_identity_is_validated_on_hosts():
    rules = fxrules.load_rules(fxrules.LIBRARY / "fuse" / "permute.fxr")
    verdict = verify_rule(rules, "permute_identity", OPTIONS)
    assert verdict.grade is Grade.VALIDATED and verdict.hosts_checked >= 5, verdict


@pytest.mark.slow
def test_a_wrong_variadic_rule_is_found_wrong():
    """Hosts draw every permutation: a rule calling any permutation the identity is caught."""
    rules = fxrules.parse_rules("rule any_permute [exact]: call_method permute($x, *$dims) where len($dims) >= 2 "
                                "-> $x", source="wrong.fxr")
    assert verify_rule(rules, "any_permute", OPTIONS).grade is Grade.WRONG
