"""The engine's contract guards (fxrules.engine.guards): one deliberately wrong rule per class.

Each wrong rule is refused with its stable code, before the graph is edited (the rewritten
model computes what the input computed, and find_matches/explain report the same refusal);
the bundled rules still apply where they are sound. Metadata of new nodes comes from fake
tensors: building it changes no module state and no global random state.
"""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn
from torch.testing import assert_close

import fxrules
from fxrules.engine.refusals import RefusalCode


def randn(*shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def seeded(build, seed: int = 0):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def rules(text: str):
    return fxrules.parse_rules(text, source="guards.fxr", allow_imports=["tests"])


# ---------------------------------------------------------------------------
# models and wrong rules, one per refusal code
# ---------------------------------------------------------------------------


class Broadcasts(nn.Module):
    """x (2, 1) plus a zero buffer (3,): the sum has shape (2, 3), not x's."""

    def __init__(self):
        super().__init__()
        self.register_buffer("zero", torch.zeros(3))

    def forward(self, x):
        return torch.add(x, self.zero) * 2


class ToDouble(nn.Module):
    def forward(self, x):
        return x.to(torch.float64) * 2


class ToMeta(nn.Module):
    def forward(self, x):
        return x.to("meta") * 2


class DetachedLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x).detach() * 2


class TransposedView(nn.Module):
    def forward(self, x):
        return x.t().contiguous().view(-1)


class ParameterPlusZero(nn.Module):
    def __init__(self):
        super().__init__()
        self.p = nn.Parameter(torch.ones(2, 3))

    def forward(self, x):
        return self.p + 0, x * 2


class ZeroBias(nn.Module):
    def __init__(self):
        super().__init__()
        self.zero = nn.Parameter(torch.zeros(3))

    def forward(self, x):
        return torch.add(x, self.zero) * 2


# code -> (rule text, model maker (already in its mode), input shape, the refusal's nodes, words in the reason)
GUARDS = {
    RefusalCode.SHAPE_CHANGED: (
        "rule wrong_broadcast [approx]: call_function torch.add($x, get_attr $b) where is_zero($b) -> $x",
        lambda: Broadcasts().eval(), (2, 1), ("add", "x"), ["float32[2, 3]", "float32[2, 1]", "shape"]),
    RefusalCode.DTYPE_CHANGED: (
        "rule wrong_to [exact]: call_method to($x, torch.float64) -> $x",
        lambda: ToDouble().eval(), (2, 3), ("to", "x"), ["float64[2, 3]", "float32[2, 3]", "dtype"]),
    RefusalCode.DEVICE_CHANGED: (
        "rule wrong_device [exact]: call_method to($x, 'meta') -> $x",
        lambda: ToMeta().eval(), (2, 3), ("to", "x"), ["on meta", "on cpu", "device"]),
    RefusalCode.REQUIRES_GRAD_CHANGED: (
        "rule wrong_detach [exact]: call_method detach($x) -> $x",
        lambda: seeded(DetachedLinear).train(), (2, 4), ("detach", "fc"), ["requires_grad"]),
    RefusalCode.LAYOUT_CHANGED: (
        "rule wrong_contiguous [exact]: call_method contiguous($x) -> $x",
        lambda: TransposedView().eval(), (2, 3), ("contiguous", "view", "t"), ["strides (2, 1)", "strides (1, 3)"]),
    # output-alias-introduced: the planner refuses first (tests/engine/test_refusals.py, test_effects.py)
    RefusalCode.TRAINABLE_PARAMETER_DROPPED: (
        "rule wrong_drop [exact]: call_function torch.add($x, get_attr $b) where is_zero($b) -> $x",
        lambda: ZeroBias().train(), (2, 3), ("add",), ["`zero`", "requires_grad=True"]),
}


@pytest.mark.parametrize("code", list(GUARDS), ids=str)
def test_each_guard_refuses_its_wrong_rule_before_editing(code):
    text, make, shape, nodes, words = GUARDS[code]
    model = make()
    x = randn(*shape)
    with torch.no_grad():
        expected = model(x)
    result = fxrules.apply_rules(model, rules(text), example_inputs=(x,))
    assert result.counts == {}
    [rejected] = result.report.rejected
    assert rejected.code is code and rejected.nodes == nodes
    for word in words:
        assert word in rejected.reason, rejected.reason
    assert rejected.rule in rejected.reason  # the refusal names the rule
    assert "rejected rule" in result.report.table() and rejected.reason[:60] in result.report.table()
    # refused before the graph was edited: the same computation, every node as traced
    with torch.no_grad():
        actual = result.module(x)
    for got, want in zip(actual if isinstance(actual, tuple) else (actual,),
                         expected if isinstance(expected, tuple) else (expected,)):
        assert got.shape == want.shape and got.dtype == want.dtype and got.device == want.device
        if want.device.type != "meta":
            assert_close(got, want, rtol=0, atol=0)
    assert [n.name for n in result.module.graph.nodes] == [n.name for n in torch.fx.symbolic_trace(model).graph.nodes]
    # the same refusal, nothing rewritten, from find_matches and explain
    found = fxrules.find_matches(model, rules(text), example_inputs=(x,))
    assert [(m.code, m.rejected) for m in found] == [(code, rejected.reason)]
    [miss] = [m for m in fxrules.explain(model, rules(text), example_inputs=(x,)) if m.stage == "refused"]
    assert miss.code is code and rejected.reason in miss.reason


