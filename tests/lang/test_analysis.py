"""The torch-free part of ``fxrules analyze`` (fxrules.lang.analysis): shadowed and unsatisfiable
rules, the candidates the verifier confirms, and the finding values. These run with torch blocked
(the last test), as the fxrules-analyze pre-commit hook does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import fxrules
from fxrules.lang.analysis import (
    FINDING_CODES, AnalysisReport, Finding, FindingCode, loop_candidates, overlap_candidates, shadowing,
    static_findings, unsatisfiable,
)
from fxrules.lang.diagnostics import WARNING, Diagnostic

ROOT = Path(__file__).resolve().parents[2]


def _rules(text: str, name: str = "t.fxr"):
    return fxrules.parse_rules(text, name)


def _codes(text: str) -> list[tuple[str, str]]:
    return [(str(f.code), f.rule.name) for f in static_findings(_rules(text))]


# ---------------------------------------------------------------------------
# shadowed
# ---------------------------------------------------------------------------

SHADOWED = """\
rule general "relu of anything" [exact]:
    call_function torch.relu($x)
    -> call_function F.relu($x)

rule specific "relu of neg or sigmoid: never reached" [exact]:
    (call_function torch.relu(call_function torch.neg($y))
     | call_function torch.relu(call_function torch.sigmoid($y)))
    -> call_function torch.relu($y)
"""


def test_a_rule_an_earlier_more_general_rule_always_takes_is_shadowed():
    [finding] = static_findings(_rules(SHADOWED))
    assert finding.code is FindingCode.SHADOWED
    assert [r.name for r in finding.rules] == ["specific", "general"]
    assert (finding.rule.path, finding.rule.line, finding.rule.column) == ("t.fxr", 5, 6)
    assert finding.rules[1].location == "t.fxr:1:6"
    assert "`general`" in finding.message


def test_the_same_rules_in_the_other_order_are_not_shadowed():
    first, second = SHADOWED.split("\n\n")
    assert _codes(second + "\n\n" + first) == []


def test_variants_taken_by_different_earlier_rules_make_a_shadowed_rule():
    text = """\
rule neg_only "a" [exact]:
    call_function torch.relu(call_function torch.neg($x))
    -> call_function torch.neg($x)

rule sigmoid_only "b" [exact]:
    call_function torch.relu(call_function torch.sigmoid($x))
    -> call_function torch.sigmoid($x)

rule both "c" [exact]:
    (call_function torch.relu(call_function torch.neg($y)) | call_function torch.relu(call_function torch.sigmoid($y)))
    -> $y
"""
    [finding] = static_findings(_rules(text))
    assert [r.name for r in finding.rules] == ["both", "neg_only", "sigmoid_only"]


def test_one_variant_left_over_is_not_shadowed():
    text = """\
rule neg_only "a" [exact]:
    call_function torch.relu(call_function torch.neg($x))
    -> call_function torch.neg($x)

rule both "c" [exact]:
    (call_function torch.relu(call_function torch.neg($y)) | call_function torch.relu(call_function torch.tanh($y)))
    -> $y
"""
    assert _codes(text) == []


CONDITIONS = """\
rule not_bool "a":
    call_function torch.sigmoid($x)
    where $x.dtype != torch.bool
    -> call_function torch.tanh($x)

rule floating_2d "is_floating implies not bool, so this is shadowed":
    call_function torch.sigmoid($x)
    where is_floating($x) and $x.ndim >= 2
    -> call_function torch.tanh($x)
"""


def test_conditions_that_imply_the_earlier_rules_conditions_are_shadowed():
    assert _codes(CONDITIONS) == [("shadowed", "floating_2d")]


def test_conditions_that_do_not_imply_the_earlier_ones_are_not_shadowed():
    text = """\
rule floating "a":
    call_function torch.sigmoid($x)
    where is_floating($x)
    -> call_function torch.tanh($x)

rule two_d "b: a 2-d integer tensor is not floating":
    call_function torch.sigmoid($x)
    where $x.ndim == 2
    -> call_function torch.tanh($x)
