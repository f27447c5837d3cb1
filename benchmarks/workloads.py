"""Rewrite workloads: each one as fxrules rule text AND as the equivalent for the peers.

Every workload names the graph family it runs on (see :mod:`benchmarks.graphs`) and gives:

* ``rules_text``: the ``.fxr`` text (parsed once per process, outside any timing);
* ``replace_pattern()``: builds, once, whatever can be built without the model (traced
  pattern/replacement functions) and returns ``run(gm) -> rewrites``, which does what a
  user of :func:`torch.fx.subgraph_rewriter.replace_pattern` has to do for this model:
  ``replace_pattern`` matches ``call_module`` nodes by attribute *name*, so a module
  pattern needs one call per submodule name (or name pair), found by walking the model's
  modules inside the timing, as the user's code would;
* ``inductor()``: registers the equivalent patterns on a
  :class:`torch._inductor.pattern_matcher.PatternMatcherPass` once (``CallFunction``,
  ``CallMethod``, ``CallModule`` (which matches the module's *class*), ``KeywordArg``) and
  returns ``run(gm) -> rewrites``: ``pass.apply(gm)`` plus the one ``gm.recompile()``;
  or None when the peer cannot express the workload (``inductor_note`` says why).

Handlers and replacement graphs produce the same graph the rule does (up to node names):
the counts and outputs are compared by :mod:`benchmarks.run`.
"""

from __future__ import annotations

import operator
import random
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import fx, nn

import fxrules
from fxrules.builders import fold_conv_bn

Runner = Callable[[fx.GraphModule], int]

__all__ = ["WORKLOADS", "Workload", "get"]


@dataclass
class Workload:
    name: str
    family: str
    description: str
    rules_text: str
    exact: bool  # outputs bit-identical (else: equal within float tolerance)
    replace_pattern: Callable[[], Runner]
    inductor: Optional[Callable[[], Runner]]
    inductor_note: str = ""
    rule_count: int = 1
    builds: Optional[Callable[[fx.GraphModule], tuple[Callable, list]]] = None
    """For rules that build modules: ``builds(gm)`` gives the builder and the argument tuples of
    every module a rewrite of ``gm`` builds (found outside the timing). Calling the builder on
    each is work any engine must do to produce the result, so the floor includes it."""
    _rules: object = field(default=None, repr=False)

    @property
    def rules(self) -> fxrules.RuleSet:
        if self._rules is None:
            self._rules = fxrules.parse_rules(self.rules_text, f"<{self.name}>")
        return self._rules


# ---------------------------------------------------------------------------
# Helpers for the peers
# ---------------------------------------------------------------------------


def _trace(fn: Callable) -> fx.GraphModule:
    return fx.symbolic_trace(fn)


def _module_graph(chain: list[str]) -> fx.Graph:
    """``x -> call_module chain[0] -> ... -> output``: a replacement over submodule names."""
    graph = fx.Graph()
    value = graph.placeholder("x")
    for name in chain:
        value = graph.call_module(name, (value,))
    graph.output(value)
    return graph


def _owned(graph: fx.Graph, gm: fx.GraphModule) -> fx.GraphModule:
    """A pattern graph with call_module nodes must be owned by a module (replace_pattern asks
    each pattern node whether it is impure, which looks the module up)."""
    names = [n.target for n in graph.nodes if n.op == "call_module"]
    return fx.GraphModule({name: gm.get_submodule(name) for name in names}, graph)


def _module_pattern(chain: list[str], gm: fx.GraphModule) -> fx.GraphModule:
    return _owned(_module_graph(chain), gm)


def _drop_unused(gm: fx.GraphModule, names) -> None:
    """Delete the submodules ``names`` that no node calls any more, so the result holds only what its
    graph uses, as fxrules' does. (``GraphModule.delete_all_unused_submodules`` would do it too, but it
    tests membership in a list, which is quadratic: 16 s at 20k nodes.)"""
    used = {n.target for n in gm.graph.nodes if n.op == "call_module"}
    for name in names:
        if name not in used:
            gm.delete_submodule(name)


