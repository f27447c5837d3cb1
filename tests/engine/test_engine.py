"""The rewrite engine on real torch.fx graphs.

Every acceptance example of the rule language (tests/corpus/pass/language_examples.fxr)
is applied to a small hand-written module; each test compares the model's outputs
with the rewritten module's outputs and inspects the rewritten graph. Further tests
cover the matching semantics (keyword normalisation, `...`, literals, lists, multiple
roots and outputs, shared sub-expressions, in-place ops, get_attr and call_method
chains), node metadata, the report, find_matches, explain, and zoo models end to end.
"""

from __future__ import annotations

import operator
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.testing import assert_close

import fxrules
from fxrules import zoo

HERE = Path(__file__).resolve().parents[1]  # tests/
EXAMPLES = HERE / "corpus" / "pass" / "language_examples.fxr"
BUNDLED_RULES = HERE.parent / "rules"


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def examples() -> fxrules.RuleSet:
    return fxrules.load_rules(EXAMPLES)


def oneline(rule_set: fxrules.RuleSet, line: int) -> str:
    """The name of the unnamed one-line rule on ``line`` of the examples file (``<file>:<line>``)."""
    found = [r.name for r in rule_set if r.name.endswith(f":{line}") and r.name != f":{line}"]
    assert len(found) == 1, found
    return found[0]


def apply(rule_set: fxrules.RuleSet, model, *names: str, **kwargs) -> "fxrules.RewriteResult":
    return fxrules.apply_rules(model, rule_set.select(names=list(names)), **kwargs)


def op_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]


def targets(gm: fx.GraphModule) -> list:
    return [n.target for n in op_nodes(gm)]


def count(gm: fx.GraphModule, target, op: str | None = None) -> int:
    return sum(1 for n in op_nodes(gm) if n.target == target and (op is None or n.op == op))


def module_types(gm: nn.Module) -> set[type]:
    return {type(m) for m in gm.modules()}


def called_module_types(gm: fx.GraphModule) -> list[type]:
    return [type(gm.get_submodule(n.target)) for n in gm.graph.nodes if n.op == "call_module"]


