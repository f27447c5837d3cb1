"""fxrules.verify: rules that keep their contracts are validated; wrong ones are caught with a
shrunk counterexample; examples are graded; the CLI and the pytest helper work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import settings

import fxrules
from fxrules.verifier.driver import VerifyReport, compare, verify

ROOT = Path(__file__).resolve().parents[2]
# Hosts per rule: few in the ci profile (fixed seed), many more under HYPOTHESIS_PROFILE=thorough.
HOSTS = max(30, settings.default.max_examples // 5)  # the draws are wider now (dtypes, layouts, homes of tensors)


def _verify(text: str, **options) -> VerifyReport:
    rules = fxrules.parse_rules(text, "wrong.fxr", allow_imports=["tests"])
    options.setdefault("max_examples", HOSTS)
    options.setdefault("seed", 0)
    options.setdefault("database", None)
    return verify(rules, **options)


# Each is wrong; hypothesis must find a host where the contract breaks, and shrink it.
WRONG_RULES = {
    "mul_two_is_x": "[exact] call_function operator.mul($x, 2) -> $x",
    "relu_is_sigmoid": "call_function torch.relu($x) -> call_function torch.sigmoid($x)",
    "add_one_is_x": "call_function operator.add($x, 1) -> $x",
    "transpose_wrong_dims": "[exact] call_function torch.transpose(call_function torch.transpose($x, 0, 1), 1, 2)"
                            " -> $x",
    "permute_twice_is_x": "[exact] call_method permute(call_method permute($x, $a, $b, $c), $a, $b, $c) -> $x",
    "t_is_x_square_only": "call_function torch.t($x) -> $x",
    "sum_is_mean": "call_function torch.sum($x, $d) -> call_function torch.mean($x, $d)",
    "softmax_any_dim_is_last": "call_function torch.softmax($x, $d) -> call_function torch.softmax($x, -1)",
    "gelu_tanh_is_exact": "[exact] call_function torch.nn.functional.gelu($x) -> "
                          "call_function torch.nn.functional.gelu($x, approximate=\"tanh\")",
    # (`[exact] call_module Dropout($x) -> $x` is no longer wrong in effect: the engine refuses it wherever
    # the dropout draws random numbers, tests/engine/test_effects.py; this is the eval-mode mistake)
    "dropout_scales_in_eval": "[exact] call_module Dropout{p=0.5}($x) -> call_function operator.mul($x, 0.5)",
    "relu_neg_commute": "call_function torch.relu(call_function torch.neg($x)) -> "
                        "call_function torch.neg(call_function torch.relu($x))",
    "linear_is_identity": "call_module Linear($x) -> $x",
    "conv_bn_fold_ignores_eps": "call_module BatchNorm2d(call_module Conv2d($x) as conv) as bn "
                                "where not bn.training -> call_module tests.helpers_builders."
                                "fold_conv_bn_ignoring_eps(conv, bn)($x)",
    "sigmoid_is_tanh": "call_function torch.sigmoid($x) -> call_function torch.tanh($x)",
}


@pytest.mark.parametrize("name", sorted(WRONG_RULES))
@pytest.mark.slow
def test_a_wrong_rule_is_caught_with_a_shrunk_counterexample(name):
    report = _verify(WRONG_RULES[name])
    (verdict,) = report.verdicts
    assert verdict.grade == "wrong", verdict.render()
    example = verdict.counterexample
    assert example is not None
    assert example.problem
    assert any(fact.startswith("dtype ") for fact in example.facts)
    assert any(fact.startswith(("input ", "module ", "parameter ", "frozen parameter ", "buffer "))
               for fact in example.facts)
    assert "def forward" in example.code
    assert example.reproduce and example.reproduce.startswith("@reproduce_failure(")
    rendered = verdict.render()
    assert "wrong.fxr:1" in rendered and "counterexample" in rendered
    assert not report.ok


def test_shrinking_gives_a_small_host():
    (verdict,) = _verify(WRONG_RULES["mul_two_is_x"]).verdicts
    inputs = [fact for fact in verdict.counterexample.facts if fact.startswith("input ")]
    assert len(inputs) == 1
    assert verdict.counterexample.code.count("\n") <= 6  # forward, one mul, return
    assert verdict.counterexample.max_abs > 0


def test_linear_to_identity_is_caught_when_shapes_are_kept():
    """Marked [approx] and restricted to square layers, so every rewrite keeps the shape: values differ."""
    report = _verify("rule prune [approx]:\n"
                     "    call_module Linear($x) as l where l.in_features == l.out_features -> $x\n")
    (verdict,) = report.verdicts
    assert verdict.grade == "wrong"
    assert "differs beyond the tolerance" in verdict.counterexample.problem
    module_facts = [f for f in verdict.counterexample.facts if "Linear(" in f]
    assert module_facts and "in_features=" in module_facts[0]
    features = module_facts[0].split("in_features=")[1].split(",")[0], \
        module_facts[0].split("out_features=")[1].split(",")[0]
    assert features[0] == features[1]


@pytest.mark.slow
def test_a_shape_change_breaks_approx_and_is_reported_for_changes():
    (approx,) = _verify("call_function torch.t($x) where $x.ndim == 2 and not is_constant($x) -> $x",
                        grad=False).verdicts
    assert approx.grade == "wrong"
    assert "shape" in approx.counterexample.problem or "differs" in approx.counterexample.problem
    (changes,) = _verify("[changes] call_module Linear($x) where $x.is_contiguous() -> $x").verdicts
    assert changes.grade == "validated"
    assert changes.shapes_kept is False  # some drawn Linear changed the feature count


@pytest.mark.slow
def test_correct_rules_are_validated():
    text = "\n".join([
        "[exact] call_function torch.relu(call_function torch.relu($x)) -> call_function torch.relu($x)",
        # not for complex x: complex division by 2 and multiplication by 0.5 differ on infinities
        "[exact] call_function operator.truediv($x, 2) where is_floating($x) -> call_function operator.mul($x, 0.5)",
        "[exact] call_function torch.transpose(call_function torch.transpose($x, $a, $b), $a, $b)"
        " where not is_constant($x) -> $x",
        "[changes] call_function torch.relu($x) where is_floating($x)"
        " -> call_function torch.nn.functional.leaky_relu($x, 0.1)",
    ])  # (a Dropout removal or a conv-bn fold is wrong on hooked or trainable modules: test_soundness_draws)
    report = _verify(text)
    assert report.ok, str(report)
    for verdict in report.verdicts:
        assert verdict.hosts_checked > 0
    assert report.verdicts[-1].shapes_kept is True


@pytest.mark.slow
def test_gradients_are_compared_with_grad():
    # Forward bit-identical, but at 0 relu's gradient is 0 and clamp(min=0)'s is 1.
    text = "[exact] call_function torch.relu($x) -> call_function torch.clamp($x, min=0)"
    assert _verify(text, grad=False).ok
    (verdict,) = _verify(text, max_examples=60).verdicts  # grad is the default
    assert verdict.grade == "wrong"
    assert "gradient" in verdict.counterexample.problem


def test_an_op_without_a_sampler_is_unverified_not_passed():
    (verdict,) = _verify("call_function torch.special.i0e($x) -> call_function torch.special.i0e($x, out=None)"
                         ).verdicts
    assert verdict.grade == "unverified" and verdict.hosts_gap == "no-sampler"
    assert "no sampler for torch.special.i0e" in verdict.hosts_note
    assert "add an example" in verdict.hosts_note
    assert verdict.to_json()["hosts_gap"] == "no-sampler"


@pytest.mark.slow
def test_examples_are_graded():
    text = """
