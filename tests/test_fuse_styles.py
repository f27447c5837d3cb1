"""The attention fusions (fxrules/library/fuse/attention.fxr) on attention written as real models write it,
traced with ``torch.fx.symbolic_trace`` and exported with ``torch.export``.

Hand-written modules in the styles of BERT, GPT-2 (transformers v5's eager attention: an additive mask,
``* scaling``, ``.type(value.dtype)``), DistilBERT and timm's ViT, in eval mode: each must fuse to
``scaled_dot_product_attention`` and keep its outputs. Exported, GPT-2's cast leaves an
``aten._assert_tensor_metadata`` on the attention weights, an interior node of the fusion: the engine
drops it as implied (fxrules/engine/inspection.py), which is what lets it fuse.

transformers' own BertModel and GPT2LMHeadModel (small configs, random weights, nothing downloaded,
``attn_implementation="eager"``) are exported and fused too, behind the ``transformers`` marker.
"""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close

import fxrules
from tests.test_fuse import BATCH, HEADS, HIDDEN, SEQ, BertSelfAttention, DistilBertAttention, Gpt2Attention, \
    VitAttention

FUSE = fxrules.load_rules(fxrules.LIBRARY / "cleanup", fxrules.LIBRARY / "fuse")
EXPORT_RULES = fxrules.load_rules(fxrules.LIBRARY / "aten", fxrules.LIBRARY / "fuse")
SDPA_TARGETS = (F.scaled_dot_product_attention, torch.ops.aten.scaled_dot_product_attention.default)


class Gpt2EagerAttention(nn.Module):
    """transformers v5's GPT2Attention with eager_attention_forward: one c_attn projection split into
    q, k, v; ``matmul(q, k.transpose(-1, -2)) * scaling + mask``; softmax; ``.type(value.dtype)``;
    functional dropout with the module's training flag; ``@ v``; heads merged back."""

    def __init__(self):
        super().__init__()
        self.head_dim = HIDDEN // HEADS
        self.scaling = self.head_dim ** -0.5
        self.c_attn = nn.Linear(HIDDEN, 3 * HIDDEN)

    def forward(self, hidden, mask):
        q, k, v = self.c_attn(hidden).split(HIDDEN, dim=2)
        q, k, v = (t.view(BATCH, SEQ, HEADS, self.head_dim).transpose(1, 2) for t in (q, k, v))
        weights = torch.matmul(q, k.transpose(-1, -2)) * self.scaling
        weights = weights + mask
        weights = F.softmax(weights, dim=-1)
        weights = weights.type(v.dtype)
        weights = F.dropout(weights, p=0.1, training=self.training)
        out = torch.matmul(weights, v).transpose(1, 2)
        return out.reshape(BATCH, SEQ, -1)


class Gpt2WhereAttention(nn.Module):
    """GPT-2 before transformers v5 (and inductor's fuse_attention patterns 18/19): a bool causal mask
    from a buffer, applied with ``torch.where(causal, weights, finfo(float32).min)``; the scale a
    Python number (``/ head_dim ** 0.5``); an eval-mode functional dropout; heads merged back."""

    def __init__(self):
        super().__init__()
        self.head_dim = HIDDEN // HEADS
        self.c_attn = nn.Linear(HIDDEN, 3 * HIDDEN)
        self.register_buffer("bias", torch.tril(torch.ones(SEQ, SEQ, dtype=torch.bool)).view(1, 1, SEQ, SEQ))

    def forward(self, hidden):
        q, k, v = self.c_attn(hidden).split(HIDDEN, dim=2)
        q, k, v = (t.view(BATCH, SEQ, HEADS, self.head_dim).permute(0, 2, 1, 3) for t in (q, k, v))
        w = torch.matmul(q, k.transpose(-1, -2))
        w = w / (self.head_dim ** 0.5)
        w = torch.where(self.bias[:, :, :SEQ, :SEQ], w, torch.finfo(torch.float32).min)
        w = F.softmax(w, dim=-1)
        w = F.dropout(w, p=0.1, training=self.training)
        out = torch.matmul(w, v)
        return out.permute(0, 2, 1, 3).reshape(BATCH, SEQ, HIDDEN)