"""
    assert _codes(text) == []


def test_undecidable_conditions_are_not_reported():
    text = """\
rule zero_bias "a":
    call_function operator.add($x, get_attr $b)
    where is_zero($b)
    -> $x

rule same "b: is_zero($b) is not decidable from the later rule's conditions":
    call_function operator.add($x, get_attr $b)
    where $x.ndim == 2
    -> $x
"""
    assert _codes(text) == []


def test_a_rule_with_a_builder_does_not_shadow():
    text = """\
rule fold "the builder may decline (a conv it cannot fold), so this takes nothing for sure" [approx]:
    call_module BatchNorm2d(call_module Conv2d($x) as conv) as bn
    -> call_module fxrules.builders.fold_conv_bn(conv, bn)($x)

rule later "b" [approx]:
    call_module BatchNorm2d(call_module Conv2d($x) as conv) as bn
    where not bn.training
    -> call_module fxrules.builders.fold_conv_bn(conv, bn)($x)
"""
    assert _codes(text) == []


def test_captures_used_twice_generalise_only_equal_parts():
    text = """\
rule twice "x + x" [exact]:
    call_function operator.add($x, $x)
    -> call_function operator.mul($x, 2)

rule any_sum "x + y: not every sum is x + x" [exact]:
    call_function operator.add($x, $y)
    -> call_function operator.add($y, $x)
"""
    assert _codes(text) == []
    reversed_text = "\n\n".join(reversed(text.split("\n\n")))
    assert _codes(reversed_text) == [("shadowed", "twice")]


# ---------------------------------------------------------------------------
# unsatisfiable
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("where", [
    "$x.ndim > 2 and $x.ndim < 3",
    "$x.ndim < 0",
    "$x.ndim == 2 and $x.ndim == 3",
    "$x.dtype == torch.int64 and is_floating($x)",
    "$x.dtype in [torch.float32, torch.float64] and $x.dtype == torch.half",
    "($x.ndim == 2 or $x.ndim == 3) and $x.ndim > 4",
    "$x.ndim == 2 and not ($x.ndim == 2)",
    "1 == 2",
])
def test_contradictory_conditions_are_unsatisfiable(where):
    text = f'rule impossible "u":\n    call_function torch.exp($x)\n    where {where}\n    -> $x\n'
    finding = unsatisfiable(_rules(text)["impossible"])
    assert finding is not None and finding.code is FindingCode.UNSATISFIABLE
    assert finding.rule.location == "t.fxr:1:6"


@pytest.mark.parametrize("where", [
    "$x.ndim == 2 or $x.ndim == 3",
    "$x.ndim >= 2 and $x.ndim <= 2",
    "is_floating($x) and $x.dtype != torch.float16",
    "$x.dtype == $y.dtype",
    "is_zero($y) and not is_zero($y)",  # opaque calls are never contradicted
])
def test_satisfiable_or_undecidable_conditions_are_not_reported(where):
    text = f'rule fine "s":\n    call_function operator.add($x, $y)\n    where {where}\n    -> $x\n'
    assert unsatisfiable(_rules(text)["fine"]) is None


def test_module_attribute_constraints_in_the_pattern_count():
    text = """\
rule half_dropout "u":
    call_module Dropout{p=0.5}($x) as d
    where d.p == 0.1
    -> $x

rule training_both "u":
    call_module Dropout($x) as d
    where d.training and not d.training
    -> $x

rule ok "s":
    (call_module Dropout{p=0.5}($x) as d | call_module Dropout{p=0.1}($x) as d)
    where d.p == 0.1
    -> $x
"""
    assert _codes(text) == [("unsatisfiable", "half_dropout"), ("unsatisfiable", "training_both")]


def test_an_unsatisfiable_rule_is_not_also_reported_shadowed():
    text = """\
rule any_exp "a":
    call_function torch.exp($x)
    -> call_function torch.sigmoid($x)

rule impossible "b":
    call_function torch.exp($x)
    where $x.ndim < 0
    -> $x
