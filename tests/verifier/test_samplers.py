"""The sampler catalogue on its own (fxrules.verifier.samplers).

Function and method samplers are lists of parameter kinds that the host writer
(``HostGraphWriter``) draws; these tests draw every entry of the default catalogue
through the writer's own ``pattern`` entry point, once as ``T`` with no argument list (the
required parameters drawn) and once with every parameter named by a capture, then call
the op again on the drawn values. Module samplers are called directly (``build(draw, x,
overrides)``). Also: the catalogue's API, ``describe_target`` and ``missing_samplers``.
"""

from __future__ import annotations

import operator
from collections import Counter, defaultdict

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from hypothesis.errors import UnsatisfiedAssumption
from torch import nn

import fxrules
import fxrules.engine.signatures as signatures
import fxrules.lang.ast as A
from fxrules.engine.program import PCall, PCapture, PSeq, compile_rules
from fxrules.verifier.hosts import TENSOR, HostGraphWriter, missing_samplers
from fxrules.verifier.samplers import KINDS, TENSOR_KINDS, Catalogue, ModuleSampler, Param, default_catalogue, describe_target

# The dropout1d/2d/3d samplers draw inputs of every rank (1-4), some of which torch deprecates with a
# warning (and a few it refuses): the draws are valid for these tests, the warning is noise here.
pytestmark = pytest.mark.filterwarnings("ignore:dropout[123]d:UserWarning")

CATALOGUE = default_catalogue()
OPS = ([("call_function", target, sampler) for target, sampler in CATALOGUE.functions.items()]
       + [("call_method", name, sampler) for name, sampler in CATALOGUE.methods.items()])
