"""Faults: rules, helpers and models that fail, at every stage of a run, and concurrency.

Whatever fails (a builder, a ``where`` helper, the model on its example inputs, missing
metadata, a KeyboardInterrupt), the caller's model is exactly as it was, and an error
fxrules raises names the rule, its ``file:line`` and the node. One loaded RuleSet may be
used from several threads at once.

The failing builder and predicate live in tests/helpers_builders.py; rule text names them
as ``tests.helpers_builders.*`` under ``allow_imports=["tests"]`` (the repository root is
on sys.path through pytest's ``pythonpath`` setting).
"""

from __future__ import annotations

import concurrent.futures
import sys
import threading
from pathlib import Path

import pytest
import torch
from torch import fx, nn
from torch.testing import assert_close

import fxrules
from tests.model_snapshots import assert_same_snapshot, snapshot_module, snapshot_program
import tests.helpers_builders as helpers
from fxrules import zoo
from tests.helpers_builders import BuilderBoom

RULES_DIR = Path(__file__).resolve().parents[2] / "rules"
# Library files whose rules read no shape/dtype metadata (they apply without example inputs).
UNTYPED_FILES = ("canonicalize/relu.fxr", "canonicalize/sigmoid.fxr", "canonicalize/tanh.fxr", "cleanup/dropout.fxr",
                 "cleanup/identity.fxr", "cleanup/neg.fxr", "cleanup/relu.fxr", "cleanup/transpose.fxr",
                 "fold/conv_bn.fxr")


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def seeded(build, seed: int = 0):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def assert_names_rule_and_node(err: Exception, rule: str, source: str, node: str) -> None:
    assert isinstance(err, fxrules.RewriteError)
    assert (err.rule, err.source, err.node) == (rule, source, node)
    text = str(err)
    assert f"`{rule}`" in text and source in text and f"%{node}" in text, text


# ---------------------------------------------------------------------------
# models
# ---------------------------------------------------------------------------


class ConvBN(nn.Module):
    """Dropout, conv + bn (eval), relu twice, plus 1."""

    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.2)
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return torch.relu(torch.relu(self.bn(self.conv(self.drop(x))))) + 1


def conv_bn() -> ConvBN:
    model = seeded(ConvBN)
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.5, 0.5, generator=torch.Generator().manual_seed(1))
        model.bn.running_var.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(2))
    return model.eval()


BOOM = """\
rule builder_boom [approx]:
    call_module BatchNorm2d(call_module Conv2d($x) as conv) as bn
    -> call_module tests.helpers_builders.exploding_builder(conv, bn)($x)

rule predicate_boom [exact]:
    call_function operator.add($x, 1) where tests.helpers_builders.exploding_predicate($x) -> $x
"""


def boom_rules() -> fxrules.RuleSet:
    """Parsed on every call: the helpers are resolved when the text is checked."""
    library = fxrules.load_rules(RULES_DIR).select(names=["remove_dropout", "relu_idempotent"])
    return library + fxrules.parse_rules(BOOM, source="boom.fxr", allow_imports=["tests"])


def inputs_for(model: nn.Module) -> tuple:
    """ConvBN's input (the same for the module and its GraphModule)."""
    return (randn(2, 3, 6, 6, seed=3),)


def as_input(kind: str) -> nn.Module:
    model = conv_bn()
    return fx.symbolic_trace(model) if kind == "graph_module" else model


# ---------------------------------------------------------------------------
# a builder that raises; a predicate that raises
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["module", "graph_module"])
def test_builder_that_raises(kind):
    model = as_input(kind)
    x, = inputs_for(model)
    with torch.no_grad():
        expected = model(x)
    before = snapshot_module(model)
    rules = boom_rules().select(names=["remove_dropout", "relu_idempotent", "builder_boom"])
    with pytest.raises(fxrules.RewriteError) as info:
        fxrules.apply_rules(model, rules)
    assert_names_rule_and_node(info.value, "builder_boom", "boom.fxr:1", "bn")
    assert "this builder always fails" in str(info.value)
    assert isinstance(info.value.__cause__, BuilderBoom)
    assert_same_snapshot(before, snapshot_module(model))
    with torch.no_grad():
        assert_close(model(x), expected, rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["module", "graph_module"])