def test_a_wrong_rule_is_refused_in_an_export_graph_from_its_values():
    ep = torch.export.export(Broadcasts().eval(), (randn(2, 1),))
    text = ("rule wrong_broadcast [approx]: call_function aten.add.Tensor($x, get_attr $b) where is_zero($b) -> $x")
    result = fxrules.apply_rules(ep, rules(text))
    assert result.counts == {} and [r.code for r in result.report.rejected] == [RefusalCode.SHAPE_CHANGED]
    assert_close(result.module(randn(2, 1)), ep.module()(randn(2, 1)), rtol=0, atol=0)


def test_without_metadata_the_value_guards_do_not_run():
    """No example inputs: shapes are unknown, so the guards that need them cannot decide (documented)."""
    result = fxrules.apply_rules(Broadcasts().eval(), rules(GUARDS[RefusalCode.SHAPE_CHANGED][0]))
    assert result.counts == {"wrong_broadcast": 1}


# ---------------------------------------------------------------------------
# what the guards let through
# ---------------------------------------------------------------------------


def test_a_changes_rule_that_changes_a_shape_is_applied_and_reported():
    text = "rule squash [changes]: call_function torch.add($x, get_attr $b) where is_zero($b) -> $x"
    x = randn(2, 1)
    result = fxrules.apply_rules(Broadcasts().eval(), rules(text), example_inputs=(x,))
    assert result.counts == {"squash": 1} and result.report.rejected == ()
    [change] = result.report.changes
    assert (change.rule, change.root, change.replacement, change.what) == ("squash", "add", "%x", "shape")
    assert change.before == "float32[2, 3] on cpu" and change.after == "float32[2, 1] on cpu"
    assert "changed: rule `squash` changed the shape of %add" in result.report.table()
    [applied] = result.report.to_json()["applied"]
    assert applied["changes"] == [{"root": "add", "replacement": "%x", "what": "shape",
                                   "before": "float32[2, 3] on cpu", "after": "float32[2, 1] on cpu"}]
    assert result.module(x).shape == (2, 1)


def test_layout_is_kept_where_a_later_node_or_the_caller_reads_strides():
    class NoView(nn.Module):
        def forward(self, x):
            return x.t().contiguous().sum(0) + 1

    class Returned(nn.Module):
        def forward(self, x):
            return x.t().contiguous() + 1

    text = GUARDS[RefusalCode.LAYOUT_CHANGED][0]
    x = randn(2, 3)
    # the output's strides would change (the add passes the transposed layout on), and the caller may
    # `.view` it: refused with metadata, the model's output named as the reader
    returned = fxrules.apply_rules(Returned(), rules(text), example_inputs=(x,))
    assert returned.counts == {} and [r.code for r in returned.report.rejected] == [RefusalCode.LAYOUT_CHANGED]
    assert "the model's output" in returned.report.rejected[0].reason
    returned.module(x).view(-1)  # what the caller could do before, it still can
    # a contiguous x: the strides agree, so the rule applies even though its root is returned
    contiguous_root = fxrules.apply_rules(Returned(), rules(text), example_inputs=(randn(1, 3),))
    assert contiguous_root.counts == {"wrong_contiguous": 1}
    # the reader walk is conservative (a reduction does not pass a layout on, yet counts): spurious
    # refusals are possible, missing ones are not
    result = fxrules.apply_rules(NoView(), rules(text), example_inputs=(x,))
    assert [r.code for r in result.report.rejected] == [RefusalCode.LAYOUT_CHANGED]
    assert_close(result.module(x), NoView()(x), rtol=0, atol=0)
    # without metadata the output does not count (docs/semantics.md): only in-graph readers do
    assert fxrules.apply_rules(Returned(), rules(text)).counts == {"wrong_contiguous": 1}
    # a stride reader after an elementwise op still counts: the op passes its input's layout on
    class ViewAfterAdd(nn.Module):
        def forward(self, x):
            return (x.t().contiguous() + 1).view(-1)

    refused = fxrules.apply_rules(ViewAfterAdd(), rules(text), example_inputs=(x,))
    assert [r.code for r in refused.report.rejected] == [RefusalCode.LAYOUT_CHANGED]
    # an [approx] rule may change strides: only values are promised
    approx = fxrules.apply_rules(Returned(), rules(text.replace("[exact]", "[approx]")), example_inputs=(x,))
    assert approx.counts == {"wrong_contiguous": 1}


def test_without_metadata_a_root_whose_strides_a_later_node_reads_is_not_replaced_by_an_existing_value():
    """-(-x) -> x on a strided x (every other row) read by .view: the layout guard cannot compare strides without example
    inputs, so it refuses there (the rewrite would make the view fail); with no stride reader, or with
    example inputs showing a contiguous x, the rule applies (tests/engine/test_scale.py's long chain too)."""
    class NegNegView(nn.Module):
        def forward(self, x):
            return (-(-x[::2])).view(-1)

    class NegNeg(nn.Module):
        def forward(self, x):
            return -(-x[::2]) + 1

    double_neg = rules("rule double_neg [exact]: call_function operator.neg(call_function operator.neg($x)) -> $x")
    refused = fxrules.apply_rules(NegNegView(), double_neg)
    assert refused.counts == {} and [r.code for r in refused.report.rejected] == [RefusalCode.LAYOUT_CHANGED]
    assert "cannot be compared" in refused.report.rejected[0].reason
    x = randn(4, 3)
    assert_close(refused.module(x), NegNegView()(x), rtol=0, atol=0)
    assert fxrules.apply_rules(NegNeg(), double_neg).counts == {"double_neg": 1}
    with_metadata = fxrules.apply_rules(NegNegView(), double_neg, example_inputs=(x,))
    assert [r.code for r in with_metadata.report.rejected] == [RefusalCode.LAYOUT_CHANGED]
    assert "strides (6, 1)" in with_metadata.report.rejected[0].reason