# A few draws per entry in the ci profile (100 examples); many more under HYPOTHESIS_PROFILE=thorough.
EXAMPLES = max(3, settings.default.max_examples // 33)
TRIES = 3  # per entry, route and example: until one draw runs
# One example draws for a whole chunk of entries: a large example by design, and nothing to shrink.
MANY_AT_ONCE = settings(max_examples=EXAMPLES, deadline=None, phases=(Phase.generate,),
                        suppress_health_check=list(HealthCheck))
CHUNKS = 8


class OpRaised(Exception):
    """The op refused the arguments the catalogue drew for it."""


class StrictWriter(HostGraphWriter):
    """A host writer that reports an op raising instead of quietly discarding the host."""

    def evaluate(self, run):
        try:
            with torch.no_grad():
                return run()
        except Exception as exc:
            raise OpRaised(exc) from exc


def open_pattern(op: str, target) -> PCall:
    """``op T`` with no argument list: any arguments (the writer draws the required ones)."""
    return PCall(op, (target,), describe_target(op, target), None, (), True, (), (), A.NO_SPAN)


def named_pattern(op: str, target, sampler) -> PCall:
    """``op T($a, b=$b, ...)``: every parameter a capture, bound to the signatures as the compiler binds them."""
    first, *rest = sampler.params
    positional = (PCapture(first.name),)
    keywords = tuple((p.name, PCapture(p.name)) for p in rest)
    sigs = signatures.for_method(target) if op == "call_method" else signatures.for_function(target)
    overloads = []
    for sig in sigs:
        bound = signatures.bind(sig, positional, dict(keywords))
        if bound is not None:
            overloads.append((sig, {k: PSeq(v) if isinstance(v, tuple) else v for k, v in bound.items()}))
    return PCall(op, (target,), describe_target(op, target), positional, keywords, False, tuple(overloads), (),
                 A.NO_SPAN)


def call_again(writer: HostGraphWriter, node):
    """Call the node's op on the values the writer drew for its arguments."""
    args = [writer.value_of(a) for a in node.args]
    kwargs = {k: writer.value_of(v) for k, v in node.kwargs.items()}
    args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    with torch.no_grad():
        if node.op == "call_method":
            return getattr(args[0], node.target)(*args[1:], **kwargs)
        return node.target(*args, **kwargs)


def first_tensor(writer: HostGraphWriter, node):
    for arg in node.args:
        value = writer.value_of(arg)
        if isinstance(value, torch.Tensor):
            return value
        if isinstance(value, list) and value and isinstance(value[0], torch.Tensor):
            return value[0]
    return None


def test_the_default_catalogue_is_a_fresh_object_each_time():
    one, two = default_catalogue(), default_catalogue()
    assert one is not two and one.functions is not two.functions
    one.add_method("my_op", Param("self", "tensor"))
    assert two.method("my_op") is None


@pytest.mark.parametrize("chunk", range(CHUNKS))
@pytest.mark.slow
def test_every_function_and_method_sampler_draws_arguments_its_op_accepts(chunk):
    """Each entry draws arguments its op runs on, both with every parameter named and with only the
    required ones drawn by kind; inputs of the host dtype, the first tensor within the entry's rank
    bounds; calling the op again on them agrees with what the writer recorded. (Single draws may
    still be declined by a sampler or refused by the op: the host writer then discards the host.)"""
    entries = OPS[chunk::CHUNKS]
    outcome: dict = defaultdict(Counter)  # (entry, route) -> built / declined / raised
    raised: dict = {}
    problems: list = []

    @MANY_AT_ONCE
    @given(st.data())
    def draw_every_entry(data):
        for op, target, sampler in entries:
            routes = [("open", open_pattern(op, target))]
            if not any(p.var for p in sampler.params):
                routes.append(("named", named_pattern(op, target, sampler)))
            for route, pattern in routes:
                key = (describe_target(op, target), route)
                for _ in range(TRIES):
                    if try_entry(data, op, sampler, pattern, key):
                        break

    def try_entry(data, op, sampler, pattern, key) -> bool:
        dtype = torch.float32 if sampler.floating_only else data.draw(st.sampled_from([torch.float32, torch.int64]))
        writer = StrictWriter(data.draw, CATALOGUE, dtype, False)
        try:
            node = writer.pattern(pattern, TENSOR, {})
        except UnsatisfiedAssumption:  # the sampler itself declined (a dim of a 0-d tensor ...)
            outcome[key]["declined"] += 1
            return False
        except OpRaised as exc:
            outcome[key]["raised"] += 1
            raised[key] = repr(exc.__cause__)[:120]
            return False
        outcome[key]["built"] += 1
        result = call_again(writer, node)
        recorded = writer.values[node]
        if isinstance(result, torch.Tensor) and (result.shape != recorded.shape or result.dtype != recorded.dtype):
            problems.append((key, "another call gives another shape or dtype"))
        masks = any(p.kind == "mask" for p in sampler.params)  # masks are bool whatever the host dtype
        indices = any(p.kind in ("index", "index_list") for p in sampler.params)  # and indices int64
        if any(t.dtype != dtype and not (masks and t.dtype == torch.bool)
               and not (indices and t.dtype == torch.int64) for t in writer.inputs):
            problems.append((key, f"an input is not {dtype}"))
        x = first_tensor(writer, node)
        if x is None and not any(p.kind in TENSOR_KINDS for p in sampler.params):
            pass  # a factory (randperm) takes no tensor
        elif x is None:
            problems.append((key, "no tensor argument"))
        elif not sampler.min_rank <= x.ndim <= sampler.max_rank:
            problems.append((key, f"rank {x.ndim} outside [{sampler.min_rank}, {sampler.max_rank}]"))
        return True

    draw_every_entry()
    assert not problems, problems[:10]
    names = {name for name, _ in outcome}
    never = sorted(names - {name for (name, _), counts in outcome.items() if counts["built"]})
    assert not never, f"no draw of these entries ran: {never}"
    named_never = sorted(name for (name, route), counts in outcome.items() if route == "named" and not counts["built"])
    assert not named_never, [(name, raised.get((name, "named"))) for name in named_never]


# ---------------------------------------------------------------------------
# modules
# ---------------------------------------------------------------------------


def _module_input(draw, sampler: ModuleSampler) -> torch.Tensor:
    low, high = sampler.input_rank
    rank = draw(st.integers(low, high), label="rank")
    shape = draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank), label="shape")
    return torch.randn(shape, generator=torch.Generator().manual_seed(0))


def _constant(tensor: torch.Tensor, value: float) -> bool:
    return tensor.numel() > 0 and bool((tensor == value).all())


