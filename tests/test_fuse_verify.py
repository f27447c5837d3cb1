"""`fxrules verify` on attention rules: attention-shaped hosts (fxrules/verifier/attention_hosts.py).

The verifier recognises an attention pattern and draws q, k, v, the scale and the mask together, so
the library's SDPA fusions are checked on many hosts (tests/verifier/test_library_verify.py grades the
whole library). It also draws the spellings inductor's SDPA fusions got wrong in 2026; here each bug is
planted in a rule, and verify must grade that rule ``wrong``:

* a permuted key taken for ``key.transpose(-2, -1)`` (``key.permute(0, 2, 3, 1)``);
* the permutation of 3-D ``bmm`` attention matched as a wildcard;
* a match that extends into the attention output's reshape and drops it.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fxrules
from fxrules.engine.program import RuleCompiler
from fxrules.verifier.attention_hosts import AttentionHostWriter, attention_roles, host_writer
from fxrules.verifier.hosts import HostGraphWriter
from fxrules.verifier.samplers import default_catalogue

ATTENTION = fxrules.load_rules(fxrules.LIBRARY / "fuse" / "attention.fxr")
COLLAPSE = fxrules.load_rules(fxrules.LIBRARY / "fuse" / "collapse.fxr")


def _roots(rules, name):
    return RuleCompiler(rules[name], rules).program().roots


@pytest.mark.parametrize("name", ATTENTION.names)
@pytest.mark.slow
def test_every_library_attention_rule_gets_attention_hosts(name):
    roles = attention_roles(_roots(ATTENTION, name))
    assert roles is not None
    assert (roles.query, roles.key, roles.value) == ("q", "k", "v")
    assert roles.key_calls
    assert roles.mask == ("m" if "mask" in name else None)
    assert roles.scale == (None if "no_scale" in name else "s")
    assert roles.bmm == ("permuted_key" in name)


@pytest.mark.parametrize("name", COLLAPSE.names)
def test_other_patterns_get_the_general_writer(name):
    assert host_writer(_roots(COLLAPSE, name)) is HostGraphWriter


def test_drawn_attention_hosts_run_and_keep_q_k_v_consistent():
    roots = _roots(ATTENTION, "sdpa_mul_scale_mask")
    roles = attention_roles(roots)
    seen = set()

    @settings(max_examples=40, deadline=None, database=None)
    @given(st.data())
    def check(data):
        import torch

        writer = AttentionHostWriter(data.draw, default_catalogue(), torch.float32, False, roles)
        host = writer.build(roots)
        q, k, v = (writer.values[writer.captures[n]] for n in ("q", "k", "v"))
        assert q.shape[-1] == k.shape[-1] or writer.near_miss or q.ndim != k.ndim
        assert k.shape[-2] == v.shape[-2] or writer.near_miss or k.ndim != v.ndim
        host.module(*host.inputs)
        seen.add(writer.near_miss)

    check()
    assert seen == {False, True}  # near misses are drawn


PLANTED = '''
rule permuted_key_as_transpose "inductor's bug: key.permute(0, 2, 3, 1) taken for key.transpose(-2, -1)" [approx]:
    call_function torch.matmul(
        call_function F.softmax(
            call_function operator.mul(call_function torch.matmul($q, call_method permute($k, 0, 2, 3, 1)), 0.125),
            -1,
        ),
        $v,
    )
    -> call_function F.scaled_dot_product_attention($q, $k, $v, scale=0.125)

rule bmm_permutation_wildcard "inductor's bug: bmm attention's permutation matched as a wildcard" [approx]:
    call_function torch.bmm(call_function F.softmax(call_function torch.bmm($q, call_function torch.permute($k, $p)), -1), $v)
    -> call_function F.scaled_dot_product_attention($q, $k, $v, scale=1.0)

rule match_reaches_into_reshape "inductor's bug: the match extends into the output's reshape" [approx]:
    call_method transpose(
        call_function torch.matmul(call_function F.softmax(call_function torch.matmul($q, call_method transpose($k, -2, -1)), -1), $v),
        1,
        2,
    )
    -> call_function F.scaled_dot_product_attention($q, $k, $v, scale=1.0)
'''


@pytest.mark.parametrize("name", ["permuted_key_as_transpose", "bmm_permutation_wildcard",
                                  "match_reaches_into_reshape"])
@pytest.mark.slow
def test_inductors_wrong_fusions_are_found(name):
    rules = fxrules.parse_rules(PLANTED)
    assert attention_roles(_roots(rules, name)) is not None
    report = fxrules.verify(rules.select(names=[name]), max_examples=60, seed=0, grad=False)
    verdict = report[name]
    assert verdict.grade == "wrong", verdict.render()


# ------------------------------------------- bool masks (fuse/attention_bool_mask.fxr): where, masked_fill

BOOL_MASK = fxrules.load_rules(fxrules.LIBRARY / "fuse" / "attention_bool_mask.fxr")


@pytest.mark.parametrize("name", BOOL_MASK.names)
def test_every_bool_mask_rule_gets_attention_hosts(name):
    roles = attention_roles(_roots(BOOL_MASK, name))
    assert roles is not None
    assert (roles.query, roles.key, roles.value, roles.scale, roles.fill) == ("q", "k", "v", "s", "f")
    assert (roles.keep, roles.drop) == (("c", None) if "where" in name else (None, "m"))
    assert roles.key_calls and roles.mask == ("m" if name.endswith("_mask") else None)


PLANTED_BOOL = '''
rule any_fill "wrong: a fill of -1e4 or 0 leaves masked keys a weight" [approx]:
    call_function torch.matmul(
        call_function F.softmax(
            call_function torch.where($c, call_function operator.mul(call_function torch.matmul($q, call_method transpose($k, -2, -1)), $s) as sc, $f) as a,
            -1,
        ),
        $v,
    )
    where is_constant($s) and not is_floating($s * 1.0) and $c.dtype == torch.bool and $c.ndim >= 2
    where a.shape == sc.shape and $q.dtype in [torch.float32, torch.float64]
    -> call_function F.scaled_dot_product_attention($q, $k, $v, attn_mask=$c, scale={1.0 * $s})

rule drop_taken_for_keep "wrong: masked_fill's mask (True drops) passed to SDPA as is (True keeps)" [approx]:
    call_function torch.matmul(
        call_function F.softmax(
            call_method masked_fill(call_function operator.mul(call_function torch.matmul($q, call_method transpose($k, -2, -1)), $s) as sc, $m, $f) as a,
            -1,
        ),
        $v,
    )
    where is_constant($s) and not is_floating($s * 1.0) and $m.dtype == torch.bool and $m.ndim >= 2
    where is_constant($f) and not is_floating($f * 1.0) and $f <= -1e30
    where a.shape == sc.shape and $q.dtype in [torch.float32, torch.float64]
    -> call_function F.scaled_dot_product_attention($q, $k, $v, attn_mask=$m, scale={1.0 * $s})
'''


@pytest.mark.parametrize("name", ["any_fill", "drop_taken_for_keep"])
@pytest.mark.slow
def test_wrong_bool_mask_fusions_are_found(name):
    rules = fxrules.parse_rules(PLANTED_BOOL)
    assert attention_roles(_roots(rules, name)) is not None
    report = fxrules.verify(rules.select(names=[name]), max_examples=60, seed=0, grad=False)
    assert report[name].grade == "wrong", report[name].render()


@pytest.mark.slow
def test_bool_mask_hosts_draw_lifted_constant_fills():
    """The aten rules take a fill that torch.export lifted out of forward, `detach_(lift_fresh_copy(c))`
    (attention_bool_mask.fxr, `lifted`): the hosts draw that spelling too, with c a 0-d buffer or plain
    tensor attribute (a constant) or an input (none), and the rule fuses some of them."""
    import torch

    rules = BOOL_MASK.select(names=["aten_sdpa_masked_fill_div_scale"])
    roots = _roots(BOOL_MASK, "aten_sdpa_masked_fill_div_scale")
    roles = attention_roles(roots)
    lifted, fused = [], []

    @settings(max_examples=120, deadline=None, database=None)
    @given(st.data())
    def check(data):
        writer = AttentionHostWriter(data.draw, default_catalogue(), torch.float32, False, roles)
        host = writer.build(roots)
        calls = [n for n in host.module.graph.nodes if n.op == "call_function"]
        if not any(n.target is torch.ops.aten.lift_fresh_copy.default for n in calls):
            return
        copy = next(n for n in calls if n.target is torch.ops.aten.lift_fresh_copy.default)
        assert [u.target for u in copy.users] == [torch.ops.aten.detach_.default]
        lifted.append(copy.args[0].op)
        result = fxrules.apply_rules(host.module, rules, example_inputs=host.inputs)
        if result.counts:
            fused.append(copy.args[0].op)

    check()
    assert "get_attr" in lifted and "placeholder" in lifted, lifted
    assert fused and set(fused) == {"get_attr"}, fused  # an input fill is no constant: never fused


PLANTED_LIFTED = '''
pattern lifted($f) = (call_function aten.detach_.default(call_function aten.lift_fresh_copy.default($f)) | $f)

rule aten_any_lifted_fill "wrong: a lifted fill of -1e4 or 0 leaves masked keys a weight" [approx]:
    call_function aten.matmul.default(
        call_function aten.softmax.int(
            call_function aten.masked_fill.Tensor(
                call_function aten.div.Tensor(
                    call_function aten.matmul.default($q, call_function aten.transpose.int($k, -2, -1)), $s) as sc,
                $m, lifted($f)) as a,
            -1,
        ),
        $v,
    )
    where is_constant($s) and not is_floating($s * 1.0) and $s != 0 and $m.dtype == torch.bool and $m.ndim >= 2
    where is_constant($f) and a.shape == sc.shape and $q.dtype in [torch.float32, torch.float64]
    -> call_function aten.scaled_dot_product_attention.default(
        $q, $k, $v, call_function aten.logical_not.default($m), scale={1.0 / $s})
'''


@pytest.mark.slow
def test_a_wrong_fusion_of_lifted_fills_is_found():
    """Only a fill of 0.0 tells this rule from a correct one (-1e4 weighs a masked key exp(-1e4) = 0 in
    float32 too): one fill in six is drawn so. Seeds 1, 2 and 3 find it in 60 hosts; seed 0 needs more
    than 100 (measured when this test was written), so the test fixes seed 1."""
    rules = fxrules.parse_rules(PLANTED_LIFTED)
    assert attention_roles(_roots(rules, "aten_any_lifted_fill")) is not None
    report = fxrules.verify(rules, max_examples=60, seed=1, grad=False)
    assert report["aten_any_lifted_fill"].grade == "wrong", report["aten_any_lifted_fill"].render()