class DistilBertMaskedAttention(nn.Module):
    """transformers' DistilBERT MultiHeadSelfAttention with its padding mask: q / sqrt(d) before the
    product, ``scores.masked_fill(mask == 0 viewed (B, 1, 1, Lk), finfo(float32).min)``."""

    def __init__(self):
        super().__init__()
        self.dim_per_head = HIDDEN // HEADS
        self.q_lin, self.k_lin, self.v_lin = (nn.Linear(HIDDEN, HIDDEN) for _ in range(3))

    def forward(self, hidden, mask):
        def shape(x):
            return x.view(BATCH, -1, HEADS, self.dim_per_head).transpose(1, 2)

        q, k, v = shape(self.q_lin(hidden)), shape(self.k_lin(hidden)), shape(self.v_lin(hidden))
        q = q / self.dim_per_head ** 0.5
        scores = torch.matmul(q, k.transpose(2, 3))
        scores = scores.masked_fill((mask == 0).view(BATCH, 1, 1, SEQ), torch.finfo(torch.float32).min)
        weights = F.softmax(scores, dim=-1)
        context = torch.matmul(weights, v)
        return context.transpose(1, 2).reshape(BATCH, -1, HIDDEN)


def _inputs(style: str) -> tuple:
    torch.manual_seed(0)
    hidden = torch.randn(BATCH, SEQ, HIDDEN)
    if style == "bert":
        mask = torch.zeros(BATCH, 1, 1, SEQ)
        mask[0, ..., -2:] = torch.finfo(torch.float32).min
        return hidden, mask
    if style == "distilbert_mask":
        mask = torch.ones(BATCH, SEQ, dtype=torch.long)
        mask[0, -2:] = 0
        return hidden, mask
    if style == "gpt2":
        causal = torch.full((SEQ, SEQ), torch.finfo(torch.float32).min).triu(1)
        return hidden, causal.expand(BATCH, 1, SEQ, SEQ)
    return (hidden,)


STYLES = {"bert": BertSelfAttention, "gpt2": Gpt2EagerAttention, "distilbert": DistilBertAttention,
          "vit": VitAttention, "gpt2_where": Gpt2WhereAttention, "distilbert_mask": DistilBertMaskedAttention}
TRACED_RULE = {"bert": "sdpa_div_scale_mask", "gpt2": "sdpa_mul_scale_mask", "distilbert": "sdpa_prescaled_div",
               "vit": "sdpa_mul_scale", "gpt2_where": "sdpa_where_div_scale",
               "distilbert_mask": "sdpa_masked_fill_prescaled_div"}
EXPORTED_RULE = {"bert": "aten_sdpa_div_scale_mask", "gpt2": "aten_sdpa_mul_scale_mask",
                 "distilbert": "aten_sdpa_prescaled_div", "vit": "aten_sdpa_mul_scale",
                 "gpt2_where": "aten_sdpa_where_div_scale", "distilbert_mask": "aten_sdpa_masked_fill_prescaled_div"}


def _sdpa_nodes(module) -> list:
    return [n for n in module.graph.nodes if n.op == "call_function" and n.target in SDPA_TARGETS]


def _softmaxes(module) -> list:
    return [n for n in module.graph.nodes
            if n.target in (F.softmax, torch.softmax, torch.ops.aten.softmax.int, torch.ops.aten._softmax.default)
            or n.target == "softmax"]


@pytest.mark.parametrize("style", sorted(STYLES))
@pytest.mark.slow
def test_traced_attention_fuses_and_keeps_outputs(style):
    model = STYLES[style]().eval()
    inputs = _inputs(style)
    with torch.no_grad():
        reference = model(*inputs)
    result = fxrules.apply_rules(model, FUSE, example_inputs=inputs)
    assert result.counts.get(TRACED_RULE[style]) == 1, result.counts
    assert len(_sdpa_nodes(result.module)) == 1 and not _softmaxes(result.module)
    with torch.no_grad():
        got = result.module(*inputs)
    assert got.shape == reference.shape == (BATCH, SEQ, HIDDEN)
    assert_close(got, reference)


@pytest.mark.parametrize("style", sorted(EXPORTED_RULE))
@pytest.mark.slow
def test_exported_attention_fuses_and_keeps_outputs(style):
    model = STYLES[style]().eval()
    inputs = _inputs(style)
    program = torch.export.export(model, inputs)
    with torch.no_grad():
        reference = program.module()(*inputs)
    result = fxrules.apply_rules(program, EXPORT_RULES)
    assert result.counts.get(EXPORTED_RULE[style]) == 1, result.counts
    assert len(_sdpa_nodes(result.module)) == 1 and not _softmaxes(result.module)
    with torch.no_grad():
        got = result.module(*inputs)
    assert_close(got, reference)


