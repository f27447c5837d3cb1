"""The torch part of ``fxrules analyze`` (fxrules.verifier.analysis, through ``fxrules.analyze``):
loops and overlaps confirmed on host graphs, with witnesses that replay; dead rules against models;
clean rule sets; the bundled library."""

from __future__ import annotations

import pytest
import torch

import fxrules
from fxrules.lang.analysis import FindingCode

LOOP = """\
rule to_operator "torch.mul by 2 is operator.mul" [exact]:
    call_function torch.mul($x, 2)
    -> call_function operator.mul($x, 2)

rule to_torch "operator.mul by 2 is torch.mul" [exact]:
    call_function operator.mul($x, 2)
    -> call_function torch.mul($x, 2)
"""

GROW = """\
rule grow "relu(x) is relu(relu(x)): the graph grows forever" [exact]:
    call_function torch.relu($x)
    -> call_function torch.relu(call_function torch.relu($x))
"""

OVERLAP = """\
rule exp_neg "exp(-x) becomes tanh(x)" [changes]:
    call_function torch.exp(call_function torch.neg($x))
    -> call_function torch.tanh($x)

rule exp_any "exp(x) becomes sigmoid(x)" [changes]:
    call_function torch.exp($x)
    -> call_function torch.sigmoid($x)
"""

EXACT_EQUAL = """\
rule triple_neg "-(-(-x)) is -x" [exact]:
    call_function torch.neg(call_function torch.neg(call_function torch.neg($x)))
    -> call_function torch.neg($x)

rule double_neg "-(-x) is x" [exact]:
    call_function torch.neg(call_function torch.neg($x))
    -> $x
"""

CLEAN = """\
rule double_neg "-(-x) is x" [exact]:
    call_function torch.neg(call_function torch.neg($x))
    -> $x

rule relu_idempotent "relu(relu(x)) is relu(x)" [exact]:
    call_function torch.relu(call_function torch.relu($x))
    -> call_function torch.relu($x)
"""


def _rules(text: str, name: str):
    return fxrules.parse_rules(text, name)


def _replay(rules, finding):
    names = [r.name for r in finding.rules]
    if finding.code is FindingCode.OVERLAP:
        names = [names[1], names[0]]  # the earlier rule first, as the replay command names them
    return fxrules.analyze(rules, checks=[finding.code], names=names, reproduce=finding.witness.reproduce)


def test_two_rules_that_undo_each_other_loop_with_a_witness_that_replays():
    rules = _rules(LOOP, "loop.fxr")
    report = fxrules.analyze(rules)
    [finding] = report.findings
    assert finding.code is FindingCode.LOOP
    assert {r.name for r in finding.rules} == {"to_operator", "to_torch"}
    assert {r.location for r in finding.rules} == {"loop.fxr:1:6", "loop.fxr:5:6"}
    witness = finding.witness
    assert "did not reach a fixpoint" in witness.problem
    assert "mul" in witness.code and witness.hosts_tried >= 1
    assert witness.reproduce.startswith("@reproduce_failure(")
    assert witness.command.startswith("fxrules analyze loop.fxr --only loop --rule to_operator --rule to_torch "
                                      "--reproduce ")
    replayed = _replay(rules, finding)
    assert replayed.reproduced is True and [f.code for f in replayed.findings] == [FindingCode.LOOP]
    assert replayed.findings[0].witness.code == witness.code


def test_the_witness_really_loops_in_apply_rules():
    rules = _rules(LOOP, "loop.fxr")
    host = torch.fx.symbolic_trace(type("M", (torch.nn.Module,), {"forward": lambda self, x: torch.mul(x, 2)})())
    with pytest.raises(fxrules.RewriteLoopError):
        fxrules.apply_rules(host, rules, max_iterations=100)


def test_a_rule_that_grows_the_graph_forever_loops():
    [finding] = fxrules.analyze(_rules(GROW, "grow.fxr")).findings
    assert finding.code is FindingCode.LOOP and [r.name for r in finding.rules] == ["grow"]
    assert finding.message.startswith("rule `grow` rewrites forever")


def test_overlapping_rules_that_disagree_are_found_with_a_witness_that_replays():
    rules = _rules(OVERLAP, "overlap.fxr")
    report = fxrules.analyze(rules)
    [finding] = report.findings
    assert finding.code is FindingCode.OVERLAP
    assert [r.name for r in finding.rules] == ["exp_any", "exp_neg"]
    assert "different outputs" in finding.witness.problem
    assert "exp" in finding.witness.code and "neg" in finding.witness.code
    assert any("hosts tried" in note for note in finding.notes)
    replayed = _replay(rules, finding)
    assert replayed.reproduced is True and len(replayed.findings) == 1


def test_exact_rules_that_overlap_and_agree_are_not_a_finding_and_say_how_many_hosts_were_tried():
    report = fxrules.analyze(_rules(EXACT_EQUAL, "equal.fxr"))
    assert report.ok, [f.message for f in report.findings]
    [search] = [s for s in report.searches if s.code is FindingCode.OVERLAP]
    assert search.rules == ("triple_neg", "double_neg") and search.hosts_tried > 0 and not search.found
    assert "hosts tried" in report.summary()


def test_a_clean_rule_set_has_no_findings():
    report = fxrules.analyze(_rules(CLEAN, "clean.fxr"))
    assert report.ok and report.findings == ()
    assert all(not s.found for s in report.searches)