def seeded(build, seed: int = 0):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def randn(*shape, seed: int = 1, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def assert_same_outputs(model, result, *inputs, exact: bool = False):
    with torch.no_grad():
        expected = model(*inputs)
        actual = result.module(*inputs)
    if exact:
        assert_close(actual, expected, rtol=0, atol=0)
    else:
        assert_close(actual, expected)
    return actual


# ---------------------------------------------------------------------------
# 1. the one-line forms
# ---------------------------------------------------------------------------


class LinearTimesTwo(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x) * 2


def test_oneline_rules_are_named_after_file_and_line(examples):
    names = [oneline(examples, line) for line in (9, 10, 11, 12)]
    for line, name in zip((9, 10, 11, 12), names):
        assert name.endswith(f"language_examples.fxr:{line}")
        assert examples[name].source.endswith(f"language_examples.fxr:{line}")


def test_oneline_linear_becomes_identity_forwarding_the_arguments(examples):
    model = seeded(LinearTimesTwo).eval()
    result = apply(examples, model, oneline(examples, 9))
    gm = result.module
    calls = [n for n in gm.graph.nodes if n.op == "call_module"]
    assert len(calls) == 1
    assert isinstance(gm.get_submodule(calls[0].target), nn.Identity)
    assert [a.op for a in calls[0].args] == ["placeholder"]  # the Linear's argument, forwarded unchanged
    assert nn.Linear not in module_types(gm)
    assert not any(k.endswith("weight") for k in gm.state_dict())
    x = randn(3, 4)
    assert_close(gm(x), x * 2)
    assert result.counts == {oneline(examples, 9): 1}


def test_oneline_dropout_becomes_identity(examples):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.drop = nn.Dropout(0.5)

        def forward(self, x):
            return self.drop(self.fc(x)) + 1

    model = seeded(M).eval()
    result = apply(examples, model, oneline(examples, 10))
    assert nn.Dropout not in module_types(result.module)
    assert called_module_types(result.module) == [nn.Linear, nn.Identity]
    assert_same_outputs(model, result, randn(2, 4), exact=True)


def test_oneline_relu_function_becomes_leaky_relu(examples):
    class M(nn.Module):
        def forward(self, x):
            return torch.relu(x) * 3

    model = M()
    result = apply(examples, model, oneline(examples, 11))
    assert count(result.module, torch.relu) == 0
    [leaky] = [n for n in op_nodes(result.module) if n.target is F.leaky_relu]
    assert leaky.op == "call_function" and leaky.args[0].op == "placeholder" and len(leaky.args) == 1
    x = randn(10)
    assert_close(result.module(x), F.leaky_relu(x) * 3)


def test_oneline_relu_method_becomes_torch_relu(examples):
    class M(nn.Module):
        def forward(self, x):
            return x.relu() - x.sigmoid()

    model = M()
    result = apply(examples, model, oneline(examples, 12))
    assert [n.op for n in op_nodes(result.module) if n.target in ("relu", torch.relu)] == ["call_function"]
    assert count(result.module, torch.relu, "call_function") == 1
    assert count(result.module, "sigmoid", "call_method") == 1  # other methods are left alone
    assert_same_outputs(model, result, randn(10), exact=True)


def test_oneline_rules_chain_to_a_fixpoint(examples):
    """x.relu() -> torch.relu(x) -> F.leaky_relu(x): the second rule fires on the first one's output."""

    class M(nn.Module):
        def forward(self, x):
            return x.relu()

    result = apply(examples, M(), oneline(examples, 11), oneline(examples, 12))
    assert targets(result.module) == [F.leaky_relu]
    x = randn(10)
    assert_close(result.module(x), F.leaky_relu(x))
    assert sum(result.counts.values()) == 2


# ---------------------------------------------------------------------------
# 2. named rules with nested patterns
# ---------------------------------------------------------------------------


class LinearDropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.drop1 = nn.Dropout(0.3)
        self.fc2 = nn.Linear(8, 2)
        self.drop2 = nn.Dropout(0.3)

    def forward(self, x):
        return self.drop2(self.fc2(self.drop1(torch.relu(self.fc1(x)))))


def test_remove_dropout(examples):
    model = seeded(LinearDropout).eval()
    result = apply(examples, model, "remove_dropout")
    gm = result.module
    assert nn.Dropout not in module_types(gm)
    assert called_module_types(gm) == [nn.Linear, nn.Linear]
    assert "drop1" not in dict(gm.named_modules()) and "drop2" not in dict(gm.named_modules())
    assert result.counts == {"remove_dropout": 2}
    assert result.report.nodes_before - result.report.nodes_after == 2
    assert_same_outputs(model, result, randn(3, 4), exact=True)


@pytest.mark.parametrize("depth", [2, 3, 5])
def test_relu_idempotent_reaches_fixpoint(examples, depth):
    class M(nn.Module):
        def forward(self, x):
            for _ in range(depth):
                x = torch.relu(x)
            return x + 1

    model = M()
    assert count(fx.symbolic_trace(model), torch.relu) == depth
    result = apply(examples, model, "relu_idempotent")
    assert count(result.module, torch.relu) == 1
    assert result.counts == {"relu_idempotent": depth - 1}
    relu = next(n for n in op_nodes(result.module) if n.target is torch.relu)
    assert relu.args[0].op == "placeholder"
    assert_same_outputs(model, result, randn(20), exact=True)


def test_double_transpose(examples):
    class M(nn.Module):
        def forward(self, x):
            a = x.transpose(0, 1).transpose(0, 1)  # cancels
            b = x.transpose(0, 1).transpose(1, 0)  # the same maths, but not the pattern's literals
            c = x.transpose(0, 1).transpose(0, 1).transpose(0, 1).transpose(0, 1)  # two pairs
            return a + b + c

    model = M()
    result = apply(examples, model, "double_transpose")
    assert result.counts == {"double_transpose": 3}
    remaining = [n for n in op_nodes(result.module) if n.target == "transpose"]
    assert [n.args[1:] for n in remaining] == [(0, 1), (1, 0)]
    assert_same_outputs(model, result, randn(3, 3), exact=True)


def test_mul_one_matches_literals_by_value_and_type(examples):
    class M(nn.Module):
        def forward(self, x):
            return x * 1, x * 1.0, x * True, x * 2, 1 * x

    model = M()
    result = apply(examples, model, "mul_one")
    # x * 1; 1 * x matches too (operator.mul commutes with a number, issue 19), but rewriting it as
    # well would make two outputs the same tensor: refused (output-alias-introduced)
    assert result.counts == {"mul_one": 1}
    assert [r.code for r in result.report.rejected] == [fxrules.RefusalCode.OUTPUT_ALIAS_INTRODUCED]
    muls = [n for n in op_nodes(result.module) if n.target is operator.mul]
    spelled = sorted(repr(n.args[1]) if isinstance(n.args[0], fx.Node) else f"{n.args[0]!r}*x" for n in muls)
    assert spelled == ["1*x", "1.0", "2", "True"]  # x*1 is gone; 1*x, x*1.0, x*True and x*2 stay
    out = result.module.graph.output_node().args[0]
    assert out[0].op == "placeholder"  # the first output is x itself
    assert_same_outputs(model, result, randn(5), exact=True)


def test_mul_one_on_integer_tensor(examples):
    class M(nn.Module):
        def forward(self, x):
            return (x * 1) + 3

    model = M()
    result = apply(examples, model, "mul_one")
    assert count(result.module, operator.mul) == 0
    x = torch.arange(6)
    assert torch.equal(result.module(x), model(x))


def test_add_self(examples):
    class M(nn.Module):
        def forward(self, x, y):
            return x + x, x + y

    model = M()
    result = apply(examples, model, "add_self")
    assert result.counts == {"add_self": 1}
    [mul] = [n for n in op_nodes(result.module) if n.target is operator.mul]
    assert mul.args[1] == 2 and type(mul.args[1]) is int
    assert count(result.module, operator.add) == 1  # x + y stays
    assert_same_outputs(model, result, randn(4), randn(4, seed=2), exact=True)


# ---------------------------------------------------------------------------
# 3. modules matched by type, attributes, builders
# ---------------------------------------------------------------------------


def test_square_linear_to_identity_matches_only_square_linears(examples):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.square = nn.Linear(4, 4)
            self.wide = nn.Linear(4, 6)

        def forward(self, x):
            return self.wide(self.square(x))

    model = seeded(M).eval()
    result = apply(examples, model, "square_linear_to_identity")
    gm = result.module
    assert result.counts == {"square_linear_to_identity": 1}
    assert [n.target for n in gm.graph.nodes if n.op == "call_module"] == ["wide"]
    assert "square" not in dict(gm.named_modules())
    assert not any(k.startswith("square.") for k in gm.state_dict())
    x = randn(2, 4)
    with torch.no_grad():
        assert_close(gm(x), model.wide(x))  # [changes]: the square layer is gone


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


def conv_bn(dtype=torch.float32) -> ConvBN:
    model = seeded(ConvBN)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(3)
        model.bn.running_mean.copy_(torch.rand(4, generator=gen) - 0.5)
        model.bn.running_var.copy_(torch.rand(4, generator=gen) + 0.5)
        model.bn.weight.copy_(torch.rand(4, generator=gen) + 0.5)
        model.bn.bias.copy_(torch.rand(4, generator=gen) - 0.5)
    return model.to(dtype).eval()


def test_fold_conv_bn_in_eval_mode(examples):
    model = conv_bn()
    result = apply(examples, model, "fold_conv_bn")
    gm = result.module
    assert result.counts == {"fold_conv_bn": 1}
    assert nn.BatchNorm2d not in module_types(gm)
    assert called_module_types(gm) == [nn.Conv2d]
    assert not any("running_mean" in k or "running_var" in k or "num_batches" in k for k in gm.state_dict())
    assert "bn" not in dict(gm.named_modules())
    # the folded conv is a new module, not the model's own (whose weights are unchanged)
    [name] = [n.target for n in gm.graph.nodes if n.op == "call_module"]
    assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", name) and "conv" in name
    assert gm.get_submodule(name) is not model.conv
    assert not gm.get_submodule(name).training
    assert_same_outputs(model, result, randn(2, 3, 8, 8), exact=False)


def test_fold_conv_bn_keeps_the_conv_name(examples):
    result = apply(examples, conv_bn(), "fold_conv_bn")
    assert [n.target for n in result.module.graph.nodes if n.op == "call_module"] == ["conv"]
    assert set(result.module.state_dict()) == {"conv.weight", "conv.bias"}


def test_fold_conv_bn_not_applied_in_training_mode(examples):
    model = conv_bn().train()
    result = apply(examples, model, "fold_conv_bn")
    assert result.counts == {}
    assert called_module_types(result.module) == [nn.Conv2d, nn.BatchNorm2d]
    near = fxrules.explain(model, examples.select(names=["fold_conv_bn"]))
    assert [m.rule for m in near] == ["fold_conv_bn"]
    assert near[0].code == "condition-false" and "condition" in near[0].reason


def test_fold_conv_bn_keeps_float64(examples):
    model = conv_bn(torch.float64)
    result = apply(examples, model, "fold_conv_bn")
    assert result.counts == {"fold_conv_bn": 1}
    assert {p.dtype for p in result.module.parameters()} == {torch.float64}
    x = randn(2, 3, 8, 8, dtype=torch.float64)
    out = assert_same_outputs(model, result, x)
    assert out.dtype == torch.float64


def test_relu_to_leaky_builds_a_new_module(examples):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.act = nn.ReLU()

        def forward(self, x):
            return self.act(x) + 1

    model = M()
    result = apply(examples, model, "relu_to_leaky")
    gm = result.module
    [call] = [n for n in gm.graph.nodes if n.op == "call_module"]
    new = gm.get_submodule(call.target)
    assert type(new) is nn.LeakyReLU and new.negative_slope == 0.01
    assert call.target == "act"  # the replaced module's name
    assert nn.ReLU not in module_types(gm)
    assert model.act.__class__ is nn.ReLU  # the caller's module is untouched
    x = randn(20)
    assert_close(gm(x), F.leaky_relu(x, 0.01) + 1)


@pytest.mark.parametrize("training", [False, True])
def test_new_module_copies_training_mode(examples, training):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.act = nn.ReLU()

        def forward(self, x):
            return self.act(x)

    model = M().train(training)
    result = apply(examples, model, "relu_to_leaky")
    assert result.module.get_submodule("act").training is training
    assert result.module.training is training


class _Wrapped(nn.Module):
    """A module with a submodule, called as one (a leaf for the tracer below)."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 4)

    def forward(self, x):
        return self.inner(x)


class _LeafTracer(fx.Tracer):
    def is_leaf_module(self, m, qualname):
        return isinstance(m, _Wrapped) or super().is_leaf_module(m, qualname)


@pytest.mark.parametrize("replaced", ["leaf", "with_submodules"])
def test_new_module_takes_the_dtype_and_mode_of_the_module_it_replaces(replaced):
    """A constructed module is made in torch's default dtype; it takes the replaced module's
    (float64 here) whether that module holds its tensors itself or in submodules."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.BatchNorm1d(4) if replaced == "leaf" else _Wrapped()

        def forward(self, x):
            return self.norm(x) + 1

    model = M().double().eval()
    source = "BatchNorm1d" if replaced == "leaf" else f"{__name__}._Wrapped"
    rules = fxrules.parse_rules(
        f"rule swap [changes]:\n    call_module {source}($x) -> call_module torch.nn.LayerNorm{{normalized_shape=4}}($x)\n",
        "<swap>", allow_imports=[__name__])
    gm = fx.GraphModule(model, _LeafTracer().trace(model))
    result = fxrules.apply_rules(gm, rules)
    [call] = [n for n in result.module.graph.nodes if n.op == "call_module"]
    new = result.module.get_submodule(call.target)
    assert type(new) is nn.LayerNorm and not new.training
    assert {p.dtype for p in new.parameters()} == {torch.float64}
    x = randn(3, 4, dtype=torch.float64)
    assert_close(result.module(x), F.layer_norm(x, (4,)) + 1)


def test_fresh_module_name_is_readable(examples):
    """A shared ReLU module: its first call site cannot take the name `act` (the other still calls it),
    so the new LeakyReLU gets a fresh name, which should read like a Python attribute name
    (e.g. `leaky_relu`), not a letter-by-letter split of the class name."""

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.act = nn.ReLU()

        def forward(self, x):
            return self.act(x) + self.act(x * 2)

    model = M()
    result = apply(examples, model, "relu_to_leaky")
    names = [n.target for n in result.module.graph.nodes if n.op == "call_module"]
    assert len(names) == 2 and "act" in names
    for name in names:
        assert isinstance(result.module.get_submodule(name), nn.LeakyReLU)
        parts = [p for p in name.split("_") if p and not p.isdigit()]
        assert all(len(p) > 1 for p in parts), f"unreadable module name {name!r}"
    x = randn(10)
    assert_close(result.module(x), F.leaky_relu(x, 0.01) + F.leaky_relu(2 * x, 0.01))


def test_replacement_calls_a_matched_module_again():
    rules = fxrules.parse_rules(
        "rule drop_after_fc: call_module Dropout(call_module Linear($x) as fc) -> call_module fc($x)",
        source="reuse.fxr")

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)
            self.drop = nn.Dropout()

        def forward(self, x):
            return self.drop(self.fc(x))

    model = seeded(M).eval()
    result = fxrules.apply_rules(model, rules)
    assert [n.target for n in result.module.graph.nodes if n.op == "call_module"] == ["fc"]
    assert result.module.fc is model.fc  # the kept leaf module is shared, as symbolic_trace shares it
    assert nn.Dropout not in module_types(result.module)
    assert_same_outputs(model, result, randn(2, 3), exact=True)