def _modules_of_type(gm: fx.GraphModule, cls: type) -> list[str]:
    return [name for name, m in gm.named_modules() if type(m) is cls]


def _inductor():
    from torch._inductor import pattern_matcher as pm

    return pm


def _replace_root_by_input(match, **kwargs) -> None:
    """Handler: the matched root is replaced by its (captured) input ``x``."""
    node = match.output_node()
    node.replace_all_uses_with(kwargs["x"])
    match.erase_nodes()


def _replace_root_by_its_first_argument(match, **kwargs) -> None:
    """Handler: the matched root is replaced by the node it reads first (a matched node, kept), and erased."""
    root = match.output_node()
    root.replace_all_uses_with(root.args[0])
    match.graph.erase_node(root)


def _replace_root_by_call(op: str, target, argnames: tuple[str, ...]):
    """Handler factory: the root becomes ``op target(*captures)``."""

    def handler(match, **kwargs) -> None:
        node = match.output_node()
        graph = node.graph
        with graph.inserting_before(node):
            new = graph.create_node(op, target, tuple(kwargs[a] for a in argnames))
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        match.erase_nodes()

    return handler


def _module_not_training(match) -> bool:
    """extra_check: the module the match's root node calls is in eval mode."""
    node = match.output_node()
    return not node.graph.owning_module.get_submodule(node.target).training



def _inductor_runner(pattern_pass) -> Runner:
    def run(gm: fx.GraphModule) -> int:
        count = pattern_pass.apply(gm)
        gm.recompile()
        return count

    return run


# ---------------------------------------------------------------------------
# Single rewrites
# ---------------------------------------------------------------------------

ADD_RULE = """
rule add_is_torch_add "x + y is torch.add(x, y)" [exact]:
    call_function operator.add($x, $y) -> call_function torch.add($x, $y)
"""


def _add_rp() -> Runner:
    pattern = _trace(lambda x, y: x + y)
    replacement = _trace(lambda x, y: torch.add(x, y))

    def run(gm):
        return len(fx.replace_pattern(gm, pattern, replacement))

    return run


def _add_inductor() -> Runner:
    pm = _inductor()
    pattern_pass = pm.PatternMatcherPass()
    pm.register_graph_pattern(pm.CallFunction(operator.add, pm.KeywordArg("x"), pm.KeywordArg("y")),
                              pass_dict=pattern_pass)(_replace_root_by_call("call_function", torch.add, ("x", "y")))
    return _inductor_runner(pattern_pass)


RELU_RULE = """
rule relu_idempotent "relu(relu(x)) == relu(x)" [exact]:
    call_function torch.relu(call_function torch.relu($x)) -> call_function torch.relu($x)
"""


def _relu_rp() -> Runner:
    pattern = _trace(lambda x: torch.relu(torch.relu(x)))
    replacement = _trace(lambda x: torch.relu(x))
    return lambda gm: len(fx.replace_pattern(gm, pattern, replacement))


def _relu_inductor() -> Runner:
    pm = _inductor()
    pattern_pass = pm.PatternMatcherPass()
    pm.register_graph_pattern(pm.CallFunction(torch.relu, pm.CallFunction(torch.relu, pm.KeywordArg("x"))),
                              pass_dict=pattern_pass)(_replace_root_by_call("call_function", torch.relu, ("x",)))
    return _inductor_runner(pattern_pass)


TRANSPOSE_RULE = """
rule double_transpose "transposing the same two dims twice is the identity" [exact]:
    call_method transpose(call_method transpose($x, $a, $b), $a, $b) -> $x
"""


def _transpose_rp_pair():
    # placeholders match literals in replace_pattern, and a repeated placeholder must bind the same value
    pattern = _trace(lambda x, a, b: x.transpose(a, b).transpose(a, b))
    replacement = _trace(lambda x, a, b: x)
    return pattern, replacement