class ReshapeChainView(nn.Module):
    """reshape(reshape(x, -1), x's shape) read by .view: on a transposed x the chain copies (contiguous), the
    rewrite's single reshape is a view of x (x's strides), and the .view fails."""

    def forward(self, x):
        return x.reshape(-1).reshape(x.shape[0], x.shape[1]).view(-1), torch.relu(torch.relu(x.sum(0))).view(-1)


def test_without_metadata_a_new_call_that_chooses_its_layout_by_its_input_is_refused_before_a_stride_reader():
    library = fxrules.load_rules(fxrules.LIBRARY / "cleanup")
    x = randn(8, 4).t()
    result = fxrules.apply_rules(ReshapeChainView(), library)
    assert [(r.rule, r.code) for r in result.report.rejected] == [("reshape_chain", RefusalCode.LAYOUT_CHANGED)]
    assert "cannot be compared" in result.report.rejected[0].reason
    assert result.counts == {"relu_idempotent": 1}  # relu(relu(x)) -> relu(x) lays out as before: applied
    for got, want in zip(result.module(x), ReshapeChainView()(x)):
        assert_close(got, want, rtol=0, atol=0)
    # with metadata the strides decide: refused on the transposed x, applied on a contiguous one
    on_transposed = fxrules.apply_rules(ReshapeChainView(), library, example_inputs=(x,))
    assert "reshape_chain" not in on_transposed.counts
    on_contiguous = fxrules.apply_rules(ReshapeChainView(), library, example_inputs=(x.contiguous(),))
    assert on_contiguous.counts.get("reshape_chain") == 1


def test_the_verifier_replays_a_layout_refusal_without_metadata_and_catches_a_rewrite_the_engine_lets_through(
        monkeypatch):
    """The engine's table of layout-choosing calls is reviewed, not complete: where it misses one, the verifier
    (which applies with metadata, so sees the refusal) applies the rule again without metadata on that host
    and judges the result. Here the table is emptied: the unguarded reshape_chain makes the .view raise."""
    from torch import fx

    from fxrules.engine import guards
    from fxrules.verifier.driver import VerifyOptions, _check_rewrite

    host = fx.symbolic_trace(ReshapeChainView())
    single = fxrules.load_rules(fxrules.LIBRARY / "cleanup" / "reshape.fxr").select(names=["reshape_chain"])
    (rule,) = list(single)
    x = randn(8, 4).t()
    count, counterexample, _ = _check_rewrite(host, (x,), single, rule, VerifyOptions(), ("host",), host.code)
    assert count == 0 and counterexample is None  # the engine refuses it in both modes
    monkeypatch.setattr(guards, "LAYOUT_CHOOSING_METHODS", frozenset())
    count, counterexample, _ = _check_rewrite(host, (x,), single, rule, VerifyOptions(), ("host",), host.code)
    assert count == 0 and counterexample is not None
    assert counterexample.problem.startswith("applied without example inputs, the rewritten model raised")
    assert "with metadata the engine refuses it" in counterexample.problem and "strides (1, 4)" in counterexample.problem


def test_a_stride_reader_made_by_an_earlier_rewrite_counts_for_the_layout_guard():
    """The workpiece counts the graph's stride readers once and keeps the count as rewrites create and
    erase nodes: a `.view` made by an earlier rewrite of the same run makes a later [exact] match,
    without metadata, refused (the erasing side: the next test)."""
    class ReshapeThenNegNeg(nn.Module):
        def forward(self, x):
            s = x[::2]
            return s.reshape(-1) + 1, (-(-s)).reshape(-1) * 2

    to_view = "rule to_view [changes]: call_method reshape($x, $s) -> call_method view($x, $s)\n"
    double_neg = "rule double_neg [exact]: call_function operator.neg(call_function operator.neg($x)) -> $x\n"
    made = fxrules.apply_rules(ReshapeThenNegNeg(), rules(to_view + double_neg))
    assert made.counts == {"to_view": 2}
    assert [r.code for r in made.report.rejected] == [RefusalCode.LAYOUT_CHANGED]
    assert fxrules.apply_rules(ReshapeThenNegNeg(), rules(double_neg)).counts == {"double_neg": 1}


def test_workpiece_stride_reader_count_follows_created_and_erased_nodes():
    from fxrules.engine import guards
    from fxrules.engine.transaction import Workpiece

    class Plain(nn.Module):
        def forward(self, x):
            return x + 1

    gm = torch.fx.symbolic_trace(Plain())
    work = Workpiece(gm.graph, gm, class_name="Plain")
    assert not work.has_stride_reader()
    x = next(iter(gm.graph.nodes))
    with gm.graph.inserting_after(x):
        view = work.new_node("call_method", "view", (x, -1), {})
    work.created(view)
    assert work.has_stride_reader() and guards.count_stride_readers(gm.graph) == 1
    work.erase(view)
    assert not work.has_stride_reader() and guards.count_stride_readers(gm.graph) == 0