class ScaledLinear(nn.Linear):
    """Overrides forward: computes something else, so `call_module Linear` must not match it."""

    def forward(self, x):
        return super().forward(x) * 2


class PlainLinear(nn.Linear):
    """Inherits forward: a Linear in all but name."""


class LinearLeafTracer(fx.Tracer):
    def is_leaf_module(self, m, qualname):
        return isinstance(m, nn.Linear) or super().is_leaf_module(m, qualname)


def test_module_type_matching_and_subclasses(examples):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.scaled = ScaledLinear(4, 4)
            self.plain = PlainLinear(4, 4)

        def forward(self, x):
            # `* 1`: ScaledLinear overrides forward, so the engine does not know what it returns (it could be
            # x itself); returned as is, replacing plain(x) by x could make two outputs share storage
            return self.scaled(x) * 1, self.plain(x)

    model = seeded(M)
    result = apply(examples, model, "square_linear_to_identity", tracer=LinearLeafTracer())
    assert result.counts == {"square_linear_to_identity": 1}
    assert [n.target for n in result.module.graph.nodes if n.op == "call_module"] == ["scaled"]
    x = randn(2, 4)
    scaled, plain = result.module(x)
    with torch.no_grad():
        assert_close(scaled, model.scaled(x))
    assert_close(plain, x)


def test_rule_order_is_priority():
    rules = fxrules.parse_rules(
        """
rule first [changes]: call_function torch.relu($x) -> call_function torch.sigmoid($x)
rule second [changes]: call_function torch.relu($x) -> call_function torch.tanh($x)
""", source="order.fxr")

    class M(nn.Module):
        def forward(self, x):
            return torch.relu(x)

    assert targets(fxrules.apply_rules(M(), rules).module) == [torch.sigmoid]
    swapped = rules.select(names=["second"]) + rules.select(names=["first"])
    assert targets(fxrules.apply_rules(M(), swapped).module) == [torch.tanh]


