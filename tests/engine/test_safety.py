"""What fxrules gets right where torch.fx.subgraph_rewriter.replace_pattern does not.

Each test shows one defect of ``replace_pattern`` (asserting its wrong result, so the
test documents the defect) next to fxrules doing the right thing on the same model;
then the transactional guarantees: the caller's model is never modified, whether the
run succeeds or fails, for nn.Module, GraphModule and ExportedProgram inputs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.fx.subgraph_rewriter import replace_pattern
from torch.testing import assert_close

import fxrules
from tests.model_snapshots import assert_same_snapshot, snapshot_module, snapshot_program

# The failing builder lives in tests/helpers_builders.py and rule text names it as
# `tests.helpers_builders.*` (allow_imports=["tests"]): the repository root must be importable.
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.helpers_builders import BuilderBoom  # noqa: E402

# `print` becomes a call_function node when this module's code is traced.
torch.fx.wrap("print")

EXAMPLES = Path(__file__).resolve().parents[1] / "corpus" / "pass" / "language_examples.fxr"


@pytest.fixture(scope="module")
def examples() -> fxrules.RuleSet:
    return fxrules.load_rules(EXAMPLES)


def seeded(build, seed: int = 0):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def randn(*shape, seed: int = 1) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def op_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]


def count(gm: fx.GraphModule, target, op: str | None = None) -> int:
    return sum(1 for n in op_nodes(gm) if n.target == target and (op is None or n.op == op))


def module_types(module: nn.Module) -> set[type]:
    return {type(m) for m in module.modules()}


# ---------------------------------------------------------------------------
# (a) call_module is matched by type, not by attribute name
# ---------------------------------------------------------------------------


class LinearNamedFc(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)  # a Linear that is not called `linear`
        self.linear = nn.Conv2d(4, 4, 1)  # a Conv2d that is

    def forward(self, x, y):
        return self.fc(x), self.linear(y)


class LinearPattern(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        return self.linear(x)


def test_a_call_module_matched_by_type_not_name():
    model = seeded(LinearNamedFc).eval()
    x, y = randn(2, 4), randn(1, 4, 3, 3, seed=2)

    # replace_pattern: the pattern's `self.linear` matches by attribute name.
    gm = fx.symbolic_trace(model)
    matches = replace_pattern(gm, fx.symbolic_trace(LinearPattern()), lambda x: torch.relu(x))
    assert len(matches) == 1
    assert [n.target for n in gm.graph.nodes if n.op == "call_module"] == ["fc"]  # the Linear was missed...
    assert count(gm, torch.relu) == 1  # ...and the Conv2d named `linear` was rewritten
    out_fc, out_conv = gm(x, y)
    assert_close(out_conv, torch.relu(y))

    # fxrules: `call_module Linear` means the type.
    rules = fxrules.parse_rules("rule linear_to_relu [changes]: call_module Linear($x) -> call_function torch.relu($x)")
    result = fxrules.apply_rules(model, rules)
    assert result.counts == {"linear_to_relu": 1}
    assert [n.target for n in result.module.graph.nodes if n.op == "call_module"] == ["linear"]
    assert isinstance(result.module.get_submodule("linear"), nn.Conv2d)
    assert nn.Linear not in module_types(result.module)
    out_fc, out_conv = result.module(x, y)
    assert_close(out_fc, torch.relu(x))
    with torch.no_grad():
        assert_close(out_conv, model.linear(y))


# ---------------------------------------------------------------------------
# (b) in-place mutation between the matched nodes
# ---------------------------------------------------------------------------


class NegMutateRelu(nn.Module):
    def forward(self, x):
        a = x * 1  # an intermediate value
        b = torch.neg(a)  # read before the mutation
        a.add_(100)
        return torch.relu(b)


class NegRelu(nn.Module):
    def forward(self, x):
        a = x * 1
        return torch.relu(torch.neg(a))


SPELL_RELU_NEG = fxrules.parse_rules(
    "rule respell: call_function torch.relu(call_function torch.neg($a))"
    " -> call_function F.relu(call_function torch.neg($a))",
    source="respell.fxr",
)


def test_b_inplace_mutation_between_matched_nodes():
    model = NegMutateRelu()
    x = torch.linspace(-3, 3, 7)
    expected = model(x.clone())
    assert_close(expected, torch.relu(-x))

    # replace_pattern re-creates neg(a) next to the relu, after a.add_(100): the result changes.
    gm = fx.symbolic_trace(model)
    assert len(replace_pattern(gm, lambda a: torch.relu(torch.neg(a)), lambda a: F.relu(torch.neg(a)))) == 1
    wrong = gm(x.clone())
    assert not torch.allclose(wrong, expected)
    assert_close(wrong, torch.zeros(7))

    # fxrules refuses the match and says why.
    result = fxrules.apply_rules(model, SPELL_RELU_NEG)
    assert result.counts == {}
    [rejected] = result.report.rejected
    assert rejected.rule == "respell"
    assert rejected.code == "reads-across-mutation" and rejected.nodes == ("mul", "add_")
    assert "in place" in rejected.reason and "add_" in rejected.reason
    assert "respell" in result.report.table()
    assert_close(result.module(x.clone()), expected, rtol=0, atol=0)


def test_b_same_rule_applies_without_the_mutation():
    model = NegRelu()
    result = fxrules.apply_rules(model, SPELL_RELU_NEG)
    assert result.counts == {"respell": 1}
    assert count(result.module, F.relu) == 1 and count(result.module, torch.relu) == 0
    x = torch.linspace(-3, 3, 7)
    assert_close(result.module(x), model(x), rtol=0, atol=0)


def test_b_replacing_a_value_that_is_later_mutated_is_refused(examples):
    class M(nn.Module):
        def forward(self, x):
            y = x * 1  # replacing y by x would make the add_ below modify x
            y.add_(1)
            return x, y

    model = M()
    result = fxrules.apply_rules(model, examples.select(names=["mul_one"]))
    assert result.counts == {}
    assert [r.code for r in result.report.rejected] == ["replaced-node-mutated"]
    assert any("in place" in r.reason for r in result.report.rejected)
    x = randn(4)
    ex, ey = model(x.clone())
    ax, ay = result.module(x.clone())
    assert_close(ax, ex, rtol=0, atol=0)
    assert_close(ay, ey, rtol=0, atol=0)


# ---------------------------------------------------------------------------
# (c) one pass only
# ---------------------------------------------------------------------------


class TripleRelu(nn.Module):
    def forward(self, x):
        return torch.relu(torch.relu(torch.relu(x)))


def test_c_one_pass_versus_fixpoint(examples):
    gm = fx.symbolic_trace(TripleRelu())
    replace_pattern(gm, lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x))
    assert count(gm, torch.relu) == 2  # replace_pattern stops after one non-overlapping pass

    result = fxrules.apply_rules(TripleRelu(), examples.select(names=["relu_idempotent"]))
    assert count(result.module, torch.relu) == 1
    x = randn(9)
    assert_close(result.module(x), torch.relu(x), rtol=0, atol=0)


# ---------------------------------------------------------------------------
# (d) the spellings of one op
# ---------------------------------------------------------------------------


class ThreeRelus(nn.Module):
    def forward(self, x):
        return torch.relu(x) + F.relu(x) + x.relu()


def test_d_spellings_of_relu(examples):
    gm = fx.symbolic_trace(ThreeRelus())
    assert len(replace_pattern(gm, lambda x: torch.relu(x), lambda x: torch.sigmoid(x))) == 1
    assert count(gm, torch.sigmoid) == 1
    assert count(gm, F.relu) == 1 and count(gm, "relu", "call_method") == 1  # the other spellings are missed

    model = ThreeRelus()
    canonical = fxrules.apply_rules(model, examples.select(names=["canonical_relu"]))
    assert canonical.counts == {"canonical_relu": 2}
    assert count(canonical.module, torch.relu, "call_function") == 3
    assert len(op_nodes(canonical.module)) == 5
    x = randn(8)
    assert_close(canonical.module(x), model(x), rtol=0, atol=0)

    # canonical spelling first, then a rule written for torch.relu sees every relu
    to_sigmoid = fxrules.parse_rules(
        "rule relu_to_sigmoid [changes]: call_function torch.relu($x) -> call_function torch.sigmoid($x)",
        source="sig.fxr")
    result = fxrules.apply_rules(model, examples.select(names=["canonical_relu"]) + to_sigmoid)
    assert count(result.module, torch.sigmoid) == 3
    assert_close(result.module(x), 3 * torch.sigmoid(x))


# ---------------------------------------------------------------------------
# (e) positional versus keyword arguments
# ---------------------------------------------------------------------------


class TwoSums(nn.Module):
    def forward(self, x):
        return torch.sum(x, 1), torch.sum(x, dim=1)


def test_e_sum_positional_and_keyword():
    gm = fx.symbolic_trace(TwoSums())
    assert len(replace_pattern(gm, lambda x: torch.sum(x, 1), lambda x: torch.mean(x, 1))) == 1
    assert count(gm, torch.sum) == 1  # torch.sum(x, dim=1) is missed

    rules = fxrules.parse_rules("rule sum_to_mean [changes]: call_function torch.sum($x, 1) -> call_function torch.mean($x, 1)")
    result = fxrules.apply_rules(TwoSums(), rules)
    assert result.counts == {"sum_to_mean": 2}
    assert count(result.module, torch.sum) == 0
    x = randn(3, 4)
    for out in result.module(x):
        assert_close(out, x.mean(1))


# ---------------------------------------------------------------------------
# (f) leftover submodules and attributes
# ---------------------------------------------------------------------------


class DropoutZeroBias(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.5)
        self.zero = nn.Parameter(torch.zeros(4))

    def forward(self, x):
        return self.drop(x) + self.zero


class DropoutPattern(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(x)


def test_f_no_leftover_modules_or_parameters(examples):
    model = DropoutZeroBias().eval()
    x = randn(2, 4)

    gm = fx.symbolic_trace(model)
    assert len(replace_pattern(gm, fx.symbolic_trace(DropoutPattern()), lambda x: x)) == 1
    assert len(replace_pattern(gm, lambda x, b: x + b, lambda x, b: x)) == 1
    assert not any(n.op == "call_module" for n in gm.graph.nodes)
    assert "drop" in dict(gm.named_modules())  # the unused Dropout is still there
    assert [n.target for n in gm.graph.nodes if n.op == "get_attr"] == ["zero"]  # a dangling get_attr
    assert "zero" in gm.state_dict()  # and the unused parameter

    result = fxrules.apply_rules(model, examples.select(names=["remove_dropout", "add_zero_bias"]))
    out = result.module
    assert result.counts == {"remove_dropout": 1, "add_zero_bias": 1}
    assert op_nodes(out) == []
    assert dict(out.named_modules()) == {"": out}
    assert list(out.state_dict()) == [] and list(out.parameters()) == []
    assert not hasattr(out, "drop") and not hasattr(out, "zero")
    assert_close(out(x), model(x), rtol=0, atol=0)


def test_f_folded_batch_norm_leaves_nothing_behind(examples):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)
            self.bn = nn.BatchNorm2d(4)

        def forward(self, x):
            return self.bn(self.conv(x))

    model = seeded(M).eval()
    result = fxrules.apply_rules(model, examples.select(names=["fold_conv_bn"]))
    assert not any(isinstance(m, nn.BatchNorm2d) for m in result.module.modules())
    assert set(result.module.state_dict()) == {"conv.weight", "conv.bias"}
    x = randn(1, 3, 6, 6)
    with torch.no_grad():
        assert_close(result.module(x), model(x))


# ---------------------------------------------------------------------------
# (g) metadata on new nodes
# ---------------------------------------------------------------------------


def traced_with_meta() -> fx.GraphModule:
    class M(nn.Module):
        def forward(self, x):
            return torch.relu(torch.relu(x)) + 1

    gm = fx.symbolic_trace(M())
    for i, node in enumerate(gm.graph.nodes):
        node.meta["stack_trace"] = f'  File "model.py", line {i + 1}, in forward\n    {node.name} = ...'
        node.meta["nn_module_stack"] = {"block": ("block", nn.Module)}
    return gm


def test_g_new_nodes_get_meta():
    gm = traced_with_meta()
    replace_pattern(gm, lambda x: torch.relu(torch.relu(x)), lambda x: torch.sigmoid(x))
    [new] = [n for n in gm.graph.nodes if n.target is torch.sigmoid]
    assert "stack_trace" not in new.meta and "nn_module_stack" not in new.meta and "fxrules" not in new.meta

    original = traced_with_meta()
    root = next(n for n in original.graph.nodes if n.name == "relu_1")
    rules = fxrules.parse_rules(
        "rule relu2_to_sigmoid [changes]: call_function torch.relu(call_function torch.relu($x))"
        " -> call_function torch.sigmoid($x)", source="meta.fxr")
    result = fxrules.apply_rules(original, rules)
    [new] = [n for n in result.module.graph.nodes if n.target is torch.sigmoid]
    assert new.meta["stack_trace"] == root.meta["stack_trace"]
    assert new.meta["nn_module_stack"] == root.meta["nn_module_stack"]
    assert new.meta["fxrules"] == {"rule": "relu2_to_sigmoid", "source": "meta.fxr:1"}


# ---------------------------------------------------------------------------
# snapshots of the caller's model
# ---------------------------------------------------------------------------








# ---------------------------------------------------------------------------
# (h) a failing rule leaves the caller's model exactly as it was
# ---------------------------------------------------------------------------

BOOM_TEXT = """\
rule boom:
    call_module BatchNorm2d(call_module Conv2d($x) as conv) as bn
    -> call_module tests.helpers_builders.exploding_builder(conv, bn)($x)