"""
    assert _codes(text) == [("unsatisfiable", "impossible")]


# ---------------------------------------------------------------------------
# candidates for the verifier
# ---------------------------------------------------------------------------

def test_rules_that_produce_each_others_patterns_are_loop_candidates():
    text = """\
rule to_operator "a" [exact]:
    call_function torch.mul($x, 2)
    -> call_function operator.mul($x, 2)

rule to_torch "b" [exact]:
    call_function operator.mul($x, 2)
    -> call_function torch.mul($x, 2)

rule unrelated "c" [exact]:
    call_function torch.neg(call_function torch.neg($x))
    -> $x
"""
    assert loop_candidates(_rules(text)) == [("to_operator", "to_torch")]


def test_rules_whose_patterns_unify_are_overlap_candidates():
    text = """\
rule exp_neg "a" [changes]:
    call_function torch.exp(call_function torch.neg($x))
    -> call_function torch.tanh($x)

rule exp_any "b" [changes]:
    call_function torch.exp($x)
    -> call_function torch.sigmoid($x)

rule exp_two "c: a literal 2 never matches the call the others need" [changes]:
    call_function torch.pow($x, 2)
    -> $x
"""
    assert overlap_candidates(_rules(text)) == [("exp_neg", "exp_any")]
    assert overlap_candidates(_rules(text), skip=["exp_any"]) == []


# ---------------------------------------------------------------------------
# findings as values
# ---------------------------------------------------------------------------

def test_findings_convert_to_diagnostics_and_json():
    [finding] = static_findings(_rules(SHADOWED))
    diagnostic = finding.to_diagnostic()
    assert isinstance(diagnostic, Diagnostic)
    assert (diagnostic.path, diagnostic.line, diagnostic.column, diagnostic.code) == ("t.fxr", 5, 6, "shadowed")
    assert diagnostic.end_line == 5 and diagnostic.end_column == 14  # the rule's name
    assert diagnostic.severity == WARNING
    assert any("t.fxr:1:6" in note for note in diagnostic.notes)
    data = finding.to_json()
    assert data["code"] == "shadowed" and data["location"] == "t.fxr:5:6" and data["witness"] is None
    assert [r["name"] for r in data["rules"]] == ["specific", "general"]
    assert "^^^^^^^^" in finding.render(SHADOWED)
    with pytest.raises(AttributeError):
        finding.code = FindingCode.LOOP  # frozen
    assert not hasattr(finding, "__dict__")  # slotted


def test_every_code_is_described_and_stable():
    assert [str(c) for c in FindingCode] == ["shadowed", "loop", "overlap", "unsatisfiable", "dead"]
    assert set(FINDING_CODES) == {str(c) for c in FindingCode}


def test_a_report_counts_and_summarises():
    findings = static_findings(_rules(SHADOWED))
    report = AnalysisReport(findings, 2)
    assert not report.ok and report.counts()["shadowed"] == 1
    assert "1 shadowed" in report.summary()
    assert report.to_json()["findings"][0]["code"] == "shadowed"
    assert AnalysisReport((), 3).ok


def test_the_bundled_library_has_no_static_findings():
    assert static_findings(fxrules.load_rules(fxrules.LIBRARY)) == ()
    assert all(isinstance(f, Finding) for f in shadowing(fxrules.load_rules(fxrules.LIBRARY)))


def test_static_analysis_runs_with_torch_blocked():
    script = (
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "from fxrules.tools.cli import main\n"
        f"code = main(['analyze', '--static', {str(ROOT / 'rules')!r}])\n"
        "assert sys.modules['torch'] is None\n"
        "print('exit', code)\n"
    )
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "exit 0" in run.stdout and "no findings" in run.stdout


# ---------------------------------------------------------------------------
# soundness: an unsatisfiable verdict is checked against every assignment
# ---------------------------------------------------------------------------

_ATOMS = [
    "$x.ndim == 2", "$x.ndim != 2", "$x.ndim > 1", "$x.ndim <= 3", "$x.ndim < 1", "$x.ndim >= 4",
    "$x.ndim in [1, 3]", "$x.ndim not in [0, 1, 2]", "2 < $x.ndim", "$x.ndim == 2.5",
    "$x.dtype == torch.float32", "$x.dtype != torch.float", "$x.dtype == torch.int64",
    "$x.dtype in [torch.float16, torch.int64]", "is_floating($x)", "$x.dtype == torch.bool",
    "d.training", "d.p == 0.5", "d.p > 0.2", "True", "1 == 2",
]
_DTYPES = ["torch.float32", "torch.float16", "torch.int64", "torch.bool"]


def _holds(cond, env) -> bool:
    """The condition's value under ``env`` (subject text -> value), for the atoms above."""
    import fxrules.lang.ast as A
    from fxrules.lang.printer import print_cond

    if isinstance(cond, A.CBinary) and cond.op in ("and", "or"):
        left, right = _holds(cond.left, env), _holds(cond.right, env)
        return (left and right) if cond.op == "and" else (left or right)
    if isinstance(cond, A.CUnary) and cond.op == "not":
        return not _holds(cond.operand, env)
    if isinstance(cond, A.CCall):
        return env["$x.dtype"] in ("torch.float32", "torch.float16")
    if isinstance(cond, A.CBinary):
        left, right = _value(cond.left, env), _value(cond.right, env)
        return {"==": lambda: left == right, "!=": lambda: left != right, "<": lambda: left < right,
                "<=": lambda: left <= right, ">": lambda: left > right, ">=": lambda: left >= right,
                "in": lambda: left in right, "not in": lambda: left not in right}[cond.op]()
    text = print_cond(cond)
    return bool(env[text]) if text in env else bool(_value(cond, env))