def test_call_method_arguments_are_normalised():
    rules = fxrules.parse_rules(
        """
rule sum_to_mean [changes]: call_method sum($x, 1) -> call_method mean($x, 1)
rule transposes: call_method transpose(call_method transpose($x, 0, 1), 0, 1) -> $x
""", source="methods.fxr")

    class M(nn.Module):
        def forward(self, x):
            y = x.transpose(dim0=0, dim1=1).transpose(0, dim1=1)
            return y.sum(1), y.sum(dim=1), y.sum(1, keepdim=True), torch.sum(y, 1)

    result = fxrules.apply_rules(M(), rules)
    assert result.counts == {"sum_to_mean": 2, "transposes": 1}
    x = randn(3, 4)
    out = result.module(x)
    assert_close(out[0], x.mean(1))
    assert_close(out[1], x.mean(1))
    assert_close(out[2], x.sum(1, keepdim=True))
    assert_close(out[3], x.sum(1))  # call_function torch.sum is not call_method sum
    assert count(result.module, "transpose") == 0


# ---------------------------------------------------------------------------
# 5. alternation; 6. metadata conditions
# ---------------------------------------------------------------------------


def test_canonical_relu_handles_all_spellings(examples):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.act = nn.ReLU()

        def forward(self, x):
            return F.relu(x) + x.relu() + self.act(x) + torch.relu(x)

    model = M()
    result = apply(examples, model, "canonical_relu")
    gm = result.module
    assert result.counts == {"canonical_relu": 3}
    assert count(gm, torch.relu, "call_function") == 4
    assert not any(n.op in ("call_method", "call_module") for n in gm.graph.nodes)
    assert count(gm, F.relu) == 0
    assert nn.ReLU not in module_types(gm)
    assert_same_outputs(model, result, randn(10), exact=True)


def test_canonical_relu_leaves_inplace_spellings(examples):
    """F.relu(x, inplace=True) mentions an argument the pattern does not; an inplace ReLU module mutates."""

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.act = nn.ReLU(inplace=True)

        def forward(self, x):
            y = x * 2
            z = self.act(y)  # mutates y
            w = F.relu(x - 1, inplace=True)
            return y + z, w

    model = M()
    result = apply(examples, model, "canonical_relu")
    assert result.counts == {}
    assert count(result.module, F.relu) == 1
    assert called_module_types(result.module) == [nn.ReLU]
    assert any(r.code == "drops-side-effect" and "in place" in r.reason for r in result.report.rejected)
    assert_same_outputs(model, result, randn(10), exact=True)


class TwoFlattens(nn.Module):
    def forward(self, x, y):
        return torch.flatten(x, 1) * 2, torch.flatten(y, 1)


def test_flatten_noop_without_metadata_raises(examples):
    with pytest.raises(fxrules.RewriteError) as info:
        apply(examples, TwoFlattens(), "flatten_noop")
    err = info.value
    assert err.rule == "flatten_noop"
    assert "flatten_noop" in str(err)
    assert "language_examples.fxr:52" in str(err)
    assert "example_inputs" in str(err)
    assert isinstance(err, fxrules.FxrulesError)


def test_flatten_noop_with_example_inputs(examples):
    x, y = randn(2, 3), randn(2, 3, 4, 4, seed=2)
    model = TwoFlattens()
    result = apply(examples, model, "flatten_noop", example_inputs=(x, y))
    assert result.counts == {"flatten_noop": 1}
    [kept] = [n for n in op_nodes(result.module) if n.target is torch.flatten]
    assert kept.args[0].name == "y"
    assert_same_outputs(model, result, x, y, exact=True)


# ---------------------------------------------------------------------------
# 7. aten targets on torch.export graphs
# ---------------------------------------------------------------------------


class TripleRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(torch.relu(torch.relu(self.fc(x)))) + 1


@pytest.fixture(scope="module")
def exported():
    model = seeded(TripleRelu).eval()
    x = randn(3, 4)
    return model, torch.export.export(model, (x,)), x


def test_aten_relu_idempotent_graph(examples, exported):
    _, ep, _ = exported
    result = apply(examples, ep, "aten_relu_idempotent")
    relu = torch.ops.aten.relu.default
    assert result.counts == {"aten_relu_idempotent": 2}
    assert count(result.module, relu) == 1
    new = [n for n in result.module.graph.nodes if "fxrules" in n.meta]
    assert new, "the rewrite created no nodes"
    for node in new:
        assert "val" in node.meta and isinstance(node.meta["val"], torch.Tensor)
        assert tuple(node.meta["val"].shape) == (3, 4)
        assert node.meta["fxrules"]["rule"] == "aten_relu_idempotent"
        assert "stack_trace" in node.meta  # inherited from the replaced aten node
    # the exported program itself is untouched
    assert count(ep.graph_module, relu) == 3


def test_aten_relu_idempotent_result_runs(examples, exported):
    model, ep, x = exported
    result = apply(examples, ep, "aten_relu_idempotent")
    with torch.no_grad():
        expected = ep.module()(x)
        assert_close(result.module(x), expected, rtol=0, atol=0)
        assert_close(expected, model(x))


# ---------------------------------------------------------------------------
# 8. parameters; 9. a named node used twice
# ---------------------------------------------------------------------------


def test_add_zero_bias(examples):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.zero = nn.Parameter(torch.zeros(4))
            self.nonzero = nn.Parameter(torch.full((4,), 0.5))

        def forward(self, x):
            return (x + self.zero) + self.nonzero

    # in training mode `zero` is a trainable parameter: removing it would stop training it (guards)
    refused = apply(examples, M(), "add_zero_bias")
    assert refused.counts == {} and [r.code for r in refused.report.rejected] == ["trainable-parameter-dropped"]
    model = M().eval()
    result = apply(examples, model, "add_zero_bias")
    gm = result.module
    assert result.counts == {"add_zero_bias": 1}
    assert [n.target for n in gm.graph.nodes if n.op == "get_attr"] == ["nonzero"]
    assert set(gm.state_dict()) == {"nonzero"}
    assert not hasattr(gm, "zero")
    assert count(gm, operator.add) == 1
    assert_same_outputs(model, result, randn(2, 4), exact=True)


def test_neg_twice_to_cat(examples):
    class M(nn.Module):
        def forward(self, x):
            a = torch.neg(x)
            return torch.add(a, a)

    result = apply(examples, M(), "neg_twice_to_cat")
    gm = result.module
    assert result.counts == {"neg_twice_to_cat": 1}
    assert targets(gm) == [torch.sigmoid, torch.sigmoid, torch.cat]
    cat = next(n for n in op_nodes(gm) if n.target is torch.cat)
    assert isinstance(cat.args[0], list) and [a.target for a in cat.args[0]] == [torch.sigmoid] * 2
    x = randn(3)
    assert_close(gm(x), torch.cat([torch.sigmoid(x), torch.sigmoid(x)]))


