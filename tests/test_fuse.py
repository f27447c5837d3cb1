"""The fuse family (fxrules/library/fuse: the attention fusions of fuse/attention.fxr) on hand-written attention in the styles of real models.

Each module is traced with ``torch.fx.symbolic_trace`` (what ``apply_rules`` does with an
``nn.Module``) and rewritten with cleanup (which removes eval-mode Dropout modules) and fuse.
Where the family fuses, the rewritten graph calls ``scaled_dot_product_attention`` in place of
the softmax and the two products, and its outputs equal the original's within float32 rounding;
where it must not (GPT-2's causal ``torch.where`` mask, a scale computed in the graph, a permuted
key, half precision), nothing fuses and the outputs are the original's.
"""

from __future__ import annotations

import math
import operator

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close

import fxrules

from pathlib import Path

FUSE = fxrules.load_rules(fxrules.LIBRARY / "fuse")
CLEANUP_AND_FUSE = fxrules.load_rules(fxrules.LIBRARY / "cleanup", fxrules.LIBRARY / "fuse")
# The training-mode fusion of an active dropout into dropout_p changes the random numbers drawn:
# [changes], so it stays in incubating/ (incubating/README.md).
INCUBATING = Path(__file__).resolve().parents[1] / "incubating" / "attention.fxr"

HIDDEN, HEADS, BATCH, SEQ = 32, 4, 2, 6


class BertSelfAttention(nn.Module):
    """transformers' BertSelfAttention (eager): separate q/k/v Linear, view + permute into heads,
    q @ k.transpose(-1, -2) / sqrt(d) + extended mask, softmax(-1), Dropout, @ v, back to hidden."""

    def __init__(self):
        super().__init__()
        self.head_size = HIDDEN // HEADS
        self.query, self.key, self.value = (nn.Linear(HIDDEN, HIDDEN) for _ in range(3))
        self.dropout = nn.Dropout(0.1)

    def heads(self, x):
        x = x.view(x.size()[:-1] + (HEADS, self.head_size))
        return x.permute(0, 2, 1, 3)

    def forward(self, hidden, mask):
        q, k, v = self.heads(self.query(hidden)), self.heads(self.key(hidden)), self.heads(self.value(hidden))
        scores = torch.matmul(q, k.transpose(-1, -2))
        scores = scores / math.sqrt(self.head_size)
        scores = scores + mask
        probs = nn.functional.softmax(scores, dim=-1)
        probs = self.dropout(probs)
        context = torch.matmul(probs, v)
        context = context.permute(0, 2, 1, 3).contiguous()
        return context.view(context.size()[:-2] + (HIDDEN,))


class DistilBertAttention(nn.Module):
    """transformers' DistilBERT MultiHeadSelfAttention without its masked_fill: q / sqrt(d) before the
    product, k.transpose(2, 3), softmax(dim=-1), Dropout, @ v."""

    def __init__(self):
        super().__init__()
        self.dim_per_head = HIDDEN // HEADS
        self.q_lin, self.k_lin, self.v_lin = (nn.Linear(HIDDEN, HIDDEN) for _ in range(3))
        self.dropout = nn.Dropout(0.1)

    def shape(self, x):
        return x.view(BATCH, -1, HEADS, self.dim_per_head).transpose(1, 2)

    def forward(self, hidden):
        q, k, v = self.shape(self.q_lin(hidden)), self.shape(self.k_lin(hidden)), self.shape(self.v_lin(hidden))
        q = q / math.sqrt(self.dim_per_head)
        scores = torch.matmul(q, k.transpose(2, 3))
        weights = nn.functional.softmax(scores, dim=-1)
        weights = self.dropout(weights)
        context = torch.matmul(weights, v)
        return context.transpose(1, 2).contiguous().view(BATCH, -1, HIDDEN)


class VitAttention(nn.Module):
    """timm's vision_transformer.Attention: one qkv Linear, reshape + permute + unbind,
    (q @ k.transpose(-2, -1)) * scale, .softmax(dim=-1), Dropout(0), @ v, transpose + reshape."""

    def __init__(self):
        super().__init__()
        self.head_dim = HIDDEN // HEADS
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(HIDDEN, HIDDEN * 3)
        self.attn_drop = nn.Dropout(0.0)
        self.proj = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, HEADS, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = (q @ k.transpose(-2, -1)) * self.scale
        attn = attn.softmax(dim=-1)
        attn = self.attn_drop(attn)
        x = attn @ v
        x = x.transpose(1, 2).reshape(B, N, C)
        return self.proj(x)