def _transpose_rp() -> Runner:
    pattern, replacement = _transpose_rp_pair()
    return lambda gm: len(fx.replace_pattern(gm, pattern, replacement))


def _register_transpose(pm, pattern_pass) -> None:
    inner = pm.CallMethod("transpose", pm.KeywordArg("x"), pm.KeywordArg("a"), pm.KeywordArg("b"))
    pm.register_graph_pattern(pm.CallMethod("transpose", inner, pm.KeywordArg("a"), pm.KeywordArg("b")),
                              pass_dict=pattern_pass)(_replace_root_by_input)


def _transpose_inductor() -> Runner:
    pm = _inductor()
    pattern_pass = pm.PatternMatcherPass()
    _register_transpose(pm, pattern_pass)
    return _inductor_runner(pattern_pass)


CHAIN3_RULE = """
rule linear_gelu_dropout "Linear -> gelu -> Dropout (eval) is Linear -> gelu" [exact]:
    call_module Dropout(call_function F.gelu(call_module Linear($x) as l)) as d
    where not d.training
    -> call_function F.gelu(call_module l($x))
"""


def _chain3_rp() -> Runner:
    # replace_pattern matches call_module by name: one call per (Linear, Dropout) name pair. The user
    # knows the model: each block `P` has `P.fc1` (Linear) -> gelu -> `P.drop` (Dropout).
    def run(gm):
        count = 0
        modules = dict(gm.named_modules())
        for name, module in modules.items():
            if type(module) is not nn.Dropout or module.training:
                continue
            prefix = name.rsplit(".", 1)[0] + "." if "." in name else ""
            linear = prefix + "fc1"
            if type(modules.get(linear)) is not nn.Linear:
                continue
            pattern = fx.Graph()
            x = pattern.placeholder("x")
            pattern.output(pattern.call_module(name, (pattern.call_function(F.gelu, (pattern.call_module(linear, (x,)),)),)))
            pattern = _owned(pattern, gm)
            replacement = fx.Graph()
            x = replacement.placeholder("x")
            replacement.output(replacement.call_function(F.gelu, (replacement.call_module(linear, (x,)),)))
            count += len(fx.replace_pattern(gm, pattern, replacement))
        return count

    return run


def _chain3_inductor() -> Runner:
    pm = _inductor()
    pattern_pass = pm.PatternMatcherPass()

    pattern = pm.CallModule(nn.Dropout, pm.CallFunction(F.gelu, pm.CallModule(nn.Linear, pm.KeywordArg("x"))))
    pm.register_graph_pattern(pattern, extra_check=_module_not_training,
                              pass_dict=pattern_pass)(_replace_root_by_its_first_argument)  # the gelu node
    return _inductor_runner(pattern_pass)


DROPOUT_RULE = """
rule remove_dropout "Dropout in eval mode is the identity" [exact]:
    call_module Dropout($x) as d where not d.training -> $x
"""


def _dropout_steps(gm) -> int:
    count = 0
    for name in _modules_of_type(gm, nn.Dropout):  # one replace_pattern call per Dropout submodule name
        if gm.get_submodule(name).training:
            continue
        pattern = _module_pattern([name], gm)
        replacement = _module_graph([])
        count += len(fx.replace_pattern(gm, pattern, replacement))
    return count


def _dropout_rp() -> Runner:
    return _dropout_steps


def _register_dropout(pm, pattern_pass) -> None:
    pm.register_graph_pattern(pm.CallModule(nn.Dropout, pm.KeywordArg("x")), extra_check=_module_not_training,
                              pass_dict=pattern_pass)(_replace_root_by_input)


def _dropout_inductor() -> Runner:
    pm = _inductor()
    pattern_pass = pm.PatternMatcherPass()
    _register_dropout(pm, pattern_pass)
    return _inductor_runner(pattern_pass)