def test_every_module_sampler_builds_modules_that_run_on_its_input_with_drawn_weights():
    ran: Counter = Counter()
    problems: list = []

    @MANY_AT_ONCE
    @given(st.data())
    def build_every_module(data):
        for cls, sampler in CATALOGUE.modules.items():
            x = _module_input(data.draw, sampler)
            module = sampler.build(data.draw, x, {})
            if module is None:  # the input does not suit the module (too small for the kernel ...)
                continue
            if type(module) is not cls:
                problems.append((cls.__name__, f"built a {type(module).__name__}"))
                continue
            for name, value in list(module.named_parameters()) + list(module.named_buffers()):
                if value.dtype.is_floating_point and (_constant(value, 0.0) or _constant(value, 1.0)):
                    problems.append((cls.__name__, f"{name} left at a constant initial value"))
            try:
                with torch.no_grad():
                    out = module.eval()(x)
            except (RuntimeError, ValueError):  # some inputs in the sampler's rank range do not suit it
                continue
            ran[cls] += 1
            if not isinstance(out, torch.Tensor):
                problems.append((cls.__name__, "no tensor output"))

    build_every_module()
    assert not problems, problems[:10]
    assert set(ran) == set(CATALOGUE.modules), sorted(c.__name__ for c in set(CATALOGUE.modules) - set(ran))


def draw_with(seed_value: int, function, examples: int = 1) -> list:
    """``function(draw)`` for each of ``examples`` hypothesis examples under a fixed seed."""
    found = []

    @seed(seed_value)
    @settings(max_examples=examples, derandomize=False, database=None, deadline=None, phases=(Phase.generate,),
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def run(data):
        found.append(function(data.draw))

    run()
    return found


@pytest.mark.parametrize("cls, shape, overrides, check", [
    (nn.Dropout, (2, 3), {"p": 0.0}, lambda m: m.p == 0.0),
    (nn.Linear, (2, 4), {"out_features": 3, "bias": False}, lambda m: (m.in_features, m.out_features, m.bias) == (4, 3, None)),
    (nn.Conv2d, (1, 2, 5, 5), {"kernel_size": 3, "stride": 1, "bias": True, "groups": 1},
     lambda m: m.kernel_size == (3, 3) and m.stride == (1, 1) and m.bias is not None and m.in_channels == 2),
    (nn.BatchNorm2d, (2, 3, 4, 4), {"eps": 0.5, "affine": False}, lambda m: m.eps == 0.5 and m.weight is None),
    (nn.LayerNorm, (2, 6), {"elementwise_affine": True}, lambda m: m.normalized_shape == (6,) and m.weight is not None),
    (nn.Softmax, (2, 3, 4), {"dim": 1}, lambda m: m.dim == 1),
    (nn.LeakyReLU, (3,), {"negative_slope": 0.3}, lambda m: m.negative_slope == 0.3),
    (nn.GroupNorm, (2, 4, 3), {"num_groups": 2}, lambda m: m.num_groups == 2 and m.num_channels == 4),
])
def test_a_module_sampler_keeps_the_constructor_values_a_pattern_fixes(cls, shape, overrides, check):
    x = torch.randn(shape)
    (module,) = draw_with(3, lambda draw: CATALOGUE.module(cls).build(draw, x, overrides))
    assert isinstance(module, cls) and check(module)
    module.eval()(x)


@pytest.mark.parametrize("cls, shape, overrides", [
    (nn.Linear, (2, 4), {"in_features": 5}),
    (nn.BatchNorm2d, (2, 3, 4, 4), {"num_features": 4}),
    (nn.BatchNorm2d, (2, 3), {}),
    (nn.Conv2d, (2, 3, 4), {}),
    (nn.MaxPool2d, (2, 3), {}),
    (nn.GroupNorm, (5,), {}),
    (nn.AdaptiveAvgPool1d, (2, 3, 4, 5), {}),
])
def test_a_module_sampler_declines_an_input_that_does_not_suit_it(cls, shape, overrides):
    built = draw_with(3, lambda draw: CATALOGUE.module(cls).build(draw, torch.randn(shape), overrides), 5)
    assert built and all(module is None for module in built)


def test_the_same_seed_draws_the_same_modules_and_arguments():
    def draw_some(draw):
        x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(1))
        conv = CATALOGUE.module(nn.Conv2d).build(draw, x, {})
        bn = CATALOGUE.module(nn.BatchNorm2d).build(draw, x, {})
        writer = HostGraphWriter(draw, CATALOGUE, torch.float32, False)
        node = writer.pattern(named_pattern("call_function", torch.transpose, CATALOGUE.function(torch.transpose)),
                              TENSOR, {})
        return (conv and conv.state_dict(), repr(conv), bn.state_dict(), node.args[1:],
                [t.tolist() for t in writer.inputs])

    first, again, other = (draw_with(7, draw_some, 4), draw_with(7, draw_some, 4), draw_with(8, draw_some, 4))
    assert len(first) == 4
    assert _same(first, again)
    assert not _same(first, other)


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