class Gpt2Attention(nn.Module):
    """transformers' GPT2Attention (eager): a causal mask applied with torch.where from a buffer and a
    scale computed in the graph (value.size(-1) ** 0.5). Neither is an additive mask nor a number,
    so the family leaves it alone."""

    def __init__(self):
        super().__init__()
        self.head_dim = HIDDEN // HEADS
        self.c_attn = nn.Linear(HIDDEN, 3 * HIDDEN)
        self.attn_dropout = nn.Dropout(0.1)
        self.register_buffer("bias", torch.tril(torch.ones(SEQ, SEQ, dtype=torch.bool)).view(1, 1, SEQ, SEQ))

    def split_heads(self, x):
        return x.view(x.size()[:-1] + (HEADS, self.head_dim)).permute(0, 2, 1, 3)

    def forward(self, hidden):
        q, k, v = self.c_attn(hidden).split(HIDDEN, dim=2)
        q, k, v = self.split_heads(q), self.split_heads(k), self.split_heads(v)
        w = torch.matmul(q, k.transpose(-1, -2))
        w = w / torch.full([], v.size(-1) ** 0.5, dtype=w.dtype, device=w.device)
        causal = self.bias[:, :, :SEQ, :SEQ]
        w = torch.where(causal, w, torch.tensor(torch.finfo(torch.float32).min))
        w = nn.functional.softmax(w, dim=-1)
        w = self.attn_dropout(w)
        out = torch.matmul(w, v)
        return out.permute(0, 2, 1, 3).contiguous().view(hidden.size()[:-1] + (HIDDEN,))


def _sdpa_calls(graph_module):
    return [n for n in graph_module.graph.nodes
            if n.op == "call_function" and n.target is F.scaled_dot_product_attention]


def _fuse(model, inputs, rules=CLEANUP_AND_FUSE):
    model.eval()
    with torch.no_grad():
        reference = model(*inputs)
    result = fxrules.apply_rules(model, rules, example_inputs=inputs)
    with torch.no_grad():
        got = result.module(*inputs)
    return result, reference, got


def _hidden():
    torch.manual_seed(0)
    return torch.randn(BATCH, SEQ, HIDDEN)