def test_a_witness_that_no_longer_shows_the_finding_does_not_reproduce():
    rules = _rules(LOOP, "loop.fxr")
    [finding] = fxrules.analyze(rules).findings
    fixed = _rules(LOOP.replace("-> call_function torch.mul($x, 2)", "-> call_function torch.mul($x, 2.0)"),
                   "loop.fxr")
    replayed = fxrules.analyze(fixed, checks=["loop"], names=["to_operator", "to_torch"],
                               reproduce=finding.witness.reproduce)
    assert replayed.reproduced is False and replayed.findings == ()


def test_reproduce_needs_one_check_and_its_rules():
    with pytest.raises(ValueError):
        fxrules.analyze(_rules(LOOP, "loop.fxr"), names=["to_torch"], reproduce="@reproduce_failure('1', b'')")
    with pytest.raises(ValueError):
        fxrules.analyze(_rules(LOOP, "loop.fxr"), checks=["loop"], names=["to_torch"], reproduce="not a line")


DEAD = """\
rule relu_twice "relu(relu(x)) is relu(x)" [exact]:
    call_function torch.relu(call_function torch.relu($x))
    -> call_function torch.relu($x)

rule relu_5d "only for 5-d tensors" [exact]:
    call_function torch.relu($x)
    where $x.ndim == 5
    -> call_function F.relu($x)

rule tanh_twice "there is no tanh in the model" [exact]:
    call_function torch.tanh(call_function torch.tanh($x))
    -> call_function torch.tanh($x)
"""


class _Relus(torch.nn.Module):
    def forward(self, x):
        return torch.relu(torch.relu(x)) + 1


def test_rules_that_match_nothing_in_the_models_are_dead_with_near_misses():
    report = fxrules.analyze(_rules(DEAD, "dead.fxr"), against=[(_Relus(), (torch.randn(2, 3),))],
                             checks=["dead"])
    assert [(str(f.code), f.rule.name) for f in report.findings] == [("dead", "relu_5d"), ("dead", "tanh_twice")]
    relu_5d = report.findings[0]
    assert relu_5d.witness is None
    assert any("`$x.ndim == 5` is false" in note and "dead.fxr:7:11" in note for note in relu_5d.notes)
    assert report.models == ("_Relus",)


def test_a_rule_that_fires_only_after_another_rewrite_is_not_dead():
    text = """\
rule canonical "F.relu is torch.relu" [exact]:
    call_function F.relu($x)
    -> call_function torch.relu($x)

rule relu_twice "relu(relu(x)) is relu(x)" [exact]:
    call_function torch.relu(call_function torch.relu($x))
    -> call_function torch.relu($x)
"""

    class Model(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.relu(torch.nn.functional.relu(x))

    report = fxrules.analyze(_rules(text, "late.fxr"), against=[fxrules.Against(Model(), label="two F.relu")],
                             checks=["dead"])
    assert report.ok and report.models == ("two F.relu",)


def test_without_models_nothing_is_dead():
    report = fxrules.analyze(_rules(DEAD, "dead.fxr"), checks=["dead"])
    assert report.ok


@pytest.mark.slow
def test_the_bundled_library_findings_are_the_documented_ones():
    """Every finding on the whole library is documented in rules/README.md: two overlaps between a
    `[changes]` swap and a rule of another family, which are not meant to be loaded together
    (the `[exact]`/`[approx]` rules together have none: both involve a swap)."""
    report = fxrules.analyze(fxrules.LIBRARY)
    found = sorted((str(f.code), tuple(sorted(r.name for r in f.rules))) for f in report.findings)
    documented = {("overlap", ("fold_linear_bn", "prune_linear")), ("overlap", ("relu_idempotent", "relu_to_leaky_relu"))}
    # The relu pair differs on every relu(relu(x)); the fold/prune pair only on a square Linear with a
    # BatchNorm1d in float32/float64 with a contiguous input (both rules' conditions since issue 20), which
    # the seeded search may or may not draw: every finding is documented, and the relu pair is always found.
    assert set(found) <= documented and ("overlap", ("relu_idempotent", "relu_to_leaky_relu")) in found
    swaps = {r.name for r in fxrules.load_rules(fxrules.LIBRARY / "swap")}
    assert all(any(r.name in swaps for r in f.rules) for f in report.findings)
    assert len(report.searches) > 20 and sum(s.hosts_tried for s in report.searches) > 300


def test_a_looping_pair_that_also_overlaps_is_a_loop_and_its_overlap_search_stays_bounded():
    """`sum(x, dim=1)` and `sum(x, 1)` are one node to the engine: each rule matches its own output.
    The overlap search must not spend a full rewrite budget per host on the loop (it did: 3 minutes)."""
    text = """\
rule keyword "sum with a keyword" [exact]:
    call_function torch.sum($x, dim=1) -> call_function torch.sum($x, 1)

rule positional "sum positional" [exact]:
    call_function torch.sum($x, 1) -> call_function torch.sum($x, dim=1)
"""
    report = fxrules.analyze(_rules(text, "sum.fxr"), max_examples=10)
    assert [f.code for f in report.findings if f.code is not FindingCode.LOOP] == []
    assert any(f.code is FindingCode.LOOP for f in report.findings)
    overlap = [s for s in report.searches if s.code is FindingCode.OVERLAP]
    assert all(not s.found for s in overlap)
    assert report.seconds < 60