def _value(cond, env):
    import fxrules.lang.ast as A
    from fxrules.lang.printer import print_cond

    if isinstance(cond, A.CLiteral):
        return cond.value
    if isinstance(cond, A.CList):
        return [_value(i, env) for i in cond.items]
    text = print_cond(cond)
    if text in env:
        return env[text]
    return {"torch.float": "torch.float32"}.get(text, text)  # a dotted constant


@pytest.mark.parametrize("seed", range(6))
def test_every_unsatisfiable_verdict_is_true_for_every_assignment(seed):
    import itertools
    import random

    generator = random.Random(seed)
    checked = 0
    for _ in range(60):
        picked = generator.sample(_ATOMS, generator.randint(1, 4))
        joined = picked[0]
        for atom in picked[1:]:
            joined = f"({joined}) {generator.choice(['and', 'or', 'and not'])} ({atom})"
        text = (f'rule r "fuzz":\n    call_module Dropout($x) as d\n    where {joined}\n    -> $x\n')
        rule = _rules(text)["r"]
        [cond] = rule.ast.conditions
        if unsatisfiable(rule) is None:
            continue
        checked += 1
        for ndim, dtype, training, p in itertools.product(range(6), _DTYPES, (False, True), (0.1, 0.5, 0.9)):
            env = {"$x.ndim": ndim, "$x.dtype": dtype, "d.training": training, "d.p": p}
            assert not _holds(cond, env), (joined, env)
    assert checked > 0  # the seeds give contradictions (about 7 in 60 each)


def test_an_earlier_alternative_that_may_match_with_other_bindings_stops_the_proof():
    text = """\
rule either_order "the first option that matches binds $x; the condition reads it" [exact]:
    (call_function operator.add($x, $y) | call_function operator.add($y, $x))
    where $x.ndim == 2
    -> call_function torch.add($x, $y)

rule left_2d "add(a, b) with b 2-d: option 1 binds $x to a, whose ndim is unknown" [exact]:
    call_function operator.add($a, $b)
    where $b.ndim == 2
    -> call_function torch.add($b, $a)
"""
    assert _codes(text) == []
    left = text.replace("where $b.ndim == 2", "where $a.ndim == 2")
    assert _codes(left) == [("shadowed", "left_2d")]