rule keep "relu of relu" [exact]:
    call_function torch.relu(call_function torch.relu($x)) -> call_function torch.relu($x)
    example: call_function torch.relu(call_function torch.relu($x)) given $x: [2, 3]
    example 1: call_function torch.relu(call_function torch.relu($x)) given $x: float64[4]
    example 0: call_function torch.relu($x) given $x: [2, 3]

rule missing "claims two rewrites" [exact]:
    call_function torch.relu(call_function torch.relu($x)) -> call_function torch.relu($x)
    example 2: call_function torch.relu(call_function torch.relu($x)) given $x: [2, 3]

rule noisy "a negative example that is rewritten" [exact]:
    call_function torch.neg(call_function torch.neg($x)) where is_floating($x) and not is_constant($x) and $x.is_contiguous() -> $x
    example 0: call_function torch.neg(call_function torch.neg($x)) given $x: [2, 3]

rule wrong_example "no sampler, but the example shows the rule is wrong" [exact]:
    call_function torch.special.i0e($x) -> $x
    example: call_function torch.special.i0e($x) given $x: [3]

rule unbuildable "an example model that cannot run" [exact]:
    call_function torch.neg(call_function torch.neg($x)) where is_floating($x) and not is_constant($x) and $x.is_contiguous() -> $x
    example: call_function torch.mm($x, $x) given $x: [2, 3]

rule examples_only "no sampler, validated by its examples" [exact]:
    call_function torch.special.i0e(call_function torch.relu($x)) -> call_function torch.special.i0e(call_method relu($x))
    example: call_function torch.special.i0e(call_function torch.relu($x)) given $x: [3]
    example 0: call_function torch.special.i0e($x) given $x: [3]