def test_bert_attention_fuses_with_its_mask_and_scale():
    mask = torch.zeros(BATCH, 1, 1, SEQ)
    mask[0, ..., -2:] = torch.finfo(torch.float32).min  # padding, as BERT's extended attention mask
    result, reference, got = _fuse(BertSelfAttention(), (_hidden(), mask))
    assert result.counts.get("sdpa_div_scale_mask") == 1, result.counts
    (sdpa,) = _sdpa_calls(result.module)
    assert sdpa.kwargs["scale"] == pytest.approx(1 / math.sqrt(HIDDEN // HEADS))
    assert not any(n.target in (F.softmax, torch.softmax) for n in result.module.graph.nodes)
    assert_close(got, reference)
    # the output's permute and view back to hidden stay as written: the match ends at the matmul
    assert got.shape == (BATCH, SEQ, HIDDEN)


def test_distilbert_attention_fuses_its_prescaled_query():
    result, reference, got = _fuse(DistilBertAttention(), (_hidden(),))
    assert result.counts.get("sdpa_prescaled_div") == 1, result.counts  # k.transpose(2, 3): the last two dims
    assert len(_sdpa_calls(result.module)) == 1
    assert_close(got, reference)


def test_vit_attention_fuses():
    result, reference, got = _fuse(VitAttention(), (_hidden(),))
    assert result.counts.get("sdpa_mul_scale") == 1, result.counts
    (sdpa,) = _sdpa_calls(result.module)
    assert sdpa.kwargs["scale"] == pytest.approx((HIDDEN // HEADS) ** -0.5)
    assert_close(got, reference)


def test_vit_attention_fuses_in_float64():
    model = VitAttention().double()
    result, reference, got = _fuse(model, (_hidden().double(),))
    assert len(_sdpa_calls(result.module)) == 1
    assert_close(got, reference)


def test_gpt2_attention_with_a_causal_where_mask_is_left_alone():
    result, reference, got = _fuse(Gpt2Attention(), (_hidden(),))
    assert not _sdpa_calls(result.module)
    assert not any(r.startswith("sdpa_") for r in result.counts), result.counts
    assert_close(got, reference, rtol=0, atol=0)


class _Scores(nn.Module):
    """softmax(q @ key' * 0.125) @ v for a key' the test chooses, on (B, H, L, D) inputs."""

    def __init__(self, key_t):
        super().__init__()
        self.key_t = key_t

    def forward(self, q, k, v):
        return torch.matmul(F.softmax(torch.matmul(q, self.key_t(k)) * 0.125, dim=-1), v)


def _qkv(dtype=torch.float32, d=8):
    torch.manual_seed(1)
    return tuple(torch.randn(2, 3, 5, d, dtype=dtype) for _ in range(3))


def test_a_permuted_key_is_not_taken_for_a_transpose():
    """inductor's bug: key.permute(...) matched as key.transpose(-2, -1). Here the permute swaps the
    two middle dims and the last two (square, so the product runs): SDPA would compute another thing."""
    q, k, v = (torch.randn(2, 5, 5, 5) for _ in range(3))
    model = _Scores(lambda k: k.permute(0, 2, 3, 1))
    result, reference, got = _fuse(model, (q, k, v), FUSE)
    assert not _sdpa_calls(result.module), result.counts
    assert_close(got, reference, rtol=0, atol=0)


def test_a_transpose_of_other_dims_is_not_fused():
    q, k, v = (torch.randn(2, 5, 5, 5) for _ in range(3))
    model = _Scores(lambda k: k.transpose(1, 2))
    result, reference, got = _fuse(model, (q, k, v), FUSE)
    assert not _sdpa_calls(result.module), result.counts
    assert_close(got, reference, rtol=0, atol=0)


def test_softmax_over_another_dim_is_not_fused():
    class Model(nn.Module):
        def forward(self, q, k, v):
            return torch.matmul(F.softmax(torch.matmul(q, k.transpose(-2, -1)) * 0.125, dim=-2), v)

    q, k, v = (torch.randn(2, 3, 5, 8) for _ in range(3))
    result, reference, got = _fuse(Model(), (q, k, v), FUSE)
    assert not _sdpa_calls(result.module)
    assert_close(got, reference, rtol=0, atol=0)


def test_a_scale_computed_from_sizes_is_read_as_its_number():
    """q.size(-1) ** 0.5 is a graph value whose metadata is the number it had with the example inputs;
    conditions cannot tell it from a literal, so the rule bakes it in (see the rule file's comment):
    the result holds for inputs of that head size. A tensor-valued scale is never taken."""
    class Model(nn.Module):
        def forward(self, q, k, v):
            scores = torch.matmul(q, k.transpose(-2, -1)) / (q.size(-1) ** 0.5)
            return torch.matmul(F.softmax(scores, dim=-1), v)

    result, reference, got = _fuse(Model(), _qkv(), FUSE)
    (sdpa,) = _sdpa_calls(result.module)
    assert sdpa.kwargs["scale"] == pytest.approx(8 ** -0.5)
    assert_close(got, reference)


def test_a_tensor_scale_is_not_fused():
    class Model(nn.Module):
        def forward(self, q, k, v, s):
            scores = torch.matmul(q, k.transpose(-2, -1)) / s
            return torch.matmul(F.softmax(scores, dim=-1), v)

    result, reference, got = _fuse(Model(), _qkv() + (torch.tensor(2.0),), FUSE)
    assert not _sdpa_calls(result.module), result.counts
    assert_close(got, reference, rtol=0, atol=0)


def test_half_precision_is_left_alone():
    model = _Scores(lambda k: k.transpose(-2, -1))
    result, reference, got = _fuse(model, _qkv(torch.float16), FUSE)
    assert not _sdpa_calls(result.module)
    result32, reference32, got32 = _fuse(model, _qkv(), FUSE)
    assert len(_sdpa_calls(result32.module)) == 1
    assert_close(got32, reference32)


def test_a_bool_mask_added_to_the_scores_is_not_an_attention_mask():
    class Model(nn.Module):
        def forward(self, q, k, v, m):
            scores = torch.matmul(q, k.transpose(-2, -1)) * 0.125 + m
            return torch.matmul(F.softmax(scores, dim=-1), v)

    q, k, v = _qkv()
    m = torch.rand(2, 1, 5, 5) > 0.5
    result, reference, got = _fuse(Model(), (q, k, v, m), FUSE)
    assert not _sdpa_calls(result.module)
    assert_close(got, reference, rtol=0, atol=0)


def test_a_mask_that_widens_the_scores_is_not_fused():
    class Model(nn.Module):
        def forward(self, q, k, v, m):
            scores = torch.matmul(q, k.transpose(-2, -1)) * 0.125 + m
            return torch.matmul(F.softmax(scores, dim=-1), v)

    q, k, v = _qkv()
    m = torch.randn(4, 2, 3, 5, 5)
    result, reference, got = _fuse(Model(), (q, k, v, m), FUSE)
    assert not _sdpa_calls(result.module)
    assert_close(got, reference, rtol=0, atol=0)


def test_training_dropout_becomes_dropout_p():
    class Model(nn.Module):
        def forward(self, q, k, v):
            probs = F.dropout(F.softmax(torch.matmul(q, k.transpose(-2, -1)) / 4.0, dim=-1), 0.25)
            return torch.matmul(probs, v)

    assert not fxrules.apply_rules(Model(), FUSE, example_inputs=_qkv()).counts  # the library keeps values
    incubating = fxrules.load_rules(INCUBATING)
    result = fxrules.apply_rules(Model(), incubating, example_inputs=_qkv())
    assert result.counts.get("sdpa_div_scale_dropout") == 1, result.counts
    (sdpa,) = _sdpa_calls(result.module)
    assert sdpa.kwargs["dropout_p"] == 0.25 and sdpa.kwargs["scale"] == 0.25
    assert incubating["sdpa_div_scale_dropout"].contract == "changes"  # it draws other random numbers


def test_an_interior_value_used_elsewhere_blocks_the_fusion():
    class Model(nn.Module):
        def forward(self, q, k, v):
            probs = F.softmax(torch.matmul(q, k.transpose(-2, -1)) * 0.125, dim=-1)
            return torch.matmul(probs, v), probs

    result, reference, got = _fuse(Model(), _qkv(), FUSE)
    assert not _sdpa_calls(result.module)
    assert_close(got, reference, rtol=0, atol=0)


def test_a_zero_dropout_in_training_mode_is_fused():
    """F.dropout(x, 0.0) in training mode draws no random numbers and returns x: the training
    variants of the fusion keep values and gradients."""
    class Model(nn.Module):
        def forward(self, q, k, v):
            probs = F.dropout(F.softmax(torch.matmul(q, k.transpose(-2, -1)) * 0.125, dim=-1), 0.0)
            return torch.matmul(probs, v)

    q, k, v = (t.requires_grad_() for t in _qkv())
    model = Model().train()
    result = fxrules.apply_rules(model, FUSE, example_inputs=(q, k, v))
    assert result.counts.get("sdpa_mul_scale") == 1, result.counts
    reference, got = model(q, k, v), result.module(q, k, v)
    assert_close(got, reference)
    grads = torch.autograd.grad(reference.sum(), (q, k, v))
    assert_close(torch.autograd.grad(got.sum(), (q, k, v)), grads)


def test_fully_masked_rows_are_where_sdpa_differs():
    """The domain of the [approx] contract (fuse/attention.fxr, docs/verify.md): a row of scores with
    no finite entry gives NaN written out and 0 from SDPA (torch's handling of fully masked rows).
    The verifier draws finite queries, keys and masks for these rules; this is the difference."""
    class Model(nn.Module):
        def forward(self, q, k, v, m):
            return torch.matmul(F.softmax(torch.matmul(q, k.transpose(-2, -1)) * 0.125 + m, dim=-1), v)

    q, k, v = _qkv()
    m = torch.zeros(5, 5)
    m[0] = float("-inf")
    result, reference, got = _fuse(Model(), (q, k, v, m), FUSE)
    assert len(_sdpa_calls(result.module)) == 1
    assert reference[..., 0, :].isnan().all() and (got[..., 0, :] == 0).all()
    assert_close(got[..., 1:, :], reference[..., 1:, :])


def test_every_fuse_rule_has_positive_and_negative_examples():
    for rule in FUSE:
        counts = [e.count for e in rule.ast.examples]
        assert any(c != 0 for c in counts) and 0 in counts, rule.name


def test_operator_module_is_used():  # the module imports operator for the matmul spelling below
    class Model(nn.Module):
        def forward(self, q, k, v):
            return operator.matmul(torch.softmax(operator.matmul(q, torch.transpose(k, -1, -2)), -1), v)

    result, reference, got = _fuse(Model(), _qkv(), FUSE)
    assert result.counts.get("sdpa_no_scale") == 1, result.counts
    assert_close(got, reference)