rule pboom: call_function aten.add.Tensor($x, _) where tests.helpers_builders.exploding_predicate($x) -> $x
"""


@pytest.fixture(scope="module")
def boom() -> fxrules.RuleSet:
    return fxrules.parse_rules(BOOM_TEXT, source="boom.fxr", allow_imports=["tests"])


class DropConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.2)
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return torch.relu(torch.relu(self.bn(self.conv(self.drop(x)))))


def check_boom_error(err: "fxrules.RewriteError") -> None:
    assert isinstance(err, fxrules.FxrulesError)
    assert err.rule == "boom" and err.node == "bn" and err.source == "boom.fxr:1"
    text = str(err)
    assert "boom.fxr:1" in text and "`boom`" in text and "%bn" in text
    assert "this builder always fails" in text
    assert isinstance(err.__cause__, BuilderBoom)


def test_h_failing_builder_leaves_nn_module_unchanged(examples, boom):
    model = seeded(DropConvBN).eval()
    x = randn(1, 3, 6, 6)
    with torch.no_grad():
        expected = model(x)
    before = snapshot_module(model)
    # remove_dropout and relu_idempotent rewrite first (lower rule index); then the builder fails
    rules = examples.select(names=["remove_dropout", "relu_idempotent"]) + boom.select(names=["boom"])
    with pytest.raises(fxrules.RewriteError) as info:
        fxrules.apply_rules(model, rules)
    check_boom_error(info.value)
    assert_same_snapshot(before, snapshot_module(model))
    with torch.no_grad():
        assert_close(model(x), expected, rtol=0, atol=0)


def test_h_failing_builder_leaves_graph_module_unchanged(examples, boom):
    gm = fx.symbolic_trace(seeded(DropConvBN).eval())
    x = randn(1, 3, 6, 6)
    with torch.no_grad():
        expected = gm(x)
    before = snapshot_module(gm)
    rules = examples.select(names=["remove_dropout", "relu_idempotent"]) + boom.select(names=["boom"])
    with pytest.raises(fxrules.RewriteError) as info:
        fxrules.apply_rules(gm, rules)
    check_boom_error(info.value)
    assert_same_snapshot(before, snapshot_module(gm))
    with torch.no_grad():
        assert_close(gm(x), expected, rtol=0, atol=0)


class LinearReluReluAdd(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(torch.relu(self.fc(x))) + 1


@pytest.fixture(scope="module")
def program():
    model = seeded(LinearReluReluAdd).eval()
    x = randn(3, 4)
    return model, torch.export.export(model, (x,)), x


def test_h_failing_condition_leaves_exported_program_unchanged(examples, boom, program):
    _, ep, x = program
    expected = ep.module()(x)
    before = snapshot_program(ep)
    rules = examples.select(names=["aten_relu_idempotent"]) + boom.select(names=["pboom"])
    with pytest.raises(fxrules.RewriteError) as info:
        fxrules.apply_rules(ep, rules)
    err = info.value
    assert err.rule == "pboom" and err.source == "boom.fxr:5" and err.node == "add"
    assert "boom.fxr:5" in str(err) and "`pboom`" in str(err) and "%add" in str(err)
    assert isinstance(err.__cause__, BuilderBoom)
    assert_same_snapshot(before, snapshot_program(ep))
    assert_close(ep.module()(x), expected, rtol=0, atol=0)


# ---------------------------------------------------------------------------
# (i) rules that undo each other
# ---------------------------------------------------------------------------

LOOP = """\
rule a [changes]: call_function torch.relu -> call_function torch.sigmoid
rule b [changes]: call_function torch.sigmoid -> call_function torch.relu
"""


@pytest.mark.parametrize("max_iterations", [50, None])
def test_i_rule_loop_raises(max_iterations):
    class M(nn.Module):
        def forward(self, x):
            return torch.relu(x) + 1

    model = M()
    rules = fxrules.parse_rules(LOOP, source="loop.fxr")
    with pytest.raises(fxrules.RewriteLoopError) as info:
        fxrules.apply_rules(model, rules, max_iterations=max_iterations)
    err = info.value
    assert set(err.rules) == {"a", "b"}
    assert "`a`" in str(err) and "`b`" in str(err)
    assert isinstance(err, fxrules.FxrulesError)
    assert fx.symbolic_trace(model).code.count("torch.relu") == 1


def test_i_max_iterations_counts_rewrites(examples):
    class M(nn.Module):
        def forward(self, x):
            for _ in range(5):
                x = torch.relu(x)
            return x

    rules = examples.select(names=["relu_idempotent"])
    assert fxrules.apply_rules(M(), rules, max_iterations=4).counts == {"relu_idempotent": 4}
    with pytest.raises(fxrules.RewriteLoopError) as info:
        fxrules.apply_rules(M(), rules, max_iterations=3)
    assert info.value.rules == ["relu_idempotent"]


# ---------------------------------------------------------------------------
# (j) print() and in-place calls are never removed
# ---------------------------------------------------------------------------


class PrintsAndMutates(nn.Module):
    def forward(self, x):
        y = torch.relu(torch.relu(x))
        print(y)  # a call_function node: torch.fx.wrap("print") above
        z = y * 2
        z.add_(1)  # an in-place method call on an intermediate, result unused
        w = z.add_(1).relu()  # an in-place call inside a pattern's interior
        return z, w


ERASERS = """\
rule drop_print: call_function builtins.print($x) -> $x
rule drop_add_: call_method add_($x, 1) -> $x
rule skip_add_: call_method relu(call_method add_($x, 1)) -> call_method relu($x)
"""


def test_j_print_and_inplace_calls_survive(examples, capsys):
    model = PrintsAndMutates()
    rules = fxrules.parse_rules(ERASERS, source="erase.fxr") + examples.select(names=["relu_idempotent"])
    result = fxrules.apply_rules(model, rules)
    gm = result.module
    assert result.counts == {"relu_idempotent": 1}  # the pure rewrite still happens
    assert count(gm, print) == 1
    assert count(gm, "add_", "call_method") == 2
    reasons = {(r.rule, r.matched[0]): r.reason for r in result.report.rejected}
    assert {rule for rule, _ in reasons} == {"drop_print", "drop_add_", "skip_add_"}
    assert "side effect" in reasons[("drop_print", "print_1")] and "print" in reasons[("drop_print", "print_1")]
    assert all("in place" in reason for (rule, _), reason in reasons.items() if rule != "drop_print")
    assert {r.code for r in result.report.rejected} == {"drops-side-effect"}
    x = torch.linspace(-2, 2, 5)
    capsys.readouterr()
    expected = model(x)
    printed_by_model = capsys.readouterr().out
    actual = gm(x)
    assert capsys.readouterr().out == printed_by_model != ""
    assert_close(actual, expected, rtol=0, atol=0)


def test_j_replace_pattern_drops_an_inplace_call():
    class M(nn.Module):
        def forward(self, x):
            z = x * 2
            w = z.add_(1).relu()
            return z, w

    model = M()
    x = torch.tensor([-1.0, 0.0, 1.0])
    expected = model(x)
    gm = fx.symbolic_trace(model)
    assert len(replace_pattern(gm, lambda y: y.add_(1).relu(), lambda y: y.relu())) == 1
    assert count(gm, "add_") == 0
    z, w = gm(x)
    assert not torch.equal(z, expected[0])  # the mutation of z is lost

    rules = fxrules.parse_rules("rule skip_add_: call_method relu(call_method add_($x, 1)) -> call_method relu($x)")
    result = fxrules.apply_rules(model, rules)
    assert result.counts == {} and len(result.report.rejected) == 1
    for a, e in zip(result.module(x), expected):
        assert_close(a, e, rtol=0, atol=0)


def test_j_dead_code_cleanup_keeps_effects(examples):
    """Erasing a matched node never takes an unused in-place call or print with it."""

    class M(nn.Module):
        def forward(self, x):
            a = x * 1
            a.mul_(3)
            print(a)
            return torch.relu(torch.relu(a))

    model = M()
    result = fxrules.apply_rules(model, examples.select(names=["relu_idempotent", "mul_one"]))
    assert count(result.module, "mul_") == 1 and count(result.module, print) == 1
    x = randn(4)
    assert_close(result.module(x.clone()), model(x.clone()), rtol=0, atol=0)


# ---------------------------------------------------------------------------
# (k) successful runs never modify the caller's model
# ---------------------------------------------------------------------------


class Everything(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.act = nn.ReLU()
        self.drop = nn.Dropout(0.1)
        self.zero = nn.Parameter(torch.zeros(4, 1, 1))
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        x = self.drop(self.act(self.bn(self.conv(x))))
        x = torch.relu(torch.relu(x + self.zero))
        x = x.mean((2, 3)) * 1
        return self.fc(x.transpose(0, 1).transpose(0, 1))


RULES_K = ["remove_dropout", "relu_idempotent", "double_transpose", "mul_one", "fold_conv_bn", "relu_to_leaky",
           "add_zero_bias"]


def everything() -> Everything:
    model = seeded(Everything)
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 1.5)
    return model.eval()


def test_k_nn_module_input_is_not_modified(examples):
    model = everything()
    x = randn(2, 3, 5, 5)
    with torch.no_grad():
        expected = model(x)
    before = snapshot_module(model)
    result = fxrules.apply_rules(model, examples.select(names=RULES_K))
    assert set(result.counts) == set(RULES_K)
    assert_same_snapshot(before, snapshot_module(model))
    assert result.module is not model
    assert isinstance(model.act, nn.ReLU) and isinstance(model.bn, nn.BatchNorm2d)
    with torch.no_grad():
        assert_close(model(x), expected, rtol=0, atol=0)
        # relu_to_leaky changes the maths where the ReLU module sees negative inputs; here it does
        out = result.module(x)
    assert out.shape == expected.shape


def test_k_graph_module_input_is_not_modified(examples):
    gm = fx.symbolic_trace(everything())
    gm.meta["note"] = "kept"
    x = randn(2, 3, 5, 5)
    with torch.no_grad():
        expected = gm(x)
    before = snapshot_module(gm)
    names = [n for n in RULES_K if n != "relu_to_leaky"]
    result = fxrules.apply_rules(gm, examples.select(names=names))
    assert set(result.counts) == set(names)
    assert_same_snapshot(before, snapshot_module(gm))
    assert result.module is not gm and result.module.graph is not gm.graph
    assert result.module.meta.get("note") == "kept"
    with torch.no_grad():
        assert_close(gm(x), expected, rtol=0, atol=0)
        assert_close(result.module(x), expected)


def test_k_exported_program_input_is_not_modified(examples, program):
    model, ep, x = program
    expected = ep.module()(x)
    before = snapshot_program(ep)
    result = fxrules.apply_rules(ep, examples.select(names=["aten_relu_idempotent"]))
    assert result.counts == {"aten_relu_idempotent": 1}
    assert_same_snapshot(before, snapshot_program(ep))
    assert_close(ep.module()(x), expected, rtol=0, atol=0)
    assert_close(result.module(x), expected, rtol=0, atol=0)
    with torch.no_grad():
        assert_close(model(x), expected)


def test_k_find_matches_and_explain_do_not_modify(examples):
    model = everything()
    gm = fx.symbolic_trace(model)
    before_model, before_gm = snapshot_module(model), snapshot_module(gm)
    rules = examples.select(names=RULES_K)
    assert fxrules.find_matches(model, rules)
    assert fxrules.find_matches(gm, rules)
    fxrules.explain(model, rules)
    fxrules.explain(gm, rules)
    assert_same_snapshot(before_model, snapshot_module(model))
    assert_same_snapshot(before_gm, snapshot_module(gm))


def test_k_tensor_constants_stay_off_the_model(examples):
    """symbolic_trace stores tensor constants on the traced module; fxrules keeps them off the caller's."""

    class M(nn.Module):
        def forward(self, x):
            return torch.relu(torch.relu(x + torch.tensor([1.0, 2.0])))

    model = M()
    keys = set(model.__dict__)
    result = fxrules.apply_rules(model, examples.select(names=["relu_idempotent"]))
    assert set(model.__dict__) == keys
    assert not any(k.startswith("_tensor_constant") for k in model.__dict__)
    x = randn(2)
    assert_close(result.module(x), model(x), rtol=0, atol=0)


class TrainingBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(3)

    def forward(self, x):
        return torch.flatten(self.bn(x), 1)


def test_k_example_inputs_do_not_update_batch_norm_statistics(examples):
    """Computing shape metadata must not run the caller's modules for real: a BatchNorm in
    training mode would update its running statistics and num_batches_tracked."""
    model = TrainingBN().train()
    x = randn(4, 3)
    before = snapshot_module(model)
    result = fxrules.apply_rules(model, examples.select(names=["flatten_noop"]), example_inputs=(x,))
    assert result.counts == {"flatten_noop": 1}
    assert_same_snapshot(before, snapshot_module(model))


class NotFakeable(nn.Module):
    """torch.nonzero has a data-dependent shape, so fake-tensor propagation cannot run this graph."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(3)

    def forward(self, x):
        where = torch.nonzero(x)
        x.add_(1)  # an in-place op on the input
        return torch.flatten(self.bn(x), 1), where


def test_k_example_inputs_are_not_mutated_by_metadata_propagation(examples):
    model = NotFakeable().train()
    x = randn(4, 3)
    x_before = x.clone()
    before = snapshot_module(model)
    result = fxrules.apply_rules(model, examples.select(names=["flatten_noop"]), example_inputs=(x,))
    assert result.counts == {"flatten_noop": 1}
    assert torch.equal(x, x_before), "apply_rules modified the caller's example input in place"
    assert_same_snapshot(before, snapshot_module(model))