def test_named_node_reference_means_the_same_node(examples):
    """`add(neg($x) as a, a)`: two separate neg nodes are not the same node."""

    class M(nn.Module):
        def forward(self, x):
            return torch.add(torch.neg(x), torch.neg(x))

    result = apply(examples, M(), "neg_twice_to_cat")
    assert result.counts == {}
    assert count(result.module, torch.neg) == 2


# ---------------------------------------------------------------------------
# multi-root rules and multiple outputs
# ---------------------------------------------------------------------------

PAIR = fxrules.parse_rules(
    "rule pair [changes]: call_function torch.sigmoid($x), call_function torch.relu($x)"
    " -> call_function torch.tanh($x), call_function torch.relu($x)",
    source="pair.fxr",
)


def test_multi_root_rule():
    class M(nn.Module):
        def forward(self, x):
            return torch.sigmoid(x) * torch.relu(x)

    result = fxrules.apply_rules(M(), PAIR)
    gm = result.module
    assert result.counts == {"pair": 1}
    assert count(gm, torch.sigmoid) == 0
    assert count(gm, torch.tanh) == 1 and count(gm, torch.relu) == 1
    x = randn(10)
    assert_close(gm(x), torch.tanh(x) * torch.relu(x))


def test_multi_root_rule_with_roots_as_model_outputs():
    class M(nn.Module):
        def forward(self, x, y):
            return torch.relu(x), torch.sigmoid(x), torch.sigmoid(y)

    result = fxrules.apply_rules(M(), PAIR)
    gm = result.module
    assert result.counts == {"pair": 1}
    x, y = randn(5), randn(5, seed=2)
    relu_x, tanh_x, sig_y = gm(x, y)
    assert_close(relu_x, torch.relu(x))
    assert_close(tanh_x, torch.tanh(x))
    assert_close(sig_y, torch.sigmoid(y))  # sigmoid(y) has no relu(y) partner
    assert count(gm, torch.sigmoid) == 1


def test_multi_root_needs_the_same_capture():
    class M(nn.Module):
        def forward(self, x, y):
            return torch.sigmoid(x) + torch.relu(y)

    result = fxrules.apply_rules(M(), PAIR)
    assert result.counts == {}


def test_rewrite_of_one_of_several_outputs(examples):
    class M(nn.Module):
        def forward(self, x):
            r = torch.relu(torch.relu(x))
            return r, x * 1, x - 1

    model = M()
    result = apply(examples, model, "relu_idempotent", "mul_one")
    assert result.counts == {"relu_idempotent": 1, "mul_one": 1}
    outputs = result.module.graph.output_node().args[0]
    assert len(outputs) == 3 and outputs[1].op == "placeholder"
    assert_same_outputs(model, result, randn(6), exact=True)


# ---------------------------------------------------------------------------
# argument normalisation, `...`, lists
# ---------------------------------------------------------------------------

NORMALISE = fxrules.parse_rules(
    """
rule sum_to_mean [changes]: call_function torch.sum($x, 1) -> call_function torch.mean($x, 1)
rule leaky_to_relu [changes]: call_function F.leaky_relu($x, 0.2) -> call_function torch.relu($x)
""",
    source="normalise.fxr",
)

REST = fxrules.parse_rules(
    "rule sum_to_mean_rest [changes]: call_function torch.sum($x, 1, ...) -> call_function torch.mean($x, 1, ...)",
    source="rest.fxr",
)


class Reductions(nn.Module):
    def forward(self, x):
        return (torch.sum(x, 1), torch.sum(x, dim=1), torch.sum(x, 1, keepdim=True),
                F.leaky_relu(x, negative_slope=0.2), F.leaky_relu(x, 0.3))


def test_positional_and_keyword_arguments_are_the_same_call():
    result = fxrules.apply_rules(Reductions(), NORMALISE)
    assert result.counts == {"sum_to_mean": 2, "leaky_to_relu": 1}
    x = randn(3, 4)
    out = result.module(x)
    assert_close(out[0], x.mean(1))
    assert_close(out[1], x.mean(1))
    assert_close(out[2], x.sum(1, keepdim=True))  # keepdim=True is not mentioned: no match
    assert_close(out[3], torch.relu(x))
    assert_close(out[4], F.leaky_relu(x, 0.3))  # the literal 0.3 is not 0.2


def test_unmentioned_nondefault_argument_blocks_match_and_explain_says_why():
    near = fxrules.explain(Reductions(), NORMALISE, rule="sum_to_mean")
    [miss] = [m for m in near if m.node == "sum_3"]
    assert miss.code == "unexpected-argument" and "keepdim" in miss.reason and "..." in miss.reason
    assert miss.location.startswith("normalise.fxr:2:")


def test_ellipsis_accepts_and_forwards_the_rest():
    result = fxrules.apply_rules(Reductions(), REST)
    assert result.counts == {"sum_to_mean_rest": 3}
    [kept] = [n for n in op_nodes(result.module) if n.target is torch.mean and n.kwargs]
    assert kept.kwargs == {"keepdim": True}
    x = randn(3, 4)
    out = result.module(x)
    assert_close(out[2], x.mean(1, keepdim=True))
    assert out[2].shape == (3, 1)


def test_list_arguments():
    rules = fxrules.parse_rules(
        "rule cat_relu: call_function torch.cat([call_function torch.relu($a), call_function torch.relu($b)], dim=1)"
        " -> call_function torch.relu(call_function torch.cat([$a, $b], dim=1))",
        source="cat.fxr",
    )

    class M(nn.Module):
        def forward(self, x, y):
            return (torch.cat([torch.relu(x), torch.relu(y)], dim=1),
                    torch.cat([torch.relu(x), torch.relu(y)], 0),  # another dim: no match
                    torch.cat([torch.relu(x), torch.relu(y), x], dim=1))  # three items: no match

    model = M()
    result = fxrules.apply_rules(model, rules)
    assert result.counts == {"cat_relu": 1}
    gm = result.module
    first = gm.graph.output_node().args[0][0]
    assert first.target is torch.relu and first.args[0].target is torch.cat
    assert [a.name for a in first.args[0].args[0]] == ["x", "y"]
    assert_same_outputs(model, result, randn(2, 3), randn(2, 3, seed=2), exact=True)


# ---------------------------------------------------------------------------
# shared sub-expressions, in-place operations
# ---------------------------------------------------------------------------


