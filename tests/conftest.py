"""Shared pytest configuration: the Hypothesis profiles.

``ci`` (the default) is derandomized, so a run is reproducible and a failure
prints a blob to replay it; ``thorough`` runs many more examples, for a local
hunt: ``HYPOTHESIS_PROFILE=thorough pytest tests/lang/test_parser_fuzz.py``.
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    print_blob=True,
)
settings.register_profile("thorough", max_examples=2000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# -- fxrules' code writer, checked against torch's on every graph the suite commits ---------------
#
# fxrules writes a committed graph's Python source itself (fxrules/engine/codegen.py), promising the
# text, globals and line map torch.fx's own writer makes. Every graph any test commits is written
# by both here, and a difference fails the test that committed it. tests/engine/test_codegen.py
# tests the writer directly, on purpose-made graphs and random ones.

import pytest  # noqa: E402


def same_python_code(graph):
    """fxrules' source for ``graph`` (or None where it defers to torch), after checking it equals
    torch.fx's own ``Graph.python_code(graph, "self")``."""
    from torch import fx

    ours = _write_python_code(graph)
    if ours is None:
        return None
    theirs = fx.Graph.python_code(graph, "self")
    assert ours.src == theirs.src, f"fxrules wrote different source:\n{ours.src}\n--- torch.fx wrote:\n{theirs.src}"
    assert list(ours.globals) == list(theirs.globals), (list(ours.globals), list(theirs.globals))
    for name, value in theirs.globals.items():
        assert ours.globals[name] is value, f"global {name}: {ours.globals[name]!r} is not {value!r}"
    assert ours._lineno_map == theirs._lineno_map
    assert ours._prologue_start == theirs._prologue_start
    return ours


_write_python_code = None


@pytest.fixture(autouse=True, scope="session")
def _cross_check_the_code_writer():
    global _write_python_code
    from fxrules.engine import codegen

    _write_python_code = codegen.python_code
    codegen.python_code = same_python_code
    try:
        yield
    finally:
        codegen.python_code = _write_python_code


# -- rule sets checked once per text (fxrules.lang.load.CHECKED) ----------------------------------
#
# parse_rules and load_rules give the RuleSet checked before from the same text and policy. Each
# test starts with none kept, so one that patches the checker or the compiler sees its own rules
# checked and compiled (tests/lang/test_load_memo.py tests the keeping itself).


@pytest.fixture(autouse=True)
def _no_rule_sets_kept_from_other_tests():
    from fxrules.lang.load import CHECKED

    CHECKED.clear()