ATEN_RULES = """
rule aten_dropout_eval "aten dropout with train=False is the identity" [exact]:
    call_function aten.dropout.default($x, _, False) -> $x

rule aten_double_transpose "transposing the same two dims twice is the identity" [exact]:
    call_function aten.transpose.int(call_function aten.transpose.int($x, $a, $b), $a, $b) -> $x
"""


def _aten_rp() -> Runner:
    aten = torch.ops.aten
    # the dropout's probability is a literal to replace_pattern: the model's (0.1) is written in
    dropout = (_trace(lambda x: aten.dropout.default(x, 0.1, False)), _trace(lambda x: x))
    transpose = (_trace(lambda x, a, b: aten.transpose.int(aten.transpose.int(x, a, b), a, b)),
                 _trace(lambda x, a, b: x))

    def run(gm):
        return sum(len(fx.replace_pattern(gm, pattern, replacement)) for pattern, replacement in (dropout, transpose))

    return run


def _aten_inductor() -> Runner:
    pm = _inductor()
    aten = torch.ops.aten
    pattern_pass = pm.PatternMatcherPass()
    pm.register_graph_pattern(pm.CallFunction(aten.dropout.default, pm.KeywordArg("x"), pm.Ignored(), False),
                              pass_dict=pattern_pass)(_replace_root_by_input)
    inner = pm.CallFunction(aten.transpose.int, pm.KeywordArg("x"), pm.KeywordArg("a"), pm.KeywordArg("b"))
    pm.register_graph_pattern(pm.CallFunction(aten.transpose.int, inner, pm.KeywordArg("a"), pm.KeywordArg("b")),
                              pass_dict=pattern_pass)(_replace_root_by_input)
    return _inductor_runner(pattern_pass)


MODULE_PAIRS_RULES = """
rule relu_module_pair "ReLU(ReLU(x)) is ReLU(x)" [exact]:
    call_module ReLU(call_module ReLU($x) as inner) -> call_module inner($x)

rule remove_dropout "Dropout in eval mode is the identity" [exact]:
    call_module Dropout($x) as d where not d.training -> $x
"""


def _module_pairs_rp() -> Runner:
    def run(gm):
        # one call per pair of ReLU names (nn.Sequential names its children 0, 1, 2, ...) and per Dropout
        count = 0
        modules = dict(gm.named_modules())
        for name, module in modules.items():
            following = str(int(name) + 1) if name.isdigit() else None
            if type(module) is nn.ReLU and following is not None and type(modules.get(following)) is nn.ReLU:
                count += len(fx.replace_pattern(gm, _module_pattern([name, following], gm), _module_graph([name])))
        return count + _dropout_steps(gm)

    return run


def _module_pairs_inductor() -> Runner:
    pm = _inductor()
    pattern_pass = pm.PatternMatcherPass()

    pm.register_graph_pattern(pm.CallModule(nn.ReLU, pm.CallModule(nn.ReLU, pm.KeywordArg("x"))),
                              pass_dict=pattern_pass)(_replace_root_by_its_first_argument)  # the inner ReLU
    _register_dropout(pm, pattern_pass)
    return _inductor_runner(pattern_pass)


SHARED_RULES = ADD_RULE + RELU_RULE


def _shared_rp() -> Runner:
    # replace_pattern binds two pattern inputs to two distinct nodes: the first block's `x + x` needs a pattern
    # of its own (`a + a`), as a user would find out
    spell, relus = _add_rp(), _relu_rp()
    same = _trace(lambda x: x + x)
    same_replacement = _trace(lambda x: torch.add(x, x))
    return lambda gm: spell(gm) + len(fx.replace_pattern(gm, same, same_replacement)) + relus(gm)