def test_shared_interior_node_rejects_the_match(examples):
    class M(nn.Module):
        def forward(self, x):
            a = torch.relu(x)
            b = torch.relu(a)
            return b + a  # `a` is used outside relu(relu(x))

    model = M()
    result = apply(examples, model, "relu_idempotent")
    assert result.counts == {}
    [rejected] = result.report.rejected
    assert rejected.rule == "relu_idempotent"
    assert rejected.code == "interior-used-outside" and rejected.nodes == ("relu", "add")
    assert "interior" in rejected.reason and "outside" in rejected.reason
    assert count(result.module, torch.relu) == 2
    assert "relu_idempotent" in result.report.table()
    assert_same_outputs(model, result, randn(8), exact=True)


def test_inplace_on_input_after_the_match_still_rewrites_safely(examples):
    class M(nn.Module):
        def forward(self, x):
            y = torch.relu(torch.relu(x))
            x.add_(1)
            return y + x

    model = M()
    result = apply(examples, model, "relu_idempotent")
    assert result.counts == {"relu_idempotent": 1}
    assert count(result.module, "add_") == 1
    x = randn(6)
    expected = model(x.clone())
    assert_close(result.module(x.clone()), expected, rtol=0, atol=0)


def test_replacement_reading_across_inplace_mutation_is_rejected(examples):
    class M(nn.Module):
        def forward(self, x):
            y = x * 1  # a copy of x: replacing it by x would read x after the add_
            x.add_(1)
            return y + x

    model = M()
    result = apply(examples, model, "mul_one")
    assert result.counts == {}
    [rejected] = result.report.rejected
    assert rejected.code == "alias-mutated-later" and rejected.nodes == ("x", "add_", "mul")
    assert "in place" in rejected.reason
    x = randn(6)
    assert_close(result.module(x.clone()), model(x.clone()), rtol=0, atol=0)


def test_inplace_on_intermediate_value(examples):
    class M(nn.Module):
        def forward(self, x):
            h = x * 2
            t = h.transpose(0, 1).transpose(0, 1)
            s = torch.sigmoid(h)  # a copy, taken before the mutation
            h.mul_(3)
            return t + s

    model = M()
    result = apply(examples, model, "double_transpose")
    assert count(result.module, "mul_") == 1
    x = randn(3, 3)
    assert_close(result.module(x), model(x))


# ---------------------------------------------------------------------------
# get_attr rules, call_method chains
# ---------------------------------------------------------------------------


class Buffers(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.ones(3))
        self.register_buffer("v", torch.ones(2, 3))
        self.register_buffer("u", torch.full((3,), 2.0))

    def forward(self, x):
        return x * self.w, x * self.v, x * self.u


def test_get_attr_capture_with_conditions():
    rules = fxrules.parse_rules(
        "rule mul_ones: call_function operator.mul($x, get_attr $w) where $w.ndim == 1 and is_one($w) -> $x",
        source="attrs.fxr",
    )
    model = Buffers()
    result = fxrules.apply_rules(model, rules)
    gm = result.module
    assert result.counts == {"mul_ones": 1}
    assert sorted(n.target for n in gm.graph.nodes if n.op == "get_attr") == ["u", "v"]
    assert set(gm.state_dict()) == {"u", "v"}
    assert_same_outputs(model, result, randn(2, 3), exact=True)


def test_get_attr_by_qualified_name():
    rules = fxrules.parse_rules(
        "rule mul_u: call_function operator.mul($x, get_attr u) -> call_function operator.mul($x, 2.0)",
        source="named.fxr",
    )
    model = Buffers()
    result = fxrules.apply_rules(model, rules)
    gm = result.module
    assert result.counts == {"mul_u": 1}
    assert sorted(n.target for n in gm.graph.nodes if n.op == "get_attr") == ["v", "w"]
    assert "u" not in gm.state_dict()
    assert_same_outputs(model, result, randn(2, 3), exact=True)


def test_call_method_chain():
    rules = fxrules.parse_rules(
        "rule view_contiguous: call_method contiguous(call_method view($x, -1)) -> call_method reshape($x, -1)",
        source="chain.fxr",
    )

    class M(nn.Module):
        def forward(self, x):
            return x.view(-1).contiguous() + 1, x.view(2, -1).contiguous()

    model = M()
    result = fxrules.apply_rules(model, rules)
    assert result.counts == {"view_contiguous": 1}
    assert [n.target for n in op_nodes(result.module) if n.op == "call_method"] == ["reshape", "view", "contiguous"]
    assert_same_outputs(model, result, randn(2, 3), exact=True)


def test_method_relu_chain_collapses_to_one_torch_relu(examples):
    class M(nn.Module):
        def forward(self, x):
            return x.relu().relu().relu()

    model = M()
    result = apply(examples, model, oneline(examples, 12), "relu_idempotent")
    assert targets(result.module) == [torch.relu]
    assert_same_outputs(model, result, randn(7), exact=True)


# ---------------------------------------------------------------------------
# metadata of new nodes
# ---------------------------------------------------------------------------


def test_new_nodes_carry_fxrules_meta(examples):
    class M(nn.Module):
        def forward(self, x):
            return torch.relu(torch.relu(x))

    result = apply(examples, M(), "relu_idempotent")
    [relu] = [n for n in op_nodes(result.module)]
    assert relu.meta["fxrules"] == {"rule": "relu_idempotent", "source": examples["relu_idempotent"].source}
    assert relu.meta["fxrules"]["source"].endswith("language_examples.fxr:19")


def test_new_nodes_inherit_stack_trace_and_module_stack_from_the_replaced_node(examples):
    class M(nn.Module):
        def forward(self, x):
            return torch.relu(torch.relu(x)) + 1

    gm = fx.symbolic_trace(M())
    for i, node in enumerate(gm.graph.nodes):
        node.meta["stack_trace"] = f'  File "model.py", line {i + 10}, in forward'
        node.meta["nn_module_stack"] = {f"L{i}": (f"block{i}", nn.Module)}
    root = next(n for n in gm.graph.nodes if n.name == "relu_1")
    result = apply(examples, gm, "relu_idempotent")
    [new] = [n for n in result.module.graph.nodes if "fxrules" in n.meta]
    assert new.meta["stack_trace"] == root.meta["stack_trace"]
    assert new.meta["nn_module_stack"] == root.meta["nn_module_stack"]
    assert new.meta["fxrules"]["rule"] == "relu_idempotent"
    # untouched nodes keep their own metadata
    add = next(n for n in result.module.graph.nodes if n.target is operator.add)
    assert add.meta["stack_trace"].endswith("in forward")


def test_new_nodes_inherit_recorded_stack_traces(examples):
    class M(nn.Module):
        def forward(self, x):
            return torch.relu(torch.relu(x))

    tracer = fx.Tracer()
    tracer.record_stack_traces = True
    result = apply(examples, M(), "relu_idempotent", tracer=tracer)
    [new] = [n for n in result.module.graph.nodes if "fxrules" in n.meta]
    assert new.meta.get("stack_trace")


