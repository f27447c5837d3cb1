"""The bool-mask attention fusions (fxrules/library/fuse/attention_bool_mask.fxr) on hand-written models,
exported with ``torch.export`` (the ``aten_`` rules) and traced, and their fills given as 0-d tensors.

For each exported rule family added here (``aten_sdpa_where_mul_scale``, ``aten_sdpa_where_div_scale_mask``,
``aten_sdpa_masked_fill_div_scale``), the three wrong fusions inductor shipped in 2026 stay ruled out:
a permuted key taken for ``key.transpose(-2, -1)``, a match reaching into the reshape of the attention
output, and the permutation of 3-D attention matched as a wildcard. Each such model keeps its outputs
bit for bit (nothing fused) or, where the reshape follows a correct attention, fuses with the reshape
kept as written.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close

import fxrules
from tests.test_fuse import _fuse

EXPORT_RULES = fxrules.load_rules(fxrules.LIBRARY / "aten", fxrules.LIBRARY / "fuse")
TRACE_RULES = fxrules.load_rules(fxrules.LIBRARY / "cleanup", fxrules.LIBRARY / "fuse")
SDPA_TARGETS = (F.scaled_dot_product_attention, torch.ops.aten.scaled_dot_product_attention.default)
MIN32 = torch.finfo(torch.float32).min


def _key_t(k):
    return k.transpose(-1, -2)


def _set_fill(module: nn.Module, fill) -> None:
    """A number, or a tensor kept as a buffer (a 0-d fill as models keep it)."""
    if isinstance(fill, torch.Tensor):
        module.register_buffer("fill", fill)
    else:
        module.fill = fill


def _fill(module: nn.Module):
    """The fill, or what a function the test gave returns when forward runs."""
    return module.fill() if callable(module.fill) else module.fill


class WhereMulScale(nn.Module):
    """softmax(where(keep, q @ k' * 0.125, fill)) @ v, the fill a number (or a 0-d tensor the test gives)."""

    def __init__(self, key=_key_t, fill=MIN32, tail=None):
        super().__init__()
        self.key, self.tail = key, tail
        _set_fill(self, fill)

    def forward(self, q, k, v, keep):
        w = torch.where(keep, torch.matmul(q, self.key(k)) * 0.125, _fill(self))
        out = torch.matmul(F.softmax(w, dim=-1), v)
        return out if self.tail is None else self.tail(out)


class WhereDivScaleMask(nn.Module):
    """softmax(where(keep, q @ k' / 8, fill) + mask) @ v (inductor's pattern 19)."""

    def __init__(self, key=_key_t, fill=MIN32, tail=None):
        super().__init__()
        self.key, self.tail = key, tail
        _set_fill(self, fill)

    def forward(self, q, k, v, keep, mask):
        w = torch.where(keep, torch.matmul(q, self.key(k)) / 8.0, _fill(self)) + mask
        out = torch.matmul(F.softmax(w, dim=-1), v)
        return out if self.tail is None else self.tail(out)


class MaskedFillDivScale(nn.Module):
    """softmax((q @ k' / 8).masked_fill(drop, fill)) @ v (inductor's patterns 15 and 17)."""

    def __init__(self, key=_key_t, fill=float("-inf"), tail=None):
        super().__init__()
        self.key, self.tail = key, tail
        _set_fill(self, fill)

    def forward(self, q, k, v, drop):
        w = (torch.matmul(q, self.key(k)) / 8.0).masked_fill(drop, _fill(self))
        out = torch.matmul(F.softmax(w, dim=-1), v)
        return out if self.tail is None else self.tail(out)


def _keep(shape=(5, 5)):
    keep = torch.rand(shape) < 0.6
    keep[..., 0] = True  # every query keeps a key: the rules' domain
    return keep


def _inputs(model, d=8, square=False):
    torch.manual_seed(0)
    if square:  # every size equal: a wrong key layout still runs, computing other values
        q, k, v = (torch.randn(2, 5, 5, 5) for _ in range(3))
    else:
        q, k, v = torch.randn(2, 3, 5, d), torch.randn(2, 3, 5, d), torch.randn(2, 3, 5, 4)
    keep = _keep()
    if isinstance(model, WhereDivScaleMask):
        return q, k, v, keep, torch.randn(2, 1, 1, 5)
    if isinstance(model, MaskedFillDivScale):
        return q, k, v, ~keep
    return q, k, v, keep


def _sdpa_nodes(module) -> list:
    return [n for n in module.graph.nodes if n.op == "call_function" and n.target in SDPA_TARGETS]


def _exported(model, inputs):
    model.eval()
    program = torch.export.export(model, inputs)
    with torch.no_grad():
        reference = program.module()(*inputs)
    result = fxrules.apply_rules(program, EXPORT_RULES)
    with torch.no_grad():
        got = result.module(*inputs)
    return result, reference, got


def _traced(model, inputs):
    return _fuse(model, inputs, TRACE_RULES)


NEW_ATEN = {WhereMulScale: "aten_sdpa_where_mul_scale", WhereDivScaleMask: "aten_sdpa_where_div_scale_mask",
            MaskedFillDivScale: "aten_sdpa_masked_fill_div_scale"}
TRACED = {WhereMulScale: "sdpa_where_mul_scale", WhereDivScaleMask: "sdpa_where_div_scale_mask",
          MaskedFillDivScale: "sdpa_masked_fill_div_scale"}
FAMILIES = sorted(NEW_ATEN, key=lambda c: c.__name__)


@pytest.mark.parametrize("cls", FAMILIES, ids=lambda c: c.__name__)
@pytest.mark.slow
def test_exported_bool_mask_attention_fuses(cls):
    model = cls()
    result, reference, got = _exported(model, _inputs(model))
    assert result.counts.get(NEW_ATEN[cls]) == 1, result.counts
    (sdpa,) = _sdpa_nodes(result.module)
    assert sdpa.target is torch.ops.aten.scaled_dot_product_attention.default
    assert sdpa.kwargs["scale"] == pytest.approx(0.125)
    assert not any(n.target == torch.ops.aten.softmax.int for n in result.module.graph.nodes)
    assert_close(got, reference)


# ------------------------------------------------------------------- fills given as 0-d tensors

@pytest.mark.parametrize("cls", FAMILIES, ids=lambda c: c.__name__)
@pytest.mark.slow
def test_a_zero_d_buffer_fill_fuses_traced_and_exported(cls):
    model = cls(fill=torch.tensor(MIN32))
    result, reference, got = _exported(model, _inputs(model))
    assert result.counts.get(NEW_ATEN[cls]) == 1, result.counts
    assert_close(got, reference)
    model = cls(fill=torch.tensor(MIN32))
    result, reference, got = _traced(model, _inputs(model))
    assert result.counts.get(TRACED[cls]) == 1, result.counts
    assert_close(got, reference)


@pytest.mark.parametrize("cls", FAMILIES, ids=lambda c: c.__name__)
def test_a_tensor_constant_fill_fuses_traced(cls):
    """`torch.tensor(finfo.min)` in forward: symbolic_trace keeps it as a constant read with get_attr."""

    model = cls(fill=lambda: torch.tensor(MIN32))
    inputs = _inputs(model)
    traced = torch.fx.symbolic_trace(model)
    assert any(n.op == "get_attr" for n in traced.graph.nodes)
    result, reference, got = _traced(model, inputs)
    assert result.counts.get(TRACED[cls]) == 1, result.counts
    assert_close(got, reference)


@pytest.mark.parametrize("cls", FAMILIES, ids=lambda c: c.__name__)
@pytest.mark.slow
def test_a_buffer_fill_that_leaves_masked_keys_a_weight_is_not_fused(cls):
    model = cls(fill=torch.tensor(-1e4))
    result, reference, got = _exported(model, _inputs(model))
    assert not _sdpa_nodes(result.module), result.counts
    assert_close(got, reference, rtol=0, atol=0)
    model = cls(fill=torch.tensor(-1e4))
    result, reference, got = _traced(model, _inputs(model))
    assert not _sdpa_nodes(result.module), result.counts


def test_a_fill_the_graph_computes_is_not_fused():
    """A 0-d fill that is an input (its value unknown when the rule is tried) is never taken."""

    class Model(nn.Module):
        def forward(self, q, k, v, keep, fill):
            w = torch.where(keep, torch.matmul(q, k.transpose(-1, -2)) * 0.125, fill)
            return torch.matmul(F.softmax(w, dim=-1), v)

    inputs = _inputs(WhereMulScale()) + (torch.tensor(MIN32),)
    for run in (_exported, _traced):
        result, reference, got = run(Model(), inputs)
        assert not _sdpa_nodes(result.module), result.counts
        assert_close(got, reference, rtol=0, atol=0)


def test_a_buffer_fill_the_graph_writes_is_not_read():
    """A buffer written in place has no value when the rule is tried (the write changes what the next
    call reads): the condition on the fill is false, whatever the buffer holds now."""

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("fill", torch.tensor(MIN32))

        def forward(self, q, k, v, keep):
            w = torch.where(keep, torch.matmul(q, k.transpose(-1, -2)) * 0.125, _fill(self))
            self.fill.mul_(0.0)
            return torch.matmul(F.softmax(w, dim=-1), v)

    result = fxrules.apply_rules(Model(), TRACE_RULES, example_inputs=_inputs(WhereMulScale()))
    assert not _sdpa_nodes(result.module), result.counts
    control = fxrules.apply_rules(WhereMulScale(fill=torch.tensor(MIN32)), TRACE_RULES,
                                  example_inputs=_inputs(WhereMulScale()))
    assert len(_sdpa_nodes(control.module)) == 1  # the same buffer, not written: fused


def test_a_constant_export_lifts_is_read_through_its_copy():
    """`torch.tensor(-inf)` (or finfo.min) written in forward is lifted by export and read as
    `detach_(lift_fresh_copy(c))`: a fresh copy detached in place that nothing else reads, so the write
    is unobservable and the copy is matched through to the constant (attention_bool_mask.fxr, `lifted`).
    The masked_fill and the where spellings fuse, the copy and the detach go with the match."""

    class MaskedFill(nn.Module):
        def forward(self, q, k, v, drop):
            w = (torch.matmul(q, k.transpose(-1, -2)) / 8.0).masked_fill(drop, torch.tensor(float("-inf")))
            return torch.matmul(F.softmax(w, dim=-1), v)

    class Where(nn.Module):
        def forward(self, q, k, v, keep):
            w = torch.where(keep, torch.matmul(q, k.transpose(-1, -2)) / 8.0, torch.tensor(MIN32))
            return torch.matmul(F.softmax(w, dim=-1), v)

    for model, inputs, rule in ((MaskedFill(), _inputs(MaskedFillDivScale()), "aten_sdpa_masked_fill_div_scale"),
                                (Where(), _inputs(WhereMulScale()), "aten_sdpa_where_div_scale")):
        program = torch.export.export(model, inputs)
        lifted = [n.target for n in program.module().graph.nodes if n.op == "call_function"]
        assert torch.ops.aten.lift_fresh_copy.default in lifted and torch.ops.aten.detach_.default in lifted
        result, reference, got = _exported(model, inputs)
        assert result.counts == {rule: 1}, result.counts
        assert len(_sdpa_nodes(result.module)) == 1
        left = {n.target for n in result.module.graph.nodes if n.op == "call_function"}
        assert not left & {torch.ops.aten.lift_fresh_copy.default, torch.ops.aten.detach_.default}
        assert_close(got, reference)


def test_a_lifted_constant_read_elsewhere_too_is_left_alone():
    """The lifted fill is also added to the output: its detached copy has a reader outside the match, so
    nothing fuses (interior-used-outside), and the outputs are kept bit for bit."""

    class Model(nn.Module):
        def forward(self, q, k, v, drop):
            fill = torch.tensor(float("-inf"))
            w = (torch.matmul(q, k.transpose(-1, -2)) / 8.0).masked_fill(drop, fill)
            return torch.matmul(F.softmax(w, dim=-1), v), fill * 2

    result, reference, got = _exported(Model(), _inputs(MaskedFillDivScale()))
    assert not _sdpa_nodes(result.module), result.counts
    assert "interior-used-outside" in [r.code for r in result.report.rejected]
    for a, b in zip(got, reference):
        assert_close(a, b, rtol=0, atol=0)


# ------------------------------------------------- inductor's wrong fusions, for each new rule family

@pytest.mark.parametrize("cls", FAMILIES, ids=lambda c: c.__name__)
def test_a_permuted_key_is_not_taken_for_a_transpose(cls):
    """k.permute(0, 2, 3, 1) is not k.transpose(-2, -1); all sizes equal, so a wrong fusion would run."""
    model = cls(key=lambda k: k.permute(0, 2, 3, 1))
    inputs = _inputs(model, square=True)
    for run in (_exported, _traced):
        result, reference, got = run(model, inputs)
        assert not _sdpa_nodes(result.module), result.counts
        assert_close(got, reference, rtol=0, atol=0)


@pytest.mark.parametrize("cls", FAMILIES, ids=lambda c: c.__name__)
def test_the_reshape_of_the_attention_output_stays(cls):
    """The heads merged back (transpose + reshape) after the attention: the match ends at the second
    product, so the fused model has the reshape and the output's shape."""
    model = cls(tail=lambda o: o.transpose(1, 2).reshape(2, 5, -1))
    inputs = _inputs(model)
    for run, rules in ((_exported, NEW_ATEN), (_traced, TRACED)):
        result, reference, got = run(model, inputs)
        assert result.counts.get(rules[cls]) == 1, result.counts
        assert got.shape == reference.shape == (2, 5, 12)
        assert_close(got, reference)


@pytest.mark.parametrize("cls", FAMILIES, ids=lambda c: c.__name__)
@pytest.mark.slow
def test_a_3d_key_permutation_is_not_a_wildcard(cls):
    """In 3-D attention only the permutation (0, 2, 1) is the key transposed; (1, 0, 2) and (2, 1, 0)
    run on equal sizes and compute something else: never fused."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(5, 5, 5) for _ in range(3))
    keep = _keep()
    masks = {WhereMulScale: (keep,), WhereDivScaleMask: (keep, torch.randn(5, 5)), MaskedFillDivScale: (~keep,)}[cls]
    for perm in ((1, 0, 2), (2, 1, 0)):
        for run in (_exported, _traced):
            result, reference, got = run(cls(key=lambda k, perm=perm: k.permute(*perm)), (q, k, v) + masks)
            assert not _sdpa_nodes(result.module), (perm, result.counts)
            assert_close(got, reference, rtol=0, atol=0)
    result, reference, got = _traced(cls(key=lambda k: k.permute(0, 2, 1)), (q, k, v) + masks)
    assert_close(got, reference)  # the true transpose: fused or not, the outputs are kept