def _shared_inductor() -> Runner:
    pm = _inductor()
    pattern_pass = pm.PatternMatcherPass()
    pm.register_graph_pattern(pm.CallFunction(operator.add, pm.KeywordArg("x"), pm.KeywordArg("y")),
                              pass_dict=pattern_pass)(_replace_root_by_call("call_function", torch.add, ("x", "y")))
    pm.register_graph_pattern(pm.CallFunction(torch.relu, pm.CallFunction(torch.relu, pm.KeywordArg("x"))),
                              pass_dict=pattern_pass)(_replace_root_by_call("call_function", torch.relu, ("x",)))
    return _inductor_runner(pattern_pass)


def _to_fixpoint(runner: Runner) -> Runner:
    """``runner`` again until it rewrites nothing (a cascade: each rewrite of a pair makes the next pair,
    which one pass in graph order or in reverse does not revisit): the rewrites of all passes."""

    def run(gm: fx.GraphModule) -> int:
        total = 0
        while True:
            count = runner(gm)
            if not count:
                return total
            total += count

    return run


def _cascade_rp() -> Runner:
    return _to_fixpoint(_relu_rp())


def _cascade_inductor() -> Runner:
    pm = _inductor()
    pattern_pass = pm.PatternMatcherPass()
    pm.register_graph_pattern(pm.CallFunction(torch.relu, pm.CallFunction(torch.relu, pm.KeywordArg("x"))),
                              pass_dict=pattern_pass)(_replace_root_by_call("call_function", torch.relu, ("x",)))
    passes = _to_fixpoint(pattern_pass.apply)

    def run(gm: fx.GraphModule) -> int:
        count = passes(gm)
        gm.recompile()  # once, after the last pass
        return count

    return run


CONV_BN_RULE = """
rule fold_conv2d_bn "conv2d + batchnorm2d (eval) -> one conv2d" [approx]:
    call_module BatchNorm2d(call_module Conv2d($x) as conv) as bn
    where not bn.training
    -> call_module fxrules.builders.fold_conv_bn(conv, bn)($x)
"""


def _conv_bn_pairs(gm) -> list[tuple[str, str]]:
    """(conv, bn) submodule name pairs, from the model's naming: `P.convK`/`P.bnK`, and the stem."""
    modules = dict(gm.named_modules())
    pairs = []
    for name, module in modules.items():
        if type(module) is not nn.BatchNorm2d:
            continue
        prefix, _, last = name.rpartition(".")
        conv = (prefix + "." if prefix else "") + ("conv" + last[2:] if last.startswith("bn") and last != "bn" else "stem")
        if type(modules.get(conv)) is nn.Conv2d:
            pairs.append((conv, name))
    return pairs


def _conv_bn_builds(gm: fx.GraphModule) -> tuple[Callable, list]:
    """fold_conv_bn and the (conv, bn) module pairs it folds (the pairs replace_pattern's user finds)."""
    return fold_conv_bn, [(gm.get_submodule(conv), gm.get_submodule(bn)) for conv, bn in _conv_bn_pairs(gm)]


def _conv_bn_rp() -> Runner:
    def run(gm):
        count = 0
        pairs = _conv_bn_pairs(gm)
        for conv, bn in pairs:  # one replace_pattern call per (conv, bn) name pair
            fused_name = conv + "_fused"
            gm.add_submodule(fused_name, fold_conv_bn(gm.get_submodule(conv), gm.get_submodule(bn)))
            count += len(fx.replace_pattern(gm, _module_pattern([conv, bn], gm), _module_graph([fused_name])))
        _drop_unused(gm, [name for pair in pairs for name in pair] + [conv + "_fused" for conv, _ in pairs])
        return count

    return run