# ---------------------------------------------------------------------------
# the report, find_matches, explain
# ---------------------------------------------------------------------------


def test_counts_and_report_table(examples):
    model = seeded(LinearDropout).eval()

    class Wrapper(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, x):
            y = self.inner(x)
            return torch.relu(torch.relu(y)) * 1

    wrapper = Wrapper().eval()
    result = apply(examples, wrapper, "remove_dropout", "relu_idempotent", "mul_one")
    assert result.counts == {"remove_dropout": 2, "relu_idempotent": 1, "mul_one": 1}
    assert result.counts == result.report.counts
    table = result.report.table()
    for name in ("remove_dropout", "relu_idempotent", "mul_one"):
        assert name in table
    assert "language_examples.fxr:16" in table
    assert "4 rewrites" in table
    assert str(result) == table
    data = result.report.to_json()
    assert data["counts"] == result.counts
    assert data["nodes_before"] > data["nodes_after"]
    assert [a.rule for a in result.report.applied].count("remove_dropout") == 2
    assert_same_outputs(wrapper, result, randn(2, 4), exact=True)


def test_find_matches_does_not_modify(examples):
    class M(nn.Module):
        def forward(self, x):
            return torch.relu(torch.relu(torch.relu(x))) * 1

    gm = fx.symbolic_trace(M())
    code = gm.code
    names = [n.name for n in gm.graph.nodes]
    found = fxrules.find_matches(gm, examples.select(names=["relu_idempotent", "mul_one"]))
    assert gm.code == code and [n.name for n in gm.graph.nodes] == names
    by_rule = {}
    for match in found:
        by_rule.setdefault(match.rule, []).append(match)
    assert len(by_rule["relu_idempotent"]) == 2  # one pass, no fixpoint: relu_1 and relu_2
    assert {m.roots for m in by_rule["relu_idempotent"]} == {("relu_1",), ("relu_2",)}
    [mul] = by_rule["mul_one"]
    assert mul.captures == {"x": "relu_2"}
    assert mul.source.endswith("language_examples.fxr:25")
    assert all(m.rejected is None for m in found)


def test_find_matches_reports_would_be_rejections(examples):
    class M(nn.Module):
        def forward(self, x):
            a = torch.relu(x)
            return torch.relu(a) + a

    [match] = fxrules.find_matches(M(), examples.select(names=["relu_idempotent"]))
    assert match.code == "interior-used-outside" and match.rejected and "interior" in match.rejected


def test_explain_names_location_and_literal(examples):
    class M(nn.Module):
        def forward(self, x):
            return x * 2

    near = fxrules.explain(M(), examples, rule="mul_one")
    assert len(near) == 1
    miss = near[0]
    assert miss.rule == "mul_one" and miss.node == "mul"
    assert re.search(r"language_examples\.fxr:26:36$", miss.location)  # the literal `1` in the pattern
    assert miss.code == "literal-mismatch" and miss.reason == "expected the literal 1, found 2"
    text = str(miss)
    assert "mul_one" in text and "language_examples.fxr:26:36" in text


def test_explain_location_points_into_the_pattern(examples):
    """NearMiss.location is documented as the file:line:col of the pattern part that failed.

    The rule header `rule mul_one:` is on line 25; the pattern `call_function operator.mul($x, 1)`
    is on line 26, columns 5-37 (the literal `1` at column 36).
    """

    class M(nn.Module):
        def forward(self, x):
            return x * 2

    [miss] = fxrules.explain(M(), examples, rule="mul_one")
    match = re.search(r"language_examples\.fxr:(\d+):(\d+)$", miss.location)
    assert match, miss.location
    line, column = int(match.group(1)), int(match.group(2))
    assert (line, 5 <= column <= 37) == (26, True), miss.location


def test_explain_points_at_a_false_condition(examples):
    x = randn(2, 3, 4, 4)

    class M(nn.Module):
        def forward(self, x):
            return torch.flatten(x, 1)

    [miss] = fxrules.explain(M(), examples, rule="flatten_noop", example_inputs=(x,))
    assert miss.rule == "flatten_noop"
    assert re.search(r"language_examples\.fxr:53:\d+$", miss.location)  # the `where` clause
    assert miss.code == "condition-false" and "condition" in miss.reason


def test_explain_silent_on_unrelated_nodes(examples):
    class M(nn.Module):
        def forward(self, x):
            return torch.sigmoid(x)

    assert fxrules.explain(M(), examples) == []


# ---------------------------------------------------------------------------
# zoo models end to end
# ---------------------------------------------------------------------------


def has_bundled_rules() -> bool:
    return BUNDLED_RULES.is_dir() and any(BUNDLED_RULES.rglob("*.fxr"))


def example_cleanup_rules() -> fxrules.RuleSet:
    """The named, behaviour-preserving examples of language_examples.fxr.

    The unnamed one-liners demonstrate syntax (Linear -> Identity, relu -> leaky_relu change what a
    model computes although they carry the default contract), so they are left out.
    """
    rules = fxrules.load_rules(EXAMPLES)
    keep = [r.name for r in rules if r.contract in ("exact", "approx") and not r.name.startswith(str(EXAMPLES))]
    return rules.select(names=keep)


def cleanup_rules() -> fxrules.RuleSet:
    """The bundled rules (rules/) when the repository has them, else the behaviour-preserving examples."""
    if has_bundled_rules():
        return fxrules.load_rules(BUNDLED_RULES).select(contracts=["exact", "approx"])
    return example_cleanup_rules()


@pytest.fixture(scope="module", params=["bundled-or-examples", "examples"])
def cleanup(request):
    if request.param == "examples":
        if not has_bundled_rules():
            pytest.skip("same as bundled-or-examples: the repository has no rules/ directory")
        return example_cleanup_rules()
    return cleanup_rules()


@pytest.mark.parametrize("name", ["transformer", "resnet", "redundant", "mlp"])
def test_zoo_models_end_to_end(cleanup, name):
    model = getattr(zoo, name)()
    inputs = zoo.example_inputs(name)
    traced = fx.symbolic_trace(model)
    result = fxrules.apply_rules(model, cleanup, example_inputs=inputs)
    gm = result.module
    assert result.report.nodes_after <= result.report.nodes_before
    assert result.report.nodes_before == len(traced.graph.nodes)
    assert nn.Dropout not in module_types(gm)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in gm.modules())
    with torch.no_grad():
        assert_close(gm(*inputs), model(*inputs), rtol=1e-5, atol=1e-5)
        other = zoo.example_inputs(name, seed=7)
        assert_close(gm(*other), model(*other), rtol=1e-5, atol=1e-5)
    if name in ("resnet", "redundant"):
        assert result.counts.get("fold_conv_bn", 0) >= 1 or any("bn" in k for k in result.counts)
    if name == "redundant":
        assert result.report.nodes_after < result.report.nodes_before - 5