def test_output_aliasing_of_other_outputs_is_refused_and_of_inputs_allowed():
    class Copies(nn.Module):
        def forward(self, x):
            return x * 1, x

    class CloneOfParameter(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = nn.Parameter(torch.ones(3))

        def forward(self, x):
            return self.p.clone() + 0 * x.sum(), self.p.clone()

    class Scaled(nn.Module):
        def forward(self, x):
            return x * 1

    x = randn(3)
    mul_one = rules("rule r [exact]: call_function operator.mul($x, 1) -> $x")
    refused = fxrules.apply_rules(Copies(), mul_one, example_inputs=(x,))
    [rejected] = refused.report.rejected
    assert rejected.code is RefusalCode.OUTPUT_ALIAS_INTRODUCED and "another output, %x" in rejected.reason
    assert fxrules.apply_rules(Scaled(), mul_one, example_inputs=(x,)).counts == {"r": 1}  # returns its input
    out = fxrules.apply_rules(CloneOfParameter().eval(), rules("rule r [exact]: call_method clone($x) -> $x"),
                              example_inputs=(x,))
    assert [r.code for r in out.report.rejected] == [RefusalCode.OUTPUT_ALIAS_INTRODUCED]  # the returned clone
    assert out.counts == {"r": 1}  # the clone that feeds an add aliases nothing the model returns
    first, second = out.module(x)
    assert second.data_ptr() != out.module.p.data_ptr()
    # a value that already aliased the input may be replaced by the input (eval dropout returns it)
    class Drop(nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(0.5)

        def forward(self, x):
            return self.drop(x)

    kept = fxrules.apply_rules(Drop().eval(), rules("rule r [exact]: call_module Dropout($x) as d "
                                                    "where not d.training -> $x"), example_inputs=(x,))
    assert kept.counts == {"r": 1}


# ---------------------------------------------------------------------------
# trainable parameters and the bundled folds
# ---------------------------------------------------------------------------


class ConvBn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(self.conv(x))


def _conv_bn(trains: bool, frozen: bool = False) -> ConvBn:
    model = seeded(ConvBn)
    with torch.no_grad():
        model.bn.running_mean.uniform_(-1, 1)
        model.bn.running_var.uniform_(0.5, 2)
    model.train(trains)
    model.bn.eval()  # fine-tuning with frozen statistics: the batch norm is in eval mode
    if frozen:
        model.requires_grad_(False)
    return model


FOLD = fxrules.LIBRARY / "fold"


def test_the_bundled_fold_applies_to_a_model_in_eval_mode():
    model = _conv_bn(trains=False)
    x = randn(2, 3, 8, 8)
    for inputs in (None, (x,)):
        result = fxrules.apply_rules(model, FOLD, example_inputs=inputs)
        assert result.counts == {"fold_conv2d_bn": 1} and result.report.rejected == ()
        assert_close(result.module(x), model(x), rtol=1e-5, atol=1e-5)


def test_the_bundled_fold_is_refused_where_it_would_drop_trainable_parameters():
    model = _conv_bn(trains=True)
    x = randn(2, 3, 8, 8)
    result = fxrules.apply_rules(model, FOLD)
    assert result.counts == {}
    [rejected] = result.report.rejected
    assert rejected.code is RefusalCode.TRAINABLE_PARAMETER_DROPPED and rejected.nodes == ("bn",)
    assert "`conv.weight`" in rejected.reason or "`bn.weight`" in rejected.reason
    with torch.no_grad():
        assert_close(result.module(x), model(x), rtol=0, atol=0)
    assert {n for n, _ in result.module.named_parameters()} == {n for n, _ in model.named_parameters()}
    # frozen parameters train nothing: the fold applies
    frozen = _conv_bn(trains=True, frozen=True)
    folded = fxrules.apply_rules(frozen, FOLD, example_inputs=(x,))
    assert folded.counts == {"fold_conv2d_bn": 1}
    assert_close(folded.module(x), frozen(x), rtol=1e-5, atol=1e-5)


def test_a_rule_can_say_frozen():
    text = ("rule only_frozen [approx]: call_module BatchNorm2d(call_module Conv2d($x) as conv) as bn "
            "where not bn.training and frozen(conv) and frozen(bn) "
            "-> call_module fxrules.builders.fold_conv_bn(conv, bn)($x)")
    assert fxrules.apply_rules(_conv_bn(trains=False), rules(text)).counts == {}  # params require grad
    assert fxrules.apply_rules(_conv_bn(trains=False, frozen=True), rules(text)).counts == {"only_frozen": 1}
    param_rule = "rule r [exact]: call_function torch.add($x, get_attr $b) where is_zero($b) and frozen($b) -> $x"
    model = ZeroBias().train()
    assert fxrules.apply_rules(model, rules(param_rule)).counts == {}
    model.zero.requires_grad_(False)
    assert fxrules.apply_rules(model, rules(param_rule)).counts == {"r": 1}


def test_a_parameter_the_replacement_keeps_is_not_dropped():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.full((3,), 2.0))

        def forward(self, x):
            return torch.relu(torch.relu(x * self.w))

    text = "rule r [exact]: call_function torch.relu(call_function torch.relu($x)) -> call_function torch.relu($x)"
    model = Scaled().train()
    x = randn(3)
    result = fxrules.apply_rules(model, rules(text), example_inputs=(x,))
    assert result.counts == {"r": 1}
    assert_close(result.module(x), model(x), rtol=0, atol=0)


def test_an_exported_program_is_taken_as_inference():
    """An ExportedProgram keeps no training mode (its unlifted module says training=True always);
    fxrules takes it as inference, as the aten folds need (docs/semantics.md)."""
    ep = torch.export.export(_conv_bn(trains=False), (randn(2, 3, 8, 8),))
    result = fxrules.apply_rules(ep, fxrules.LIBRARY / "aten" / "fold.fxr")
    assert result.counts == {"aten_fold_conv2d_bn": 1}


# ---------------------------------------------------------------------------
# metadata without effects
# ---------------------------------------------------------------------------


class ConvOnly(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return torch.relu(self.conv(x))


def test_computing_a_new_modules_metadata_does_not_run_it():
    """The builder's fused module holds a train-mode batch norm; computing its node's meta['val']
    must not update its running statistics: before any call the rewritten model holds exactly
    the buffers the builder made."""
    text = ("rule fuse [approx]: call_module Conv2d($x) as conv "
            "-> call_module tests.engine.guard_builders.fuse_with_training_bn(conv)($x)")
    model = seeded(ConvOnly).train().requires_grad_(False)  # frozen: the fold may drop the conv's weight
    x = randn(2, 3, 8, 8)
    rng = torch.random.get_rng_state()
    result = fxrules.apply_rules(model, rules(text), example_inputs=(x,))
    assert torch.equal(torch.random.get_rng_state(), rng)
    assert result.counts == {"fuse": 1}
    [fused] = [m for m in result.module.modules() if type(m).__name__ == "FusedWithBatchNorm"]
    assert fused[1].training
    held = dict(fused.named_buffers())
    assert set(held) == set(fused.made_state)
    for name, made in fused.made_state.items():
        assert torch.equal(held[name], made), name
    [new] = [n for n in result.module.graph.nodes if n.op == "call_module"]
    assert tuple(new.meta["val"].shape) == (2, 4, 6, 6)


def test_a_new_module_in_training_mode_keeps_its_state_and_the_rng():
    text = "rule grow [changes]: call_function torch.relu($x) -> call_module BatchNorm2d{num_features=4}($x)"
    model = seeded(ConvOnly).train()
    x = randn(2, 3, 8, 8)
    rng = torch.random.get_rng_state()
    result = fxrules.apply_rules(model, rules(text), example_inputs=(x,))
    assert torch.equal(torch.random.get_rng_state(), rng)
    [bn] = [m for m in result.module.modules() if isinstance(m, nn.BatchNorm2d)]
    assert int(bn.num_batches_tracked) == 0 and torch.equal(bn.running_mean, torch.zeros(4))
    assert torch.equal(bn.running_var, torch.ones(4))


def test_random_replacements_do_not_draw_from_the_global_generator():
    text = ("rule noisy [changes]: call_function torch.relu($x) "
            "-> call_function torch.nn.functional.dropout($x, 0.5, True)")
    model = seeded(ConvOnly).eval()
    x = randn(2, 3, 8, 8)
    rng = torch.random.get_rng_state()
    result = fxrules.apply_rules(model, rules(text), example_inputs=(x,))
    assert result.counts == {"noisy": 1}
    assert torch.equal(torch.random.get_rng_state(), rng)


def test_a_value_that_fake_tensors_cannot_compute_is_computed_on_a_copy():
    """A module whose forward fake tensors refuse (it reads a value: .item()) runs as a deep copy,
    on zeros, with the generators forked: its state, the model's, and the RNG are unchanged."""
    model = seeded(ConvOnly).eval()
    x = randn(2, 3, 8, 8)
    text = ("rule count [approx]: call_module Conv2d($x) as conv "
            "-> call_module tests.engine.guard_builders.counts_calls(conv)($x)")
    rng = torch.random.get_rng_state()
    result = fxrules.apply_rules(model, rules(text), example_inputs=(x,))
    assert torch.equal(torch.random.get_rng_state(), rng)
    assert result.counts == {"count": 1}
    [counts] = [m for m in result.module.modules() if type(m).__name__ == "CountsCalls"]
    assert int(counts.calls) == 0
    [new] = [n for n in result.module.graph.nodes if n.op == "call_module"]
    assert tuple(new.meta["val"].shape) == (2, 4, 6, 6)


def test_the_input_model_is_not_modified_by_guards():
    model = _conv_bn(trains=True)
    before = copy.deepcopy(model.state_dict())
    fxrules.apply_rules(model, FOLD, example_inputs=(randn(2, 3, 8, 8),))
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


# ---------------------------------------------------------------------------
# the verifier's host graphs run with metadata: a guard refusal is a counterexample
# ---------------------------------------------------------------------------


def test_the_verifier_reports_a_guard_refusal_as_a_counterexample():
    """mul(x, ones_like(y)) -> x keeps every value, but not the shape where y broadcasts x: its
    example is refused by the engine (shape-changed), and the verifier grades the rule wrong."""
    text = ("rule keeps_values_not_shape [approx]: call_function torch.mul($x, call_function torch.ones_like($y)) "
            "-> $x\n"
            "    example: call_function torch.mul($x, call_function torch.ones_like($y)) given $x: [2, 1], $y: [2, 3]\n")
    report = fxrules.verify(fxrules.parse_rules(text, source="wrong.fxr"), max_examples=5, seed=0, database=None)
    [verdict] = report.verdicts
    assert verdict.grade == "wrong"
    assert verdict.counterexample.problem.startswith("the engine refused the rewrite (shape-changed)")


@pytest.mark.slow
def test_a_trainable_parameter_bound_by_a_capture_and_consumed_by_a_builder_is_not_dropped():
    """aten_fold_conv2d_bn binds batch norm's weight and bias with captures (`$beta`) and hands them to its
    builder: in a model that trains, the fold would take `beta` off the gradient path (found by the verifier)."""
    from torch import fx

    root = nn.Module()
    root.w = nn.Parameter(torch.randn(2, 3, 1, 1), requires_grad=False)
    root.beta = nn.Parameter(torch.zeros(2))  # trainable
    root.mean = nn.Parameter(torch.zeros(2), requires_grad=False)
    root.var = nn.Parameter(torch.ones(2), requires_grad=False)
    root.x = nn.Parameter(torch.randn(1, 3, 4, 4))
    g = fx.Graph()
    aten = torch.ops.aten
    conv = g.call_function(aten.conv2d.default, (g.get_attr("x"), g.get_attr("w"), None, [1, 1], [0, 0], [1, 1], 1))
    g.output(g.call_function(aten.batch_norm.default, (conv, None, g.get_attr("beta"), g.get_attr("mean"),
                                                       g.get_attr("var"), False, 0.0, 1e-5, False)))
    model = fx.GraphModule(root, g).train()
    result = fxrules.apply_rules(model, fxrules.LIBRARY, example_inputs=())
    assert "aten_fold_conv2d_bn" not in result.counts
    refused = [r for r in result.report.rejected if r.rule == "aten_fold_conv2d_bn"]
    assert [r.code for r in refused] == [RefusalCode.TRAINABLE_PARAMETER_DROPPED] and "`beta`" in refused[0].reason
    assert "beta" in dict(result.module.named_parameters())
    eval_result = fxrules.apply_rules(model.eval(), fxrules.LIBRARY, example_inputs=())
    assert eval_result.counts.get("aten_fold_conv2d_bn") == 1  # eval is inference: the fold applies


@pytest.mark.parametrize("gamma", [float("inf"), float("nan"), 3e38])
def test_the_bundled_folds_decline_non_finite_or_overflowing_folded_values(gamma):
    """aten_fold_conv2d_bn and fold_conv2d_bn with a batch-norm weight that is inf, NaN or so large that
    w * gamma / sqrt(var + eps) overflows float32: the folded conv would give inf/NaN where the original is
    finite or another inf (found by the verifier), so the builder declines and the model is kept."""
    from torch import fx

    library = fxrules.load_rules(fxrules.LIBRARY)
    root = nn.Module()
    root.w, root.mean, root.var = randn(2, 3, 1, 1).abs() + 2, torch.zeros(2), torch.ones(2)  # |w| * 3e38 overflows
    root.gamma, root.beta = torch.tensor([gamma, 1.0]), torch.zeros(2)
    g = fx.Graph()
    aten = torch.ops.aten
    x = g.placeholder("x")
    conv = g.call_function(aten.conv2d.default, (x, g.get_attr("w"), None, [1, 1], [0, 0], [1, 1], 1))
    g.output(g.call_function(aten.batch_norm.default, (conv, g.get_attr("gamma"), g.get_attr("beta"),
                                                       g.get_attr("mean"), g.get_attr("var"), False, 0.0, 1e-5, False)))
    model = fx.GraphModule(root, g).eval()
    inputs = (randn(1, 3, 4, 4),)
    result = fxrules.apply_rules(model, library.select(names=["aten_fold_conv2d_bn"]), example_inputs=inputs)
    assert result.counts == {} and [r.code for r in result.report.rejected] == [RefusalCode.BUILDER_DECLINED]
    assert "not finite" in result.report.rejected[0].reason
    assert_close(result.module(*inputs), model(*inputs), rtol=0, atol=0, equal_nan=True)

    modules = nn.Sequential(nn.Conv2d(3, 2, 1), nn.BatchNorm2d(2)).eval()
    with torch.no_grad():
        modules[0].weight.copy_(root.w)
        modules[1].weight[0] = gamma
    folded = fxrules.apply_rules(modules, library.select(names=["fold_conv2d_bn"]), example_inputs=inputs)
    assert folded.counts == {} and [r.code for r in folded.report.rejected] == [RefusalCode.BUILDER_DECLINED]
    # finite parameters fold as before
    assert fxrules.apply_rules(nn.Sequential(nn.Conv2d(3, 2, 1), nn.BatchNorm2d(2)).eval(),
                               library.select(names=["fold_conv2d_bn"]), example_inputs=inputs).counts == \
        {"fold_conv2d_bn": 1}


# -- layouts compared without building keys ------------------------------------------


@given(st.data())
def test_same_layout_answers_as_the_layout_keys_do(data):
    """guards._same_layout (integers compared as integers) answers what comparing the string layout keys
    answers, for tensors of any rank, with dims of length 1 (whose strides do not count) and strides
    that differ only there; the keys stay the answer for symbolic sizes."""
    from fxrules.engine import guards

    def tensor(shape):
        strides = [data.draw(st.integers(0, 40)) for _ in shape]
        return torch.empty_strided(shape, strides, device="meta")

    shape = data.draw(st.lists(st.integers(1, 3), min_size=0, max_size=4))
    a = tensor(shape)
    other = data.draw(st.sampled_from(["same strides", "other strides", "other shape"]))
    if other == "same strides":
        b = torch.empty_strided(shape, a.stride(), device="meta")
    elif other == "other strides":
        b = tensor(shape)
    else:
        b = tensor(data.draw(st.lists(st.integers(1, 3), min_size=0, max_size=4)))
    assert guards._same_layout(a, b) == (guards._layout_key(a) == guards._layout_key(b))


def test_output_storages_are_kept_through_the_workpiece_s_edits():
    """guards.OutputStorages keeps the outputs by storage between matches, told by the workpiece of a returned
    value replaced (``replace_uses``, ``repoint``) or given another value (``set_value``); an output node whose
    arguments change otherwise is read anew."""
    from fxrules.engine import guards
    from fxrules.engine.transaction import Workpiece

    class TwoOutputs(nn.Module):
        def forward(self, x):
            return torch.relu(x), torch.neg(x), torch.neg(x)

    gm = torch.export.export(TwoOutputs(), (torch.randn(2, 3),)).module()
    work = Workpiece(gm.graph, gm, class_name="TwoOutputs")
    index = guards.OutputStorages.of(work)
    relu, neg, neg_1 = index.outputs
    assert (relu.target, neg.target) == (torch.ops.aten.relu.default, torch.ops.aten.neg.default)
    x = next(n for n in gm.graph.nodes if n.op == "placeholder")
    x_key, neg_key = guards._storage(x.meta["val"]), guards._storage(neg.meta["val"])
    work.replace_uses(neg, x)
    assert guards.OutputStorages.of(work) is index  # told, kept
    assert index.outputs == [relu, x, neg_1] and index.counts[x_key] == 1 and not index.counts[neg_key]
    work.repoint(gm.graph.output_node(), neg_1, x)
    assert index.outputs == [relu, x, x] and index.counts[x_key] == 2 and index.where[x] == [1, 2]
    relu_key = guards._storage(relu.meta["val"])
    work.set_value(relu, x.meta["val"])  # relu now shares x's storage (as far as the guards know)
    assert guards.OutputStorages.of(work) is index and index.counts[x_key] == 3 and not index.counts[relu_key]
    assert index.first_sharing(work, x_key) == f"the output %{relu.name}"
    gm.graph.output_node().args = ((neg_1, x),)  # not through the workpiece
    again = guards.OutputStorages.of(work)
    assert again is not index and again.outputs == [neg_1, x] and again.counts[x_key] == 1


def _outputs_aliased_by_walking(work, match, values):
    """What guards.output_aliased answers, found by walking every output and get_attr node (its form before
    the outputs were indexed by storage): the reference for the property below."""
    from torch import fx

    from fxrules.engine import guards
    outputs: list = []
    for node in work.graph.find_nodes(op="output"):
        fx.node.map_arg(node.args, outputs.append)
    keys = [guards._storage(node.meta.get("val")) for node in outputs]

    def aliases(key, affected):
        if key is None:
            return []
        found = []
        for node in work.graph.find_nodes(op="get_attr"):
            if guards._storage(node.meta.get("val")) == key:
                kind = "parameter" if isinstance(work.attr_of(node.target), nn.Parameter) else "buffer"
                found.append(f"the {kind} `{node.target}`")
        found += [f"the output %{outputs[i].name}" for i, k in enumerate(keys) if i not in affected and k == key]
        return found

    for root, value in zip(match.roots, values):
        old, new = guards._storage(root.meta.get("val")), guards._storage(value)
        if new is None or new == old or not outputs:
            continue
        affected = [i for i, k in enumerate(keys) if k is not None and (k == old or outputs[i] is root)]
        if not affected:
            continue
        before = aliases(old, affected)
        added = [name for name in aliases(new, affected) if name not in before]
        if added:
            return outputs[affected[0]].name, added[0]
    return None


@given(data=st.data())
def test_the_output_aliasing_guard_answers_what_walking_every_output_answers(data):
    """Over a graph returning a random selection of its input, its parameters and buffer, views of them and
    fresh values (repeats included), with random rewires and values given between the questions: for each
    root and replacement value, guards.output_aliased (outputs and get_attr nodes indexed by storage) refuses
    exactly when the walk does, naming the same output and the same storage."""
    from types import SimpleNamespace

    from torch import fx

    from fxrules.engine import guards
    from fxrules.engine.driver import prepare

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = nn.Parameter(torch.randn(3, 3))
            self.register_buffer("b", torch.randn(3, 3))

    graph = fx.Graph()
    x = graph.placeholder("x")
    nodes = [x, graph.get_attr("p"), graph.get_attr("b")]
    for _ in range(data.draw(st.integers(2, 10))):
        base = data.draw(st.sampled_from(nodes))
        kind = data.draw(st.sampled_from(["t", "relu", "neg", "contiguous"]))
        nodes.append(graph.call_method(kind, (base,)) if kind in ("t", "contiguous")
                     else graph.call_function(getattr(torch, kind), (base,)))
    returned = data.draw(st.lists(st.sampled_from(nodes), min_size=0, max_size=6))
    graph.output(tuple(returned))
    work = prepare(fx.GraphModule(Model(), graph), example_inputs=(torch.randn(3, 3),))
    nodes = [n for n in work.graph.nodes if n.op != "output"]
    for _ in range(data.draw(st.integers(1, 6))):
        step = data.draw(st.sampled_from(["ask", "ask", "rewire", "value"]))
        if step == "rewire":  # an output reads another node (no cycle: `value` comes first)
            old = data.draw(st.sampled_from(nodes))
            value = data.draw(st.sampled_from(nodes))
            if value is not old and value < old:
                work.replace_uses(old, value)
            continue
        if step == "value":
            node, other = data.draw(st.sampled_from(nodes)), data.draw(st.sampled_from(nodes))
            work.set_value(node, other.meta["val"])
            continue
        root = data.draw(st.sampled_from(nodes))
        value = data.draw(st.sampled_from(nodes)).meta["val"]
        match = SimpleNamespace(roots=(root,), rule=SimpleNamespace(name="r"),
                                program=SimpleNamespace(replacements=(None,)))
        refusal = guards.output_aliased(work, match, (value,))
        expected = _outputs_aliased_by_walking(work, match, (value,))
        if expected is None:
            assert refusal is None
        else:
            assert refusal is not None and refusal.code is RefusalCode.OUTPUT_ALIAS_INTRODUCED
            output, storage = expected
            assert f"graph output %{output} share storage with {storage}:" in refusal.message


def _stride_reader_by_walking(root, outputs_read):
    """guards.stride_reader as it walked before it kept what it found: the reference for the property below."""
    from fxrules.engine import guards
    seen: set = set()
    stack = list(root.users)
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if guards.is_stride_reader(node) or (outputs_read and node.op == "output"):
            return node
        stack.extend(node.users)
    return None


@given(data=st.data())
def test_the_stride_reader_found_with_what_earlier_walks_found_is_the_one_a_fresh_walk_finds(data):
    """Over random graphs of elementwise calls, views and stride readers (``view``, ``stride``) reading one or
    two earlier nodes, the output reading some: asked for every node in a random order with one shared
    ``known`` per ``outputs_read``, stride_reader names the node the plain walk names."""
    from torch import fx

    from fxrules.engine import guards
    graph = fx.Graph()
    nodes = [graph.placeholder("x")]
    for _ in range(data.draw(st.integers(1, 24))):
        kind = data.draw(st.sampled_from(["neg", "add", "view", "stride", "t"]))
        a = data.draw(st.sampled_from(nodes))
        if kind == "add":
            made = graph.call_function(torch.add, (a, data.draw(st.sampled_from(nodes))))
        elif kind == "neg":
            made = graph.call_function(torch.neg, (a,))
        else:
            made = graph.call_method(kind, (a, -1) if kind == "view" else (a,))
        nodes.append(made)
    graph.output(tuple(data.draw(st.lists(st.sampled_from(nodes), max_size=3))))
    known = {False: guards.StrideWalks(False), True: guards.StrideWalks(True)}
    for node in data.draw(st.permutations(nodes)):
        for outputs_read in (False, True):
            assert guards.stride_reader(node, outputs_read=outputs_read, known=known[outputs_read]) \
                is _stride_reader_by_walking(node, outputs_read)


@given(data=st.data())
def test_what_stride_walks_found_is_kept_through_edits_where_it_holds(data):
    """Random graphs as above, edited through the workpiece (a node made, with a stride reader among them;
    a node's uses moved to another earlier node; one use repointed; a node without users erased), with
    every node asked about between the edits: the kept walks (Workpiece.stride_readers) name the node a fresh
    walk names."""
    from torch import fx

    from fxrules.engine import guards
    from fxrules.engine.transaction import Workpiece

    graph = fx.Graph()
    nodes = [graph.placeholder("x")]
    kinds = ["neg", "add", "view", "stride", "t"]

    def make(kind, a, b):
        if kind == "add":
            return graph.call_function(torch.add, (a, b))
        if kind == "neg":
            return graph.call_function(torch.neg, (a,))
        return graph.call_method(kind, (a, -1) if kind == "view" else (a,))

    for _ in range(data.draw(st.integers(1, 16))):
        nodes.append(make(data.draw(st.sampled_from(kinds)), data.draw(st.sampled_from(nodes)),
                          data.draw(st.sampled_from(nodes))))
    graph.output(tuple(data.draw(st.lists(st.sampled_from(nodes), max_size=3))))
    gm = fx.GraphModule(nn.Module(), graph)
    work = Workpiece(gm.graph, gm, class_name="Model")

    def ask():  # every node, in a drawn order
        for node in data.draw(st.permutations(list(gm.graph.nodes))):
            for outputs_read in (False, True):
                assert guards.stride_reader(node, outputs_read=outputs_read, known=work.stride_readers(outputs_read)) \
                    is _stride_reader_by_walking(node, outputs_read)

    ask()
    for _ in range(data.draw(st.integers(1, 8))):
        live = [n for n in gm.graph.nodes if n.op != "output"]
        edit = data.draw(st.sampled_from(["make", "move", "repoint", "erase"]))
        if edit == "make":
            at = data.draw(st.sampled_from(live[1:] + [gm.graph.output_node()]))
            earlier = [n for n in live if n < at]
            a, b = data.draw(st.sampled_from(earlier)), data.draw(st.sampled_from(earlier))
            kind = data.draw(st.sampled_from(kinds))
            args = (a, b) if kind == "add" else ((a, -1) if kind == "view" else (a,))
            with gm.graph.inserting_before(at):
                made = work.new_node("call_function" if kind in ("add", "neg") else "call_method",
                                     {"add": torch.add, "neg": torch.neg}.get(kind, kind), args, {})
            if data.draw(st.booleans()) and at.op != "output":  # the new node takes over a later node's uses
                work.replace_uses(at, made)
        elif edit == "move" and len(live) > 1:
            root = data.draw(st.sampled_from(live[1:]))
            value = data.draw(st.sampled_from([n for n in live if n < root]))
            work.replace_uses(root, value)
        elif edit == "repoint":
            users = [(u, i) for i in live for u in i.users]
            if users:
                user, old = data.draw(st.sampled_from(users))
                new = data.draw(st.sampled_from([n for n in live if n < user and n is not old] or [old]))
                work.repoint(user, old, new)
        elif edit == "erase":
            unused = [n for n in live if not n.users and n.op != "placeholder"]
            if unused:
                work.erase(data.draw(st.sampled_from(unused)))
        ask()


def test_what_stride_walks_found_is_kept_until_the_graph_is_edited():
    """Workpiece.stride_readers answers the same tables (one per ``outputs_read``) through the run; what a
    walk found below a node is dropped at the next edit, and what it found nothing below survives an edit
    that gives no node a way to a reader (here: a view below neg made a flatten, which reads no strides)."""
    from torch import fx

    from fxrules.engine import guards
    from fxrules.engine.transaction import Workpiece

    graph = fx.Graph()
    x = graph.placeholder("x")
    neg = graph.call_function(torch.neg, (x,))
    view = graph.call_method("view", (neg, -1))
    graph.output(view)
    gm = fx.GraphModule(nn.Module(), graph)
    work = Workpiece(gm.graph, gm, class_name="Model")
    known = work.stride_readers(False)
    assert guards.stride_reader(x, known=known) is view and known.found[neg] is view
    assert work.stride_readers(False) is known and work.stride_readers(True) is not known
    assert guards.stride_reader(view, known=known) is None and gm.graph.output_node() in known.none
    with gm.graph.inserting_before(view):
        flat = work.new_node("call_method", "flatten", (neg,), {})
    assert not known.found and known.none  # flatten reads no strides
    work.replace_uses(view, flat)  # the view's one user, the output, has no reader below it
    work.erase(view)
    assert work.stride_readers(False) is known and not known.found and known.none
    assert guards.stride_reader(x, known=known) is None and known.none >= {neg, flat}
    with gm.graph.inserting_before(gm.graph.output_node()):
        work.new_node("call_method", "stride", (flat,), {})  # a reader made: nothing is known any more
    assert not known.found and not known.none
