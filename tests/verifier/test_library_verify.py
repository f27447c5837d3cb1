"""`fxrules verify rules/` in the test suite: every rule of the bundled library keeps its contract
on drawn host graphs and on its own examples (one test per rule, through fxrules.testing)."""

from __future__ import annotations

import pytest
from hypothesis import settings

import fxrules
from fxrules.testing import assert_rule_verified, rule_cases
from fxrules.verifier.driver import MIN_HOSTS

# A few hosts per rule (at least MIN_HOSTS + 3: fewer distinct hosts grade a rule weak) in the ci profile (fixed seed); HYPOTHESIS_PROFILE=thorough looks much harder.
HOSTS = max(MIN_HOSTS + 3, settings.default.max_examples // 30)  # weak below MIN_HOSTS distinct hosts


# Library rules the verifier's draws (issue 20) find wrong and that are not fixed yet (an xfail, not strict). The 22
# rules once listed here are fixed, by the engine's guards (hooks, aliasing, trainable parameters, layout), by their
# conditions (contiguous x, the sum keeping x's shape, float32/float64 folds) or by the verifier's reconciled
# semantics (parameter gradients compared in training mode only); see docs/verify.md. Found since, still open:
KNOWN_WRONG: dict[str, str] = {
    "aten_fold_conv2d_bn": (
        "(the engine's part is fixed: a captured trainable parameter a builder consumes is now refused, "
        "tests/engine/test_guards.py) a batch-norm weight drawn non-finite or huge (float32 special values) makes "
        "the folded weight inf/NaN where the original output is finite or a different inf: the fold needs a "
        "finiteness condition or the builder must decline"),
    "double_neg": ("on a strided x read by a later .view the engine refuses the rewrite (layout-changed): the model "
                   "stays right, but the rule's conditions admit the host. `where $x.is_contiguous()` fixes it and "
                   "makes the rule need metadata, which breaks applying it without example_inputs "
                   "(tests/engine/test_scale.py::test_long_chain): the integrator decides"),
    "canonical_silu": ("float16 with special values: the input gradient of x * sigmoid(x) and of F.silu differ "
                       "beyond the float64 reference's budget (unseeded full run; not yet diagnosed)"),
}


def _cases():
    for case in rule_cases(fxrules.LIBRARY):
        reason = KNOWN_WRONG.get(case.values[0].name)
        yield case if reason is None else pytest.param(*case.values, id=case.id,
                                                       marks=pytest.mark.xfail(reason=reason, strict=False))


@pytest.mark.parametrize("case", list(_cases()))
def test_library_rule_keeps_its_contract(case):
    assert_rule_verified(case, max_examples=HOSTS, seed=0, database=None)


def test_every_library_rule_has_checked_evidence():
    """Validated by hosts or by a positive example, never by default."""
    for case in rule_cases(fxrules.LIBRARY):
        case = case.values[0]
        rule = case.rule_set[case.name]
        assert any(e.count != 0 for e in rule.ast.examples), f"{case.name} has no positive example"
        assert any(e.count == 0 for e in rule.ast.examples), f"{case.name} has no negative example"


def test_the_library_is_formatted_canonically():
    from fxrules.tools.fmt import run

    assert run([str(fxrules.LIBRARY)], check=True, diff=False) == 0