def test_exported_gpt2_fuses_only_because_its_dtype_assertion_is_implied():
    """Export asserts the attention weights' dtype (``.type(value.dtype)``): without the engine's
    settling of inspecting users, that assertion keeps the softmax alive and the fusion is refused."""
    inputs = _inputs("gpt2")
    program = torch.export.export(Gpt2EagerAttention().eval(), inputs)
    asserts = [n for n in program.graph.nodes if n.target == torch.ops.aten._assert_tensor_metadata.default]
    softmax = next(n for n in program.graph.nodes if n.target == torch.ops.aten.softmax.int)
    assert any(a.args[0] is softmax for a in asserts)
    result = fxrules.apply_rules(program, EXPORT_RULES)
    assert result.counts.get("aten_sdpa_mul_scale_mask") == 1
    assert not any(n.target == torch.ops.aten._assert_tensor_metadata.default and n.args[0].name == softmax.name
                   for n in result.module.graph.nodes)


def test_old_gpt2_where_mask_is_left_alone_exported_too():
    """GPT-2 before transformers v5: a bool causal mask applied with torch.where (finfo.min, not
    -inf, where masked) and a scale computed in the graph; neither is SDPA's, so nothing fuses."""
    model = Gpt2Attention().eval()
    inputs = _inputs("vit")
    program = torch.export.export(model, inputs)
    result = fxrules.apply_rules(program, EXPORT_RULES)
    assert not _sdpa_nodes(result.module), result.counts


def test_traced_styles_in_float64():
    model = VitAttention().double().eval()
    (hidden,) = _inputs("vit")
    result = fxrules.apply_rules(model, FUSE, example_inputs=(hidden.double(),))
    assert len(_sdpa_nodes(result.module)) == 1
    with torch.no_grad():
        assert_close(result.module(hidden.double()), model(hidden.double()))


def test_operator_matmul_and_bmm_spellings():
    class Bmm(nn.Module):
        def forward(self, q, k, v):
            return torch.bmm(F.softmax(torch.bmm(q, k.permute(0, 2, 1)) / 4.0, dim=-1), v)

    q, k, v = (torch.randn(6, 5, 16) for _ in range(3))
    result = fxrules.apply_rules(Bmm(), FUSE, example_inputs=(q, k, v))
    assert result.counts.get("sdpa_permuted_key_div_scale") == 1, result.counts
    assert_close(result.module(q, k, v), Bmm()(q, k, v))
    assert operator.matmul  # the @ spelling: tests/test_fuse.py::test_operator_module_is_used


# ----------------------------------------------------------------- transformers' models, exported

def _bert():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=32, attn_implementation="eager")
    return transformers.BertModel(config), (torch.randint(0, 100, (2, 8)),), "aten_sdpa_mul_scale_mask"


def _gpt2():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=32, use_cache=False,
                                     bos_token_id=0, eos_token_id=0, attn_implementation="eager")
    return transformers.GPT2LMHeadModel(config), (torch.randint(0, 100, (2, 8)),), "aten_sdpa_mul_scale_mask"


@pytest.mark.transformers
@pytest.mark.parametrize("build", [_bert, _gpt2], ids=["bert", "gpt2"])
def test_transformers_attention_fuses_through_export(build):
    torch.manual_seed(0)
    model, inputs, rule = build()
    model.eval()
    program = torch.export.export(model, inputs)
    with torch.no_grad():
        reference = program.module()(*inputs)
    result = fxrules.apply_rules(program, EXPORT_RULES)
    assert result.counts.get(rule) == 2, result.counts  # one per layer
    assert len(_sdpa_nodes(result.module)) == 2 and not _softmaxes(result.module)
    with torch.no_grad():
        got = result.module(*inputs)
    assert_close(got, reference)


def test_gpt2_cast_then_dropout_fuses_without_cleanup():
    """GPT-2's `.type(value.dtype)` followed by an eval-mode functional dropout is one optional part
    of the pattern: the fuse family alone fuses it."""
    model = Gpt2EagerAttention().eval()
    inputs = _inputs("gpt2")
    result = fxrules.apply_rules(model, fxrules.load_rules(fxrules.LIBRARY / "fuse"), example_inputs=inputs)
    assert result.counts.get("sdpa_mul_scale_mask") == 1, result.counts
    with torch.no_grad():
        assert_close(result.module(*inputs), model(*inputs))