def test_transformer_graph_shrinks_only_where_rules_apply(cleanup):
    model = zoo.transformer()
    inputs = zoo.example_inputs("transformer")
    result = fxrules.apply_rules(model, cleanup, example_inputs=inputs)
    gm = result.module
    kinds = {n.op for n in gm.graph.nodes}
    assert {"call_function", "call_method", "call_module", "get_attr"} <= kinds
    assert [n.target for n in gm.graph.nodes if n.op == "get_attr"] == ["pos"]
    assert sum(1 for m in gm.modules() if isinstance(m, nn.LayerNorm)) == 3


def test_a_builder_that_declines_rejects_the_match_and_the_run_goes_on():
    """fxrules.builders.BuilderError means "not these modules": the match is refused and reported."""
    rules = fxrules.parse_rules(
        "rule fold_any [approx]:\n"
        "    call_module BatchNorm2d(call_module Conv2d($x) as conv) as bn\n"
        "    -> call_module fxrules.builders.fold_conv_bn(conv, bn)($x)\n"
        "rule relu_idem: call_function torch.relu(call_function torch.relu($x)) -> call_function torch.relu($x)\n",
        source="declines.fxr")

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)
            # training mode: fold_conv_bn declines (without running statistics, so calling it updates nothing
            # and removing its call would drop no effect)
            self.bn = nn.BatchNorm2d(4, track_running_stats=False)

        def forward(self, x):
            return torch.relu(torch.relu(self.bn(self.conv(x))))

    model = M().train()
    result = fxrules.apply_rules(model, rules)
    assert result.counts == {"relu_idem": 1}
    [rejection] = result.report.rejected
    assert rejection.rule == "fold_any" and "declined" in rejection.reason and "training" in rejection.reason
    assert rejection.code == "builder-declined"
    assert isinstance(result.module.bn, nn.BatchNorm2d)


# ---------------------------------------------------------------------------
# matched nodes the replacement would build again are kept
# ---------------------------------------------------------------------------


def test_replacement_keeps_a_matched_node_it_would_rebuild():
    """`relu(relu($x)) -> relu($x)`: the inner relu is kept (its name and place), the outer one
    removed; the kept node carries what a new node would."""
    rules = fxrules.parse_rules(
        "rule twice: call_function torch.relu(call_function torch.relu($x)) -> call_function torch.relu($x)",
        source="keep.fxr")

    class M(nn.Module):
        def forward(self, x):
            return torch.relu(torch.relu(x)) + 1

    gm = fx.symbolic_trace(M())
    for node in gm.graph.nodes:
        node.meta["stack_trace"] = f"trace of {node.name}"
    result = fxrules.apply_rules(gm, rules)
    [applied] = result.report.applied
    assert applied.created == () and applied.replaced_by == ("relu",)
    assert [n.name for n in op_nodes(result.module)] == ["relu", "add"]
    relu = result.module.graph.find_nodes(op="call_function", target=torch.relu)[0]
    assert relu.meta["stack_trace"] == "trace of relu_1"  # the replaced node's, as a new node's
    assert relu.meta["fxrules"] == {"rule": "twice", "source": "keep.fxr:1"}
    assert [n.name for n in op_nodes(gm)] == ["relu", "relu_1", "add"]  # the input is untouched
    assert gm.graph.find_nodes(op="call_function", target=torch.relu)[0].meta["stack_trace"] == "trace of relu"
    assert_same_outputs(gm, result, randn(4, 5), exact=True)


def test_replacement_keeps_a_chain_of_matched_nodes():
    """`Dropout(gelu(Linear($x) as l)) -> gelu(l($x))` keeps the linear and gelu nodes and removes
    only the dropout, as a hand-written pass would."""
    rules = fxrules.parse_rules(
        "rule chain: call_module Dropout(call_function torch.nn.functional.gelu(call_module Linear($x) as l)) as d "
        "where not d.training -> call_function torch.nn.functional.gelu(call_module l($x))", source="keep.fxr")

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.drop = nn.Linear(3, 3), nn.Dropout()

        def forward(self, x):
            return self.drop(F.gelu(self.fc(x))) * 2

    model = seeded(M).eval()
    result = fxrules.apply_rules(model, rules)
    [applied] = result.report.applied
    assert applied.created == ()
    assert [(n.op, n.name) for n in op_nodes(result.module)] == \
        [("call_module", "fc"), ("call_function", "gelu"), ("call_function", "mul")]
    assert_same_outputs(model, result, randn(2, 3), exact=True)


@pytest.mark.parametrize("replacement, kept", [
    ("call_function torch.add($x, 1)", True),
    ("call_function torch.add($x, 1.0)", False),   # another type: a new node
    ("call_function torch.add($x, True)", False),
    ("call_function torch.add($x, 2)", False),
    ("call_function torch.add($x, other=1)", False),  # written as a keyword: another call
])
def test_only_an_identical_call_keeps_a_matched_node(replacement, kept):
    rules = fxrules.parse_rules(
        f"rule r: call_function torch.neg(call_function torch.add($x, 1)) -> call_function torch.abs({replacement})",
        source="keep.fxr")

    class M(nn.Module):
        def forward(self, x):
            return torch.neg(torch.add(x, 1))

    gm = fx.symbolic_trace(M())
    result = fxrules.apply_rules(gm, rules)
    [applied] = result.report.applied
    [add] = [n for n in op_nodes(result.module) if n.target is torch.add]
    assert (add.name == "add") == kept
    assert len(applied.created) == (1 if kept else 2)
    assert len(op_nodes(result.module)) == 2


def test_identical_arguments():
    from torch.fx.immutable_collections import immutable_dict, immutable_list

    from fxrules.engine.planner import identical_arguments as _identical

    graph = fx.Graph()
    a, b = graph.placeholder("a"), graph.placeholder("b")
    assert _identical((a, [1, 2]), (a, immutable_list([1, 2])))
    assert _identical({"k": a}, immutable_dict({"k": a}))
    assert not _identical((a,), (b,))
    assert not _identical((a, [1, 2]), (a, (1, 2)))  # a list is not a tuple in the generated code
    assert not _identical((1,), (True,)) and not _identical((1,), (1.0,))
    assert not _identical((0.0,), (-0.0,))
    assert _identical((float("nan"),), (float("nan"),))  # written the same: the same call
    assert _identical((float("inf"), None, "s", torch.float32), (float("inf"), None, "s", torch.float32))
    assert not _identical({"a": 1, "b": 2}, {"b": 2, "a": 1})  # keyword order is code order
    assert not _identical((torch.ones(2),), (torch.ones(2),))  # tensors: never taken as equal