def _conv_bn_inductor() -> Runner:
    pm = _inductor()
    pattern_pass = pm.PatternMatcherPass()

    replaced: list = []

    def handler(match, x) -> None:
        bn_node = match.output_node()
        conv_node = bn_node.args[0]
        gm = bn_node.graph.owning_module
        replaced.extend((conv_node.target, bn_node.target))
        fused = fold_conv_bn(gm.get_submodule(conv_node.target), gm.get_submodule(bn_node.target))
        name = conv_node.target + "_fused"
        gm.add_submodule(name, fused)
        with bn_node.graph.inserting_before(bn_node):
            new = bn_node.graph.call_module(name, (x,))
        new.meta.update(bn_node.meta)
        bn_node.replace_all_uses_with(new)
        match.erase_nodes()

    pm.register_graph_pattern(pm.CallModule(nn.BatchNorm2d, pm.CallModule(nn.Conv2d, pm.KeywordArg("x"))),
                              extra_check=_module_not_training, pass_dict=pattern_pass)(handler)

    def run(gm):
        replaced.clear()
        count = pattern_pass.apply(gm)
        _drop_unused(gm, replaced)
        gm.recompile()
        return count

    return run


# ---------------------------------------------------------------------------
# Rule sets of 10, 50, 500 rules: a few that match, the rest plausible rules that do not
# ---------------------------------------------------------------------------

# Unary ops that exist as torch.X and Tensor.X and occur in none of the benchmark graphs.
_UNARY = ("sin cos tan exp log sqrt rsqrt sigmoid tanh abs neg floor ceil round trunc sign erf expm1 log1p "
          "reciprocal square asin acos atan sinh cosh asinh acosh atanh exp2 log2 log10 frac deg2rad rad2deg "
          "sinc logit erfc lgamma digamma i0 signbit positive").split()
_MODULES = ("Tanh Sigmoid Hardtanh ReLU6 SiLU Mish Hardswish Hardsigmoid ELU SELU CELU Softplus Softsign "
            "Tanhshrink LogSigmoid GELU").split()


@dataclass(frozen=True)
class _GenRule:
    kind: str  # function | method | module | matmul | add
    outer: str
    inner: str


def _generated(count: int, seed: int = 0) -> list[_GenRule]:
    """``count`` distinct rules whose patterns occur nowhere in the transformer graph.

    About 45% ``torch.A(torch.B(x))``, 35% ``x.B().A()``, 10% module pairs
    ``A(B(x))``, and 10% near misses: rules rooted on ops the graph is full of
    (``torch.matmul(torch.B(x), y)``, ``x + torch.B(y)``) whose inner op is absent, so a
    matcher has to look at them and fail.
    """
    rng = random.Random(seed)
    pairs = {
        "function": [(a, b) for a in _UNARY for b in _UNARY if a != b],
        "method": [(a, b) for a in _UNARY for b in _UNARY if a != b],
        "module": [(a, b) for a in _MODULES for b in _MODULES if a != b],
        "matmul": [("matmul", b) for b in _UNARY],
        "add": [("add", b) for b in _UNARY],
    }
    for options in pairs.values():
        rng.shuffle(options)
    weights = [("function", 45), ("method", 35), ("module", 10), ("matmul", 5), ("add", 5)]
    out: list[_GenRule] = []
    seen: set = set()
    while len(out) < count:
        kind = rng.choices([k for k, _ in weights], [w for _, w in weights])[0]
        if not pairs[kind]:
            continue
        outer, inner = pairs[kind].pop()
        if (kind, outer, inner) not in seen:
            seen.add((kind, outer, inner))
            out.append(_GenRule(kind, outer, inner))
    return out


def _gen_text(i: int, r: _GenRule) -> str:
    head = f"rule gen_{i:03d}_{r.kind}_{r.outer}_{r.inner} [changes]:\n    "
    if r.kind == "function":
        return head + f"call_function torch.{r.outer}(call_function torch.{r.inner}($x)) -> call_function torch.{r.outer}($x)"
    if r.kind == "method":
        return head + f"call_method {r.outer}(call_method {r.inner}($x)) -> call_method {r.outer}($x)"
    if r.kind == "module":
        return head + f"call_module {r.outer}(call_module {r.inner}($x)) as o -> call_module o($x)"
    if r.kind == "matmul":
        return head + f"call_function torch.matmul(call_function torch.{r.inner}($x), $y) -> call_function torch.matmul($x, $y)"
    if r.kind == "add":
        return head + f"call_function operator.add($x, call_function torch.{r.inner}($y)) -> call_function operator.add($x, $y)"
    raise AssertionError(r.kind)