@pytest.mark.parametrize("with_inputs", [False, True])
def test_predicate_that_raises(kind, with_inputs):
    model = as_input(kind)
    x, = inputs_for(model)
    with torch.no_grad():
        expected = model(x)
    before = snapshot_module(model)
    rules = boom_rules().select(names=["remove_dropout", "relu_idempotent", "predicate_boom"])
    with pytest.raises(fxrules.RewriteError) as info:
        fxrules.apply_rules(model, rules, example_inputs=(x,) if with_inputs else None)
    assert_names_rule_and_node(info.value, "predicate_boom", "boom.fxr:5", "add")
    # with or without metadata the helper runs (without it, it gets the node itself) and fails
    assert "this predicate always fails" in str(info.value)
    assert isinstance(info.value.__cause__, BuilderBoom)
    assert_same_snapshot(before, snapshot_module(model))
    with torch.no_grad():
        assert_close(model(x), expected, rtol=0, atol=0)


# ---------------------------------------------------------------------------
# a model that fails only on some inputs
# ---------------------------------------------------------------------------


class BatchOfThree(RuntimeError):
    pass


def refuse_batch_of_three(x):
    if x.shape[0] == 3:
        raise BatchOfThree("this model does not take a batch of 3")
    return x


torch.fx.wrap("refuse_batch_of_three")  # a leaf call_function node: traced, not run, by symbolic_trace


