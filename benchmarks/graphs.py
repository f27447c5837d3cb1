"""Large, realistic torch.fx graphs for the benchmarks, sized by approximate node count.

Six families, each a plain ``torch.nn`` model traced with :func:`torch.fx.symbolic_trace` (or
captured with :func:`torch.export.export`: ``exported``), seeded (the global RNG is left alone)
and in eval mode:

``mlp``          Pre-norm residual MLP blocks:
                 ``x + relu(fc2(drop(F.gelu(fc1(norm(x))))))``; every second block applies
                 ``torch.relu`` twice (an activation at the end of a sub-block and again
                 after it, as composed code often does). Each block has its own Dropout,
                 as in timm/torchvision models. call_module + call_function.
``cnn``          :func:`fxrules.zoo.deep_cnn`: a ResNet-style stack of basic blocks,
                 Conv2d+BatchNorm2d+ReLU (modules) with residual ``+``, pooling, flatten, head.
                 The zoo gives every batch norm non-trivial statistics; here the last one of
                 each block also gets a small scale (like torchvision's
                 ``zero_init_residual``), so thousands of blocks neither overflow nor vanish.
``transformer``  Hand-written pre-norm encoder blocks: Linear/LayerNorm, ``x.size``,
                 ``reshape``/``permute``/``transpose``, ``torch.matmul``, ``F.softmax``,
                 ``F.gelu``, Dropout modules, a per-block learned attention bias
                 (``get_attr``), residual ``+``. Every block converts its attention output
                 to sequence-first and straight back (``t.transpose(1, 2).transpose(1, 2)``,
                 two helper functions meeting). All four node kinds occur: call_function,
                 call_method, call_module, get_attr.

``exported``     The ``transformer`` model captured with :func:`torch.export.export` instead, as
                 ``ExportedProgram.module()`` gives it back: aten operators (``aten.linear``,
                 ``aten.transpose.int``, ``aten.dropout.default(x, p, False)``, ...), every node
                 carrying ``meta['val']`` (fake tensors, so the engine's metadata guards run on
                 every match), parameters read by ``get_attr`` under dotted paths, and the input
                 guard call (``_guards_fn``) that ``module()`` puts at the top. The graphs
                 inductor's pattern matcher is built for. Exporting takes about a second per 1,000
                 nodes (outside every timing).

``sequential``   ``nn.Sequential`` of (Linear, ReLU, ReLU, Dropout) blocks: every node but the
                 input and the output is a module call (a graph made of modules, as
                 ``nn.Sequential`` models and many converted ones are).
``shared``       ``v = relu(relu(v + x))`` blocks that all read the model's input ``x``: one node
                 with as many users as there are blocks (a mask, a position table or an input
                 every layer reads, taken to the extreme). call_function only.

``make(family, nodes)`` picks the depth whose graph is closest to ``nodes`` nodes (the node
count per block is measured by tracing one and two blocks, so it stays right if a family
changes) and returns a :class:`Graph`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn

from fxrules import zoo

__all__ = ["FAMILIES", "Graph", "make", "build"]

SEED = 0

_MLP_WIDTH = 16
_SEQ, _DIM, _HEADS = 8, 32, 4


def _seeded(build: Callable[[], nn.Module], seed: int = SEED) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build()
    return model.eval()


# ---------------------------------------------------------------------------- mlp


class MLPBlock(nn.Module):
    def __init__(self, width: int, double_relu: bool, p: float = 0.1):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 2 * width)
        self.drop = nn.Dropout(p)
        self.fc2 = nn.Linear(2 * width, width)
        self.double_relu = double_relu

    def body(self, x: Tensor) -> Tensor:
        h = self.drop(F.gelu(self.fc1(self.norm(x))))  # Linear -> gelu -> Dropout
        return torch.relu(self.fc2(h))

    def forward(self, x: Tensor) -> Tensor:
        h = self.body(x)
        if self.double_relu:  # a sub-block that ends in relu, followed by relu again
            h = torch.relu(h)
        return x + h


class DeepMLP(nn.Module):
    def __init__(self, blocks: int, width: int = _MLP_WIDTH):
        super().__init__()
        self.blocks = nn.Sequential(*(MLPBlock(width, double_relu=i % 2 == 1) for i in range(blocks)))
        self.head = nn.Linear(width, 10)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.blocks(x))


# -------------------------------------------------------------------- transformer


def _seq_first(t: Tensor) -> Tensor:  # (B, H, S, D) -> (B, S, H, D)
    return t.transpose(1, 2)


def _heads_first(t: Tensor) -> Tensor:  # (B, S, H, D) -> (B, H, S, D)
    return t.transpose(1, 2)


class EncoderBlock(nn.Module):
    def __init__(self, dim: int = _DIM, heads: int = _HEADS, seq: int = _SEQ, hidden: int = 2 * _DIM,
                 p: float = 0.1):
        super().__init__()
        self.heads, self.head_dim, self.seq = heads, dim // heads, seq
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.attn_bias = nn.Parameter(torch.randn(heads, seq, seq) * 0.02)  # a get_attr node
        self.attn_drop = nn.Dropout(p)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(p)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.mlp_drop = nn.Dropout(p)

    def forward(self, x: Tensor) -> Tensor:
        batch = x.size(0)  # call_method size
        qkv = self.qkv(self.norm1(x)).reshape(batch, self.seq, 3, self.heads, self.head_dim)
        qkv = qkv.permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]  # operator.getitem
        scores = torch.matmul(q, k.transpose(-2, -1)) * self.scale + self.attn_bias
        attn = self.attn_drop(F.softmax(scores, dim=-1))
        ctx = _heads_first(_seq_first(torch.matmul(attn, v)))  # a layout round trip
        ctx = ctx.permute(0, 2, 1, 3).reshape(batch, self.seq, self.heads * self.head_dim)
        x = x + self.proj_drop(self.proj(ctx))
        return x + self.mlp_drop(self.fc2(F.gelu(self.fc1(self.norm2(x)))))


class DeepTransformer(nn.Module):
    def __init__(self, blocks: int, seq: int = _SEQ, dim: int = _DIM):
        super().__init__()
        self.pos = nn.Parameter(torch.randn(1, seq, dim) * 0.02)
        self.blocks = nn.Sequential(*(EncoderBlock() for _ in range(blocks)))
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(self.blocks(x + self.pos))


# ---------------------------------------------------------------------------- cnn


def _deep_cnn(depth: int) -> nn.Module:
    model = zoo.deep_cnn(depth)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(SEED + 1)
        for block in model.blocks:
            block.bn2.weight.uniform_(0.0, 0.05)
            block.bn2.bias.uniform_(-0.05, 0.05)
    return model.eval()


# --------------------------------------------------------------------- sequential


def _sequential(depth: int, width: int = _MLP_WIDTH) -> nn.Module:
    return nn.Sequential(*(module for _ in range(depth)
                           for module in (nn.Linear(width, width), nn.ReLU(), nn.ReLU(), nn.Dropout(0.1))))


# ------------------------------------------------------------------------- shared


class SharedInput(nn.Module):
    """``depth`` blocks ``v = relu(relu(v + x))``: every block reads the input."""

    def __init__(self, depth: int):
        super().__init__()
        self.depth = depth

    def forward(self, x: Tensor) -> Tensor:
        v = x
        for _ in range(self.depth):
            v = torch.relu(torch.relu(v + x))
        return v


# ------------------------------------------------------------------------- chains


class Chain(nn.Module):
    """``x = step(x)``, ``depth`` times: ``torch.relu`` (each rewrite of a pair leaves a new pair: a cascade),
    or ``x.transpose(0, 1)`` (every node a view of the input, the last one returned)."""

    def __init__(self, depth: int, step: Callable[[Tensor], Tensor]):
        super().__init__()
        self.depth, self.step = depth, step

    def forward(self, x: Tensor) -> Tensor:
        for _ in range(self.depth):
            x = self.step(x)
        return x


def _transpose(x: Tensor) -> Tensor:
    return x.transpose(0, 1)


# ------------------------------------------------------------------------ registry

#: family -> (model factory taking a depth, input shape)
FAMILIES: dict[str, tuple[Callable[[int], nn.Module], tuple[int, ...]]] = {
    "mlp": (lambda depth: _seeded(lambda: DeepMLP(depth)), (2, _MLP_WIDTH)),
    "cnn": (_deep_cnn, (2, 3, 16, 16)),
    "transformer": (lambda depth: _seeded(lambda: DeepTransformer(depth)), (2, _SEQ, _DIM)),
    "exported": (lambda depth: _seeded(lambda: DeepTransformer(depth)), (2, _SEQ, _DIM)),
    "sequential": (lambda depth: _seeded(lambda: _sequential(depth)), (2, _MLP_WIDTH)),
    "shared": (lambda depth: SharedInput(depth).eval(), (2, _MLP_WIDTH)),
    "relu_chain": (lambda depth: Chain(depth, torch.relu).eval(), (2, _MLP_WIDTH)),
    "transpose_chain": (lambda depth: Chain(2 * depth, _transpose).eval(), (2, _MLP_WIDTH)),
}


def _export(model: nn.Module, shape: tuple) -> fx.GraphModule:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        return torch.export.export(model, (torch.randn(shape),)).module()


def capture(family: str, model: nn.Module) -> fx.GraphModule:
    """The graph a family's model is benchmarked on: ``symbolic_trace``, or ``torch.export`` for ``exported``."""
    if family == "exported":
        return _export(model, FAMILIES[family][1])
    return fx.symbolic_trace(model)