"""
    report = _verify(text)
    grades = {v.rule: v.grade for v in report.verdicts}
    assert grades == {"keep": "validated", "missing": "missing", "noisy": "noisy", "wrong_example": "wrong",
                      "unbuildable": "error", "examples_only": "weak"}  # examples alone are weak evidence
    assert [e.grade for e in report["keep"].examples] == ["validated"] * 3
    missing = report["missing"].examples[0]
    assert missing.rewrites == 1 and missing.expected == "rewrite it exactly 2 times"
    assert missing.location.startswith("wrong.fxr:10:")
    assert report["noisy"].examples[0].problem == "rewritten 1 time"
    assert "cannot be built or run" in report["unbuildable"].examples[0].problem
    assert "example at wrong.fxr:18" in report["wrong_example"].counterexample.facts[0]
    assert report["examples_only"].hosts_note.startswith("not verified on host graphs: no sampler")
    assert report["examples_only"].hosts_note.endswith(" (its examples verify it)")
    assert report["examples_only"].hosts_gap == "no-sampler"
    assert report.counts()["validated"] == 1 and report.counts()["weak"] == 1


def test_compare_by_contract():
    a = torch.tensor([1.0, float("nan")])
    assert compare(a, a.clone(), "exact").problem is None
    assert compare(a, a + 1e-7, "exact").problem is not None
    assert compare(a, a + 1e-7, "approx").problem is None
    assert "changed from float32[2] to float32[1]" in compare(a, a[:1], "approx").problem
    changes = compare(a, a[:1], "changes")
    assert changes.problem is None and changes.shapes_kept is False
    assert "had 1 outputs and has 2" in compare(a, (a, a), "approx").problem
    assert compare(a.half(), a.half(), "exact").problem is None


def test_found_counterexamples_are_kept_in_the_database(tmp_path):
    database = tmp_path / "db"
    report = _verify(WRONG_RULES["mul_two_is_x"], database=str(database), seed=None)
    assert report.verdicts[0].grade == "wrong"
    from hypothesis.database import DirectoryBasedExampleDatabase

    from fxrules.verifier.driver import database_key

    rule = fxrules.parse_rules(WRONG_RULES["mul_two_is_x"], "wrong.fxr")["wrong.fxr:1"]
    saved = list(DirectoryBasedExampleDatabase(str(database)).fetch(database_key(rule)))
    assert saved, "the counterexample was not saved under the rule's key"
    other = fxrules.parse_rules("[exact] call_function torch.neg(call_function torch.neg($x)) -> $x", "other.fxr")
    assert not list(DirectoryBasedExampleDatabase(str(database)).fetch(database_key(other["other.fxr:1"])))
    again = _verify(WRONG_RULES["mul_two_is_x"], database=str(database), seed=None, max_examples=1)
    assert again.verdicts[0].grade == "wrong"  # replayed from the database first


@pytest.mark.slow
def test_report_json_is_serialisable():
    report = _verify(WRONG_RULES["mul_two_is_x"] + "\n" + "[exact] call_function torch.neg(call_function "
                                                          "torch.neg($x)) where is_floating($x) and not is_constant($x) and $x.is_contiguous() -> $x")
    data = json.loads(json.dumps(report.to_json()))
    assert data["ok"] is False and data["counts"]["wrong"] == 1 and data["counts"]["validated"] == 1
    assert data["rules"][0]["counterexample"]["reproduce"].startswith("@reproduce_failure(")


@pytest.mark.slow
def test_verify_selects_rules_by_name():
    rules = fxrules.parse_rules("rule a [exact]:\n    call_function torch.neg(call_function torch.neg($x)) "
                                "where is_floating($x) and not is_constant($x) and $x.is_contiguous() -> $x\n"
                                "rule b [exact]:\n    call_function operator.mul($x, 2) -> $x\n")
    report = verify(rules, names=["a"], max_examples=15, seed=0, database=None)
    assert [v.rule for v in report.verdicts] == ["a"] and report.ok
    with pytest.raises(KeyError):
        verify(rules, names=["nope"], max_examples=5, seed=0, database=None)


# ---------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------


def _cli(*args, cwd=ROOT):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "fxrules", "verify", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
def test_cli_exit_codes_and_formats(tmp_path):
    good = tmp_path / "good.fxr"
    good.write_text("rule neg_neg [exact]:\n    call_function torch.neg(call_function torch.neg($x)) "
                    "where is_floating($x) and not is_constant($x) and $x.is_contiguous() -> $x\n"
                    "    example: call_function torch.neg(call_function torch.neg($x)) given $x: [2, 3]\n")
    bad = tmp_path / "bad.fxr"
    bad.write_text("[exact] call_function operator.mul($x, 2) -> $x\n")
    ok = _cli(str(good), "--max-examples", "15", "--seed", "1", "--no-database", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "neg_neg [exact]: validated" in ok.stdout
    wrong = _cli(str(bad), "--max-examples", "5", "--seed", "1", "--no-database", "--format", "json", cwd=tmp_path)
    assert wrong.returncode == 1, wrong.stderr
    data = json.loads(wrong.stdout)
    assert data["rules"][0]["grade"] == "wrong"
    assert data["rules"][0]["source"].endswith("bad.fxr:1")
    broken = tmp_path / "broken.fxr"
    broken.write_text("call_function torch.relu($x ->\n")
    usage = _cli(str(broken), cwd=tmp_path)
    assert usage.returncode == 2 and "broken.fxr:1:" in usage.stderr and "Traceback" not in usage.stderr
    missing = _cli(str(good), "--rule", "nope", cwd=tmp_path)
    assert missing.returncode == 2 and "no rule named 'nope'" in missing.stderr
    assert _cli(str(tmp_path / "absent.fxr"), cwd=tmp_path).returncode == 2


@pytest.mark.slow
def test_fxrules_verify_is_the_function():
    report = fxrules.verify(fxrules.parse_rules("[exact] call_function torch.neg(call_function torch.neg($x)) "
                                                "where not is_constant($x) -> $x"),
                            max_examples=15, seed=0, database=None)
    assert isinstance(report, fxrules.VerifyReport) and report.ok


@pytest.mark.slow
def test_the_pytest_helper_gives_one_test_per_rule(tmp_path):
    (tmp_path / "rules.fxr").write_text(
        "rule neg_neg [exact]:\n    call_function torch.neg(call_function torch.neg($x)) where is_floating($x) and not is_constant($x) and $x.is_contiguous() -> $x\n"
        "rule times_two [exact]:\n    call_function operator.mul($x, 2) -> $x\n")
    (tmp_path / "test_rules.py").write_text(
        "import pytest\n"
        "from fxrules.testing import assert_rule_verified, rule_cases\n\n"
        "@pytest.mark.parametrize('case', rule_cases('rules.fxr'))\n"
        "def test_rule(case):\n"
        "    assert_rule_verified(case, max_examples=15, seed=0, database=None)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_rules.py"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert "1 failed, 1 passed" in run.stdout, run.stdout + run.stderr
    assert "test_rule[times_two]" in run.stdout
    assert "times_two [exact]: wrong" in run.stdout and "counterexample" in run.stdout


def test_a_counterexample_replays_from_its_reproduce_line():
    (verdict,) = _verify(WRONG_RULES["relu_is_sigmoid"]).verdicts
    line = verdict.counterexample.reproduce
    assert verdict.counterexample.command.startswith("fxrules verify wrong.fxr --rule wrong.fxr:1 --reproduce \"@")
    (again,) = _verify(WRONG_RULES["relu_is_sigmoid"], reproduce=line, seed=None).verdicts
    assert again.grade == "wrong"
    assert again.counterexample.problem == verdict.counterexample.problem
    assert again.counterexample.code == verdict.counterexample.code
    (other,) = _verify("[exact] call_function torch.neg(call_function torch.neg($x)) where is_floating($x) and not is_constant($x) and $x.is_contiguous() -> $x",
                       reproduce=line).verdicts
    assert other.grade == "unverified" and "did not reproduce" in other.hosts_note
    assert other.hosts_gap == "did-not-reproduce"
    with pytest.raises(ValueError, match="not a reproduce line"):
        _verify(WRONG_RULES["relu_is_sigmoid"], reproduce="import os")


def test_a_nan_original_against_a_finite_rewrite_reports_an_infinite_relative_difference():
    """exp(log(x)) -> x on a negative x: the original is NaN, the rewrite finite. The counterexample's
    relative difference was printed as 0 (max() skipped the NaN of inf/NaN)."""
    original = torch.tensor([float("nan"), 2.0], dtype=torch.float64)
    rewritten = torch.tensor([-1.0, 2.0], dtype=torch.float64)
    outcome = compare(rewritten, original, "approx")
    assert outcome.problem is not None
    assert outcome.max_rel > 1e300 and outcome.max_abs > 1e300
    same = compare(original.clone(), original, "approx")
    assert same.problem is None and same.max_abs == 0 and same.max_rel == 0