class PicksyBatch(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        # the dropout after the wrapped call: a function the engine does not know may write its input, so
        # replacing the dropout before it by its input is refused (replaced-node-mutated)
        x = self.drop(refuse_batch_of_three(x))
        return torch.relu(torch.relu(self.fc(x))) * 1


def test_model_raising_on_some_batch_sizes():
    model = seeded(PicksyBatch).eval()
    with pytest.raises(BatchOfThree):
        model(randn(3, 4))
    before = snapshot_module(model)
    library = fxrules.load_rules(RULES_DIR).select(contracts=["exact", "approx"])  # not the [changes] swaps
    untyped = library.select(names=["remove_dropout", "relu_idempotent"])

    # without example inputs the model is only traced, never run
    result = fxrules.apply_rules(model, untyped)
    assert result.counts == {"remove_dropout": 1, "relu_idempotent": 1}
    x2 = randn(2, 4)
    with torch.no_grad():
        assert_close(result.module(x2), model(x2), rtol=0, atol=0)

    # a batch of 2 runs: the typed rules work too
    result = fxrules.apply_rules(model, library, example_inputs=(x2,))
    assert result.counts == {"remove_dropout": 1, "relu_idempotent": 1, "mul_one": 1, "fuse_linear_relu": 1}
    with torch.no_grad():
        assert_close(result.module(x2), model(x2), rtol=0, atol=0)

    # a batch of 3 does not: ModelError, saying why
    for rules in (untyped, library):
        with pytest.raises(fxrules.ModelError) as info:
            fxrules.apply_rules(model, rules, example_inputs=(randn(3, 4),))
        assert "this model does not take a batch of 3" in str(info.value)
        assert "BatchOfThree" in str(info.value)
    assert_same_snapshot(before, snapshot_module(model))


# ---------------------------------------------------------------------------
# torch.export graphs with metadata removed
# ---------------------------------------------------------------------------

# Two rules whose conditions read metadata. The second replaces `relu(y) + 0` (its only match
# here) by relu(relu(y)), equal for a relu output: new nodes whose meta['val'] must be recomputed.
ATEN_TYPED = """\
rule aten_mul_one [exact]:
    call_function aten.mul.Tensor($x, 1) where $x.dtype != torch.bool -> $x

rule aten_add_zero_checked [approx]:
    call_function aten.add.Tensor($x, 0) where $x.ndim >= 1 and $x.shape[0] > 0
    -> call_function aten.relu.default(call_function aten.relu.default($x))
"""


class ExportMe(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = torch.relu(self.fc(x) * 1)
        return torch.relu(y) + 0


@pytest.fixture(scope="module")
def export_inputs():
    return (randn(3, 4),)


def exported(export_inputs):
    return torch.export.export(seeded(ExportMe).eval(), export_inputs)


VICTIMS = ["linear", "mul", "relu", "relu_1", "add", "x", "all_calls", "all"]


@pytest.mark.parametrize("keys", [("val",), ("val", "tensor_meta")], ids=["val", "val+tensor_meta"])
@pytest.mark.parametrize("victim", VICTIMS)
def test_export_with_metadata_removed(export_inputs, victim, keys):
    ep = exported(export_inputs)
    reference = exported(export_inputs).module()(*export_inputs)
    for node in ep.graph.nodes:
        if victim == "all" or node.name == victim or (victim == "all_calls" and node.op == "call_function"):
            for key in keys:
                node.meta.pop(key, None)
    before = snapshot_program(ep)
    rules = fxrules.parse_rules(ATEN_TYPED, source="aten_typed.fxr")
    try:
        ep.module()
    except Exception:
        unliftable = True  # torch itself cannot unlift it: fxrules must say so with a ModelError
    else:
        unliftable = False
    try:
        result = fxrules.apply_rules(ep, rules)
    except fxrules.RewriteError as err:
        assert not unliftable
        assert err.rule in rules.names
        assert_names_rule_and_node(err, err.rule, rules[err.rule].source, err.node)
        assert err.node in {n.name for n in ep.graph.nodes}
        assert "metadata" in str(err) or "meta" in str(err)
    except fxrules.ModelError as err:
        assert unliftable, f"ModelError for a program torch can unlift: {err}"
    else:
        assert not unliftable
        assert set(result.counts) <= set(rules.names)
        result.module.graph.lint()
        assert_close(result.module(*export_inputs), reference)
    assert_same_snapshot(before, snapshot_program(ep))


def test_export_with_metadata_works_untouched(export_inputs):
    ep = exported(export_inputs)
    rules = fxrules.parse_rules(ATEN_TYPED, source="aten_typed.fxr")
    result = fxrules.apply_rules(ep, rules)
    assert result.counts == {"aten_mul_one": 1, "aten_add_zero_checked": 1}
    assert_close(result.module(*export_inputs), ep.module()(*export_inputs))


# ---------------------------------------------------------------------------
# KeyboardInterrupt in the middle of a run
# ---------------------------------------------------------------------------


def interrupt(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize("where", ["builder", "predicate"])
@pytest.mark.parametrize("kind", ["module", "graph_module"])
@pytest.mark.slow
def test_keyboard_interrupt_propagates_and_leaves_the_model(monkeypatch, where, kind):
    rule = "builder_boom" if where == "builder" else "predicate_boom"
    rules = boom_rules().select(names=["remove_dropout", "relu_idempotent", rule])
    # The helper is resolved (and its module checked against the allow-list) when the rules are
    # parsed: swap the code of the very function object the rules hold.
    function = helpers.exploding_builder if where == "builder" else helpers.exploding_predicate
    monkeypatch.setattr(function, "__code__", interrupt.__code__)
    model = as_input(kind)
    x, = inputs_for(model)
    with torch.no_grad():
        expected = model(x)
    before = snapshot_module(model)
    with pytest.raises(KeyboardInterrupt):
        fxrules.apply_rules(model, rules, example_inputs=(x,))
    assert_same_snapshot(before, snapshot_module(model))
    with torch.no_grad():
        assert_close(model(x), expected, rtol=0, atol=0)
    # and the next run, without the interrupt, works
    result = fxrules.apply_rules(model, rules.select(names=["remove_dropout", "relu_idempotent"]))
    assert result.counts == {"remove_dropout": 1, "relu_idempotent": 1}


def test_keyboard_interrupt_while_propagating_values(monkeypatch):
    """An interrupt inside the model while example inputs run (not an Exception: not caught)."""
    model = seeded(PicksyBatch).eval()
    monkeypatch.setattr(sys.modules[__name__], "refuse_batch_of_three", interrupt)
    before = snapshot_module(model)
    with pytest.raises(KeyboardInterrupt):
        fxrules.apply_rules(model, fxrules.load_rules(RULES_DIR), example_inputs=(randn(2, 4),))
    assert_same_snapshot(before, snapshot_module(model))


# ---------------------------------------------------------------------------
# what the checker accepts, the engine compiles
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("pattern, forward", [
    ("call_method reshape($x, 2, -1)", lambda x: x.reshape(2, -1)),
    ("call_method permute($x, 1, 0)", lambda x: x.permute(1, 0)),
    ("call_method view($x, 2, -1)", lambda x: x.view(2, -1)),
    ("call_method expand($x, 2, 3)", lambda x: x.expand(2, 3)),
], ids=["reshape", "permute", "view", "expand"])
def test_a_rule_that_checks_clean_compiles(pattern, forward):
    """Method calls with varargs (``x.reshape(2, -1)``, as fx records them) are valid patterns:
    a rule file the checker accepts must never fail with RuleFileError at apply time."""
    rules = fxrules.parse_rules(f"rule r [changes]: {pattern} -> call_function torch.neg($x)\n", source="m.fxr")

    class M(nn.Module):
        def forward(self, x):
            return forward(x)

    x = randn(2, 3)
    result = fxrules.apply_rules(M(), rules)
    assert result.counts == {"r": 1}
    assert_close(result.module(x), -x)


# ---------------------------------------------------------------------------
# one RuleSet, several threads
# ---------------------------------------------------------------------------

THREAD_MODELS = list(zoo.ZOO) * 2  # 10 runs over 5 models, on 4 threads


def _run(rules: fxrules.RuleSet, model, name: str) -> tuple:
    result = fxrules.apply_rules(model, rules, example_inputs=zoo.example_inputs(name))
    with torch.no_grad():
        out = result.module(*zoo.example_inputs(name))
    return result.module.code, dict(result.counts), len(result.report.rejected), out


@pytest.mark.slow
def test_one_rule_set_from_four_threads():
    """GraphModules (traced beforehand): the threads share the RuleSet (compiled on first use, by
    whichever thread gets there first), the resolver and torch, nothing else."""
    models = {name: fx.symbolic_trace(zoo.ZOO[name]()) for name in zoo.ZOO}
    befores = {name: snapshot_module(m) for name, m in models.items()}

    sequential_rules = fxrules.load_rules(RULES_DIR)
    expected = {name: _run(sequential_rules, models[name], name) for name in zoo.ZOO}
    assert any(counts for _, counts, _, _ in expected.values())

    shared = fxrules.load_rules(RULES_DIR)  # fresh: the threads race to compile it too
    barrier = threading.Barrier(4)  # the first four runs start together

    def task(index: int, name: str) -> tuple:
        if index < 4:
            barrier.wait(timeout=30)
        return name, _run(shared, models[name], name)

    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(task, range(len(THREAD_MODELS)), THREAD_MODELS))
    assert len(results) == len(THREAD_MODELS)
    for name, (code, counts, rejected, out) in results:
        exp_code, exp_counts, exp_rejected, exp_out = expected[name]
        assert counts == exp_counts, name
        assert code == exp_code, name
        assert rejected == exp_rejected, name
        assert_close(out, exp_out, rtol=0, atol=0)
    for name, model in models.items():
        assert_same_snapshot(befores[name], snapshot_module(model))


class _PausingTracer(fx.Tracer):
    """A tracer that pauses at its first module call until ``release`` (or a short timeout)."""

    def __init__(self, started: threading.Event, release: threading.Event):
        super().__init__()
        self.started, self.release = started, release

    def call_module(self, m, forward, args, kwargs):
        if not self.started.is_set():
            self.started.set()
            self.release.wait(timeout=3)
        return super().call_module(m, forward, args, kwargs)


def test_apply_while_another_thread_traces():
    """nn.Module inputs are traced with torch.fx, which patches ``nn.Module.__call__`` globally
    while it traces. A run in another thread must not see that: here one thread's apply_rules
    is paused in the middle of tracing ``resnet`` while a second thread rewrites ``mlp`` (already
    a GraphModule) with example inputs. Both must give what they give one after the other.
    (If fxrules serialises its tracing, the second run waits for the first, which times out its
    pause after 3 s: the test then passes, slowly.)"""
    rules = fxrules.load_rules(RULES_DIR)
    mlp = fx.symbolic_trace(zoo.mlp())
    expected_mlp = _run(rules, mlp, "mlp")
    expected_resnet = _run(rules, zoo.resnet(), "resnet")

    started, release = threading.Event(), threading.Event()
    outcome: dict = {}

    def traced_in_background():
        try:
            result = fxrules.apply_rules(zoo.resnet(), rules, tracer=_PausingTracer(started, release),
                                         example_inputs=zoo.example_inputs("resnet"))
            outcome["resnet"] = (result.module.code, dict(result.counts))
        except BaseException as exc:  # reported below
            outcome["resnet"] = exc

    thread = threading.Thread(target=traced_in_background)
    thread.start()
    try:
        assert started.wait(timeout=30)
        try:  # only apply_rules runs during the pause: running any nn.Module here would go through the
            # tracer's patched Module.__call__ (torch.fx's own global state, not fxrules')
            result = fxrules.apply_rules(mlp, rules, example_inputs=zoo.example_inputs("mlp"))
        except fxrules.FxrulesError as exc:
            pytest.fail(f"apply_rules failed while another thread was tracing: {type(exc).__name__}: "
                        f"{str(exc).splitlines()[0]}")
    finally:
        release.set()
        thread.join(timeout=60)
    code, counts = result.module.code, dict(result.counts)
    with torch.no_grad():
        out = result.module(*zoo.example_inputs("mlp"))
    assert (code, counts) == expected_mlp[:2]
    assert_close(out, expected_mlp[3], rtol=0, atol=0)
    assert outcome["resnet"] == expected_resnet[:2]


TWO_TRACERS = r"""
import json, threading
import torch, fxrules
from torch import fx, nn
from fxrules import zoo
from tests.engine.test_faults import _PausingTracer

rules = fxrules.load_rules(RULES)
original = (nn.Module.__call__, nn.Module.__getattr__)
expected = {name: fxrules.apply_rules(zoo.ZOO[name](), rules).module.code for name in ("resnet", "mlp")}



events = {name: (threading.Event(), threading.Event()) for name in ("resnet", "mlp")}
results = {}


def run(name):
    try:
        results[name] = fxrules.apply_rules(zoo.ZOO[name](), rules, tracer=_PausingTracer(*events[name])).module.code
    except Exception as exc:
        results[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"


first = threading.Thread(target=run, args=("resnet",))
second = threading.Thread(target=run, args=("mlp",))
first.start()
events["resnet"][0].wait(timeout=10)      # the first run is tracing (paused at its first module call)
second.start()
events["mlp"][0].wait(timeout=3)          # the second starts tracing too (unless fxrules makes it wait)
events["resnet"][1].set()                 # the first finishes while the second is still tracing
first.join(timeout=60)
events["mlp"][1].set()
second.join(timeout=60)
try:
    zoo.mlp()(torch.randn(2, 16))
    plain = "ok"
except Exception as exc:
    plain = f"{type(exc).__name__}: {exc}"
print(json.dumps({
    "same": {name: results.get(name) == expected[name] for name in expected},
    "errors": {name: r for name, r in results.items() if r != expected[name]},
    "restored": (nn.Module.__call__, nn.Module.__getattr__) == original,
    "plain_call": plain,
}))
"""


@pytest.mark.slow
def test_two_threads_tracing_at_once():
    """Two apply_rules calls on nn.Modules, in two threads, whose torch.fx tracing overlaps
    (the first finishes tracing while the second is still at it). torch.fx patches
    ``nn.Module.__call__`` globally while it traces, so fxrules must not let its own tracings
    overlap: both runs must give their sequential results, and afterwards ``nn.Module`` must be
    as it was (a plain module call works). Run in a fresh interpreter: a failure would leave
    this one's ``nn.Module`` patched."""
    import json
    import os
    import subprocess

    root = Path(__file__).resolve().parents[2]
    rules = [str(RULES_DIR / f) for f in UNTYPED_FILES]  # no typed rules: no inputs
    env = dict(os.environ)
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    code = f"RULES = {rules!r}\n" + TWO_TRACERS
    run = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["errors"] == {}, report
    assert report["same"] == {"resnet": True, "mlp": True}
    assert report["restored"], "nn.Module.__call__ is still patched after the runs"
    assert report["plain_call"] == "ok"


# ---------------------------------------------------------------------------
# metadata from example inputs is what the model computes, hooks included
# ---------------------------------------------------------------------------


class HookedLinear(nn.Module):
    """A Linear whose forward hook reshapes its (N, 12) output to (N, 3, 4), then a flatten:
    the flatten is real (3-D to 2-D), although Linear.forward alone returns a 2-D tensor."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 12)
        self.fc.register_forward_hook(lambda module, args, out: out.reshape(out.shape[0], 3, 4))

    def forward(self, x):
        return torch.flatten(self.fc(x), 1)


class PreHookedLinear(nn.Module):
    """A Linear(12, 4) whose forward pre-hook flattens its (N, 3, 4) input, then a flatten (a no-op)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 4)
        self.fc.register_forward_pre_hook(lambda module, args: (args[0].flatten(1),))

    def forward(self, x):
        return torch.flatten(self.fc(x), 1)


@pytest.mark.parametrize("build, shape, expected", [
    (HookedLinear, (2, 4), {}),  # the flatten is real: flatten_2d_noop must not remove it
    (PreHookedLinear, (2, 3, 4), {"flatten_2d_noop": 1}),  # the model runs only with its pre-hook
], ids=["forward_hook", "forward_pre_hook"])
def test_example_inputs_run_module_hooks(build, shape, expected):
    """Shape metadata must come from running submodules as the model runs them (``__call__``,
    hooks included), or a typed rule decides on shapes the model never has."""
    model = seeded(build).eval()
    x = randn(*shape)
    with torch.no_grad():
        reference = model(x)
    rules = fxrules.load_rules(RULES_DIR).select(names=["flatten_2d_noop"])
    result = fxrules.apply_rules(model, rules, example_inputs=(x,))
    assert result.counts == expected
    with torch.no_grad():
        assert_close(result.module(x), reference, rtol=0, atol=0)