def test_constants_compare_by_full_path_across_files_with_different_aliases():
    first = fxrules.parse_rules("""\
use torch as T
rule not_half "a":
    call_function torch.sigmoid($x)
    where $x.dtype != T.float16
    -> call_function torch.tanh($x)
""", "a.fxr")
    second = fxrules.parse_rules("""\
rule is_float32 "b: float32 is not float16":
    call_function torch.sigmoid($x)
    where $x.dtype == torch.float32
    -> call_function torch.tanh($x)

rule is_half "c: float16 is what the first excludes":
    call_function torch.sigmoid($x)
    where $x.dtype == torch.half
    -> call_function torch.tanh($x)
""", "b.fxr")
    found = [(str(f.code), f.rule.name) for f in static_findings(first + second)]
    assert found == [("shadowed", "is_float32")]


def test_a_name_bound_inside_a_named_pattern_use_is_a_bound_name():
    """`relu(call_module BatchNorm2d(...) as bn)`: `bn` is bound (inside the use's argument), so
    `not bn.training` reads the module, not a dotted constant (it was read as always false)."""
    rules = fxrules.parse_rules(
        "pattern relu($v) = call_module ReLU($v) | call_function torch.relu($v)\n"
        "rule r [approx]:\n"
        "    relu(call_module BatchNorm2d(call_module Conv2d($x) as conv) as bn)\n"
        "    where not bn.training\n"
        "    -> call_module fxrules.builders.fuse_conv_bn_relu(conv, bn)($x)\n", source="use.fxr")
    assert static_findings(rules) == ()
    assert fxrules.lang.ast.bound_names(rules["r"].ast.patterns) == {"conv", "bn"}


# ---------------------------------------------------------------------------
# shadowed: the index of earlier rules (analysis._TakerIndex) leaves out only rules that take nothing
# ---------------------------------------------------------------------------

_TARGETS = ["call_function torch.add", "call_function torch.sub", "call_method add", "call_function torch.clamp"]
_ARGS = ["$x", "$y", "_", "1", "2", "1.0", "True", "call_function torch.relu($x)", "call_function torch.neg($y)"]


def _random_rule(rng, i: int) -> str:
    """A rule on one of a few root targets, with captures, wildcards, literals and nested calls among its
    arguments, sometimes an alternation, a keyword, a condition or `...`."""
    def call() -> str:
        args = [rng.choice(_ARGS) for _ in range(rng.randint(1, 3))]
        if rng.random() < 0.2:
            args.append("...")
        elif rng.random() < 0.2:
            args.append(f"alpha={rng.choice(['1', '2', '$x'])}")
        return f"{rng.choice(_TARGETS)}({', '.join(args)})"

    pattern = call() if rng.random() < 0.8 else f"({call()} | {call()})"
    where = f" where $x.ndim == {rng.randint(1, 3)}" if rng.random() < 0.2 and "$x" in pattern else ""
    bound = "$x" if "$x" in pattern else "$y" if "$y" in pattern else "1"
    replacement = bound if bound != "1" and rng.random() < 0.5 else f"call_function torch.relu({bound})"
    return f"rule r{i} [changes]: {pattern}{where} -> {replacement}\n"


@pytest.mark.parametrize("seed", range(30))
def test_the_index_of_earlier_rules_finds_what_trying_every_rule_finds(seed, monkeypatch):
    import random

    from fxrules.lang import analysis

    rng = random.Random(seed)
    lines, errors = [], 0
    for i in range(40):
        line = _random_rule(rng, i)
        try:
            _rules(line)
        except Exception:
            errors += 1
            continue
        lines.append(line)
    rule_set = _rules("".join(lines))
    found = [(f.rule.name, tuple(r.name for r in f.rules)) for f in shadowing(rule_set)]

    def every_earlier_rule(self, position, variant, aliases):
        return [r for p, r in enumerate(self.rules) if p < position]

    original_init = analysis._TakerIndex.__init__

    def init(self, rules, expanded):
        original_init(self, rules, expanded)
        self.rules = rules

    monkeypatch.setattr(analysis._TakerIndex, "__init__", init)
    monkeypatch.setattr(analysis._TakerIndex, "candidates", every_earlier_rule)
    assert [(f.rule.name, tuple(r.name for r in f.rules)) for f in shadowing(rule_set)] == found
    assert len(lines) >= 20  # the generator writes rules the checker takes