# ---------------------------------------------------------------------------
# the catalogue's API
# ---------------------------------------------------------------------------


def test_param_refuses_an_unknown_kind():
    with pytest.raises(ValueError):
        Param("x", "tensr")
    assert {Param("x", kind).kind for kind in KINDS} == set(KINDS)


def test_a_catalogue_copy_is_independent():
    mine = CATALOGUE.copy()
    mine.add_function(torch.special.i0e, Param("input", "tensor"))
    mine.add_module(nn.PReLU, ModuleSampler((1, 4), lambda draw, x, overrides: nn.PReLU()))
    assert mine.function(torch.special.i0e) is not None and mine.module(nn.PReLU) is not None
    assert CATALOGUE.function(torch.special.i0e) is None and CATALOGUE.module(nn.PReLU) is None


def test_lookups():
    sampler = CATALOGUE.function(torch.transpose)
    assert [p.name for p in sampler.params] == ["input", "dim0", "dim1"] and sampler.min_rank == 1
    assert CATALOGUE.method("relu").params == (Param("self", "tensor"),)
    assert CATALOGUE.method("no_such_method") is None
    assert CATALOGUE.function([]) is None  # an unhashable target: no sampler, no error
    assert CATALOGUE.module(nn.ReLU) is not None
    assert CATALOGUE.module(nn.PReLU) is None


def test_add_function_and_add_method_record_rank_bounds():
    mine = Catalogue()
    mine.add_function(torch.relu, Param("input", "tensor"), min_rank=2, max_rank=3, floating_only=False)
    mine.add_method("relu", Param("self", "tensor"))
    assert (mine.function(torch.relu).min_rank, mine.function(torch.relu).max_rank) == (2, 3)
    assert mine.function(torch.relu).floating_only is False
    assert mine.method("relu").floating_only is True


@pytest.mark.parametrize("op, target, expected", [
    ("call_method", "relu", "Tensor.relu"),
    ("call_module", nn.Linear, "torch.nn.modules.linear.Linear"),
    ("call_function", torch.ops.aten.add.Tensor, "aten.add.Tensor"),
    ("call_function", torch.ops.aten.mm.default, "aten.mm.default"),
    ("call_function", operator.add, "operator.add"),
    ("call_function", F.silu, "torch.nn.functional.silu"),
])
def test_describe_target(op, target, expected):
    assert describe_target(op, target) == expected


# ---------------------------------------------------------------------------
# missing samplers
# ---------------------------------------------------------------------------


def roots(text: str) -> tuple:
    (program,) = compile_rules(fxrules.parse_rules(text)).programs
    return program.roots


def test_missing_samplers_names_each_uncovered_op_once_wherever_it_sits():
    text = ("rule m: call_function operator.add(call_function torch.special.i0e($x) as a, "
            "(call_method i0($x) | call_module PReLU(call_function torch.special.i0e($x)))) "
            "-> call_function torch.relu(a)")
    assert missing_samplers(roots(text), CATALOGUE) == ["torch.special.i0e", "Tensor.i0",
                                                       "torch.nn.modules.activation.PReLU"]


def test_missing_samplers_names_a_function_as_the_rule_wrote_it():
    assert missing_samplers(roots("use torch.special as sp\nrule m: call_function sp.i0e($x) -> $x"),
                            CATALOGUE) == ["sp.i0e"]


def test_a_fixed_attribute_path_has_no_sampler_but_a_captured_one_does():
    fixed = missing_samplers(roots("rule m: call_function operator.add($x, get_attr w.b) -> $x"), CATALOGUE)
    assert len(fixed) == 1 and "w.b" in fixed[0]
    assert missing_samplers(roots("rule m: call_function operator.add($x, get_attr $b) -> $x"), CATALOGUE) == []


def test_nothing_is_missing_for_covered_ops_and_for_a_catalogue_that_adds_them():
    assert missing_samplers(roots("rule m: call_function torch.relu(call_module Dropout($x)) -> $x"), CATALOGUE) == []
    mine = CATALOGUE.copy()
    mine.add_function(torch.special.i0e, Param("input", "tensor"))
    assert missing_samplers(roots("rule m: call_function torch.special.i0e($x) -> $x"), mine) == []