def _ruleset_text(total: int) -> str:
    generated = _generated(total - 2)
    parts = [_gen_text(i, r) for i, r in enumerate(generated)]
    parts.append(DROPOUT_RULE.strip())  # the two that match come last, like project rules after a library
    parts.append(TRANSPOSE_RULE.strip())
    return "\n\n".join(parts) + "\n"


def _gen_rp_step(r: _GenRule):
    """(pattern, replacement) traced once, or a callable(gm, modules) -> count for module pairs."""
    A, B = r.outer, r.inner
    if r.kind == "function":
        fa, fb = getattr(torch, A), getattr(torch, B)
        return _trace(lambda x: fa(fb(x))), _trace(lambda x: fa(x))
    if r.kind == "method":
        return _trace(lambda x: getattr(getattr(x, B)(), A)()), _trace(lambda x: getattr(x, A)())
    if r.kind == "matmul":
        fb = getattr(torch, B)
        return _trace(lambda x, y: torch.matmul(fb(x), y)), _trace(lambda x, y: torch.matmul(x, y))
    if r.kind == "add":
        fb = getattr(torch, B)
        return _trace(lambda x, y: x + fb(y)), _trace(lambda x, y: x + y)
    outer_cls, inner_cls = getattr(nn, A), getattr(nn, B)

    def module_step(gm, by_type) -> int:
        # one call per (inner name, outer name) pair of submodules of those types
        count = 0
        for inner in by_type.get(inner_cls, ()):
            for outer in by_type.get(outer_cls, ()):
                count += len(fx.replace_pattern(gm, _module_pattern([inner, outer], gm), _module_graph([outer])))
        return count

    return module_step


def _ruleset_rp(total: int) -> Callable[[], Runner]:
    def prepare() -> Runner:
        steps = [_gen_rp_step(r) for r in _generated(total - 2)]
        transpose = _transpose_rp_pair()

        def run(gm):
            count = 0
            by_type: dict = {}
            for name, module in gm.named_modules():
                by_type.setdefault(type(module), []).append(name)
            for step in steps:
                if callable(step):
                    count += step(gm, by_type)
                else:
                    count += len(fx.replace_pattern(gm, step[0], step[1]))
            count += _dropout_steps(gm)
            count += len(fx.replace_pattern(gm, *transpose))
            return count

        return run

    return prepare


def _ruleset_inductor(total: int) -> Callable[[], Runner]:
    def prepare() -> Runner:
        pm = _inductor()
        pattern_pass = pm.PatternMatcherPass()
        for r in _generated(total - 2):
            A, B = r.outer, r.inner
            x, y = pm.KeywordArg("x"), pm.KeywordArg("y")
            if r.kind == "function":
                pattern = pm.CallFunction(getattr(torch, A), pm.CallFunction(getattr(torch, B), x))
                handler = _replace_root_by_call("call_function", getattr(torch, A), ("x",))
            elif r.kind == "method":
                pattern = pm.CallMethod(A, pm.CallMethod(B, x))
                handler = _replace_root_by_call("call_method", A, ("x",))
            elif r.kind == "module":
                pattern = pm.CallModule(getattr(nn, A), pm.CallModule(getattr(nn, B), x))

                def handler(match, x):
                    node = match.output_node()
                    with node.graph.inserting_before(node):
                        new = node.graph.call_module(node.target, (x,))
                    node.replace_all_uses_with(new)
                    match.erase_nodes()
            elif r.kind == "matmul":
                pattern = pm.CallFunction(torch.matmul, pm.CallFunction(getattr(torch, B), x), y)
                handler = _replace_root_by_call("call_function", torch.matmul, ("x", "y"))
            else:
                pattern = pm.CallFunction(operator.add, x, pm.CallFunction(getattr(torch, B), y))
                handler = _replace_root_by_call("call_function", operator.add, ("x", "y"))
            pm.register_graph_pattern(pattern, pass_dict=pattern_pass)(handler)
        _register_dropout(pm, pattern_pass)
        _register_transpose(pm, pattern_pass)
        return _inductor_runner(pattern_pass)

    return prepare