def _pairwise_loop_candidates(rule_set):
    """loop_candidates as it was first written: produces() asked of every pair of rules."""
    from fxrules.lang.analysis import _components, produces

    rules = list(rule_set.rules)
    edges = {r.name: [s.name for s in rules if produces(r, s)] for r in rules}
    order = {r.name: i for i, r in enumerate(rules)}
    groups = [tuple(sorted(c, key=order.__getitem__)) for c in _components(edges, [r.name for r in rules])
              if len(c) > 1 or c[0] in edges[c[0]]]
    return sorted(groups, key=lambda g: order[g[0]])


def _pairwise_overlap_candidates(rule_set):
    from fxrules.lang.analysis import _overlap

    rules = [r for r in rule_set.rules if not r.is_multi_root]
    return [(a.name, b.name) for i, a in enumerate(rules) for b in rules[i + 1:] if _overlap(a, b) or _overlap(b, a)]


def _random_rewriting_rule(rng, i: int) -> str:
    """:func:`_random_rule`, its replacement sometimes a call of a pattern target (so rules feed each other)."""
    line = _random_rule(rng, i)
    if rng.random() < 0.5:
        head, _, _ = line.partition(" -> ")
        bound = "$x" if "$x" in head else "$y" if "$y" in head else "1"
        args = ", ".join([bound] + [rng.choice(["1", "2", "$x", "True"]) if bound == "$x" else "1"
                                    for _ in range(rng.randint(0, 2))])
        line = f"{head} -> {rng.choice(_TARGETS)}({args})\n"
    return line


@pytest.mark.parametrize("seed", range(30))
def test_indexed_loop_and_overlap_candidates_are_the_pairwise_ones(seed):
    import random

    rng = random.Random(1000 + seed)
    lines = []
    for i in range(40):
        line = _random_rewriting_rule(rng, i)
        try:
            _rules(line)
        except Exception:
            continue
        lines.append(line)
    rule_set = _rules("".join(lines))
    assert loop_candidates(rule_set) == _pairwise_loop_candidates(rule_set)
    assert overlap_candidates(rule_set) == _pairwise_overlap_candidates(rule_set)
    assert len(lines) >= 20


def test_the_candidate_searches_meet_every_rule_of_a_large_bucket():
    """Past 16 calls of one target the index splits them by a literal: rules with that literal, and rules
    with none there (a capture), are still met."""
    text = "".join(f"rule r{i} [changes]: call_function torch.add($x, {i}) -> call_function torch.add($x, {i + 1})\n"
                   for i in range(40))
    text += "rule any [changes]: call_function torch.add($x, $y) -> call_function torch.sub($x, $y)\n"
    rule_set = _rules(text)
    assert loop_candidates(rule_set) == _pairwise_loop_candidates(rule_set)
    assert overlap_candidates(rule_set) == _pairwise_overlap_candidates(rule_set)
    assert ("r0", "any") in overlap_candidates(rule_set) and ("r3", "r4") not in overlap_candidates(rule_set)


def test_a_builder_call_meets_every_module_pattern():
    """A replacement's builder call may make any module: the index offers it to every call_module pattern,
    `fold`'s own among them (the over-approximation makes it a loop candidate, which the verifier then
    tries; `split` re-calls its own module by name, which unifies with no pattern here)."""
    text = """\
rule fold [approx]:
    call_module BatchNorm2d(call_module Conv2d($x) as conv) as bn -> call_module fxrules.builders.fold_conv_bn(conv, bn)($x)
rule split [changes]:
    call_module Conv2d($x) as c -> call_module BatchNorm2d{num_features=3}(call_module c($x))
"""
    rule_set = _rules(text)
    assert loop_candidates(rule_set) == _pairwise_loop_candidates(rule_set) == [("fold",)]