@dataclass
class Graph:
    family: str
    depth: int
    model: nn.Module  # eval mode
    gm: fx.GraphModule  # capture(family, model): symbolic_trace, or torch.export's module()
    example: tuple  # one random input

    @property
    def nodes(self) -> int:
        return len(self.gm.graph.nodes)


_PER_BLOCK: dict[str, tuple[int, float]] = {}


def _node_count(family: str, depth: int) -> int:
    return len(capture(family, FAMILIES[family][0](depth)).graph.nodes)


def depth_for(family: str, nodes: int) -> int:
    """The depth whose graph has about ``nodes`` nodes (at least 1)."""
    if family not in _PER_BLOCK:
        one, three = _node_count(family, 1), _node_count(family, 3)
        per_block = (three - one) / 2  # the mlp alternates 7- and 8-node blocks
        _PER_BLOCK[family] = (one - per_block, per_block)
    base, per_block = _PER_BLOCK[family]
    return max(1, round((nodes - base) / per_block))


def build(family: str, depth: int, *, seed: int = SEED) -> Graph:
    factory, shape = FAMILIES[family]
    model = factory(depth)
    gm = capture(family, model)
    generator = torch.Generator().manual_seed(seed)
    return Graph(family, depth, model, gm, (torch.randn(shape, generator=generator),))


def make(family: str, nodes: int, *, seed: int = SEED) -> Graph:
    """A traced ``family`` model with about ``nodes`` nodes (see the module docstring)."""
    if family not in FAMILIES:
        raise KeyError(f"unknown graph family {family!r}; known: {', '.join(FAMILIES)}")
    return build(family, depth_for(family, nodes), seed=seed)


if __name__ == "__main__":  # python -m benchmarks.graphs: node counts and op kinds per family
    from collections import Counter

    for name in FAMILIES:
        for n in (1000, 5000):
            g = make(name, n)
            kinds = Counter(node.op for node in g.gm.graph.nodes)
            print(f"{name:12} depth={g.depth:5} nodes={g.nodes:6} {dict(kinds)}")