# ---------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------

WORKLOADS: dict[str, Workload] = {}


def _add(w: Workload) -> None:
    WORKLOADS[w.name] = w


_add(Workload("single_add", "transformer", "one node: `x + y` -> `torch.add(x, y)` (3 per block)",
              ADD_RULE, True, _add_rp, _add_inductor))
_add(Workload("relu_relu", "mlp", "two nodes: `relu(relu(x))` -> `relu(x)` (every 2nd block)",
              RELU_RULE, True, _relu_rp, _relu_inductor))
_add(Workload("double_transpose", "transformer", "two nodes: `x.transpose(a, b).transpose(a, b)` -> `x` (1 per block)",
              TRANSPOSE_RULE, True, _transpose_rp, _transpose_inductor))
_add(Workload("linear_gelu_dropout", "mlp",
              "three nodes: Dropout(F.gelu(Linear(x))) -> F.gelu(Linear(x)) (1 per block)",
              CHAIN3_RULE, True, _chain3_rp, _chain3_inductor))
_add(Workload("dropout", "transformer", "module type: remove eval-mode Dropout (3 per block)",
              DROPOUT_RULE, True, _dropout_rp, _dropout_inductor))
_add(Workload("aten_cleanup", "exported",
              "torch.export graph: `aten.dropout(x, p, False)` -> `x` (3 per block), aten transpose pair -> `x` (1)",
              ATEN_RULES, True, _aten_rp, _aten_inductor, rule_count=2))
_add(Workload("module_pairs", "sequential",
              "modules only: `ReLU(ReLU(x))` -> `ReLU(x)` (1 per block), eval-mode Dropout -> `x` (1 per block)",
              MODULE_PAIRS_RULES, True, _module_pairs_rp, _module_pairs_inductor, rule_count=2))
_add(Workload("shared_input", "shared",
              "one input read by every block: `x + y` -> `torch.add(x, y)` and `relu(relu(x))` -> `relu(x)` (1 each per "
              "block); each add rewritten takes a user from the input", SHARED_RULES, True, _shared_rp, _shared_inductor,
              rule_count=2))
_add(Workload("relu_cascade", "relu_chain",
              "a chain of `torch.relu` collapsed by `relu(relu(x))` -> `relu(x)`, one pair after another (the peers "
              "run their pass until it rewrites nothing)", RELU_RULE, True, _cascade_rp, _cascade_inductor))
_add(Workload("transpose_chain", "transpose_chain",
              "`x.transpose(0, 1)` repeated: each pair -> `x`; every node is a view of the input", TRANSPOSE_RULE, True,
              _transpose_rp, _transpose_inductor))
_add(Workload("conv_bn", "cnn", "conv+bn folding with fxrules.builders.fold_conv_bn (2 per block)",
              CONV_BN_RULE, False, _conv_bn_rp, _conv_bn_inductor, builds=_conv_bn_builds))
for _n in (10, 50, 500):
    _add(Workload(f"rules{_n}", "transformer",
                  f"{_n} rules: dropout removal + double transpose, and {_n - 2} generated rules that never match",
                  _ruleset_text(_n), True, _ruleset_rp(_n), _ruleset_inductor(_n), rule_count=_n))


def get(name: str) -> Workload:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}") from None
