"""A zoo of small models for demos, tests and benchmarks.

Every model here traces with :func:`torch.fx.symbolic_trace`, runs on the inputs
:func:`example_inputs` gives for it, and is deterministic: its factory builds it
from a fixed seed (without touching the global RNG state) and returns it in eval
mode, so dropout is the identity and batch norms use their running statistics.
Batch norms get non-trivial running statistics, so a wrong conv/bn fold shows.

==================  =============================================================
``mlp``             Linear layers and the four spellings of ReLU (module,
                    ``torch.relu``, ``F.relu``, ``x.relu()``), Dropout modules.
``resnet``          A tiny ResNet: Conv2d/BatchNorm2d/ReLU blocks with residual
                    ``x + y``, adaptive average pooling, ``torch.flatten(x, 1)``,
                    a Linear head.
``transformer``     One hand-written pre-norm encoder block over a learned
                    positional embedding (``self.pos``): all four node kinds,
                    ``call_function``, ``call_method``, ``call_module`` and
                    ``get_attr``, occur in its graph.
``methods``         Chains of tensor methods: double transposes, ``.relu().relu()``,
                    ``.view``/``.contiguous``, ``.sum(dim=1)`` beside
                    ``torch.sum(x, 1)``, ``x.mul(1)``.
``redundant``       What the bundled cleanup rules remove, in the spellings the
                    rules match: ``relu(relu(x))``, double transposes, ``x * 1``,
                    ``x + 0``, Dropout, ``torch.flatten`` of a 2-D tensor, conv+bn,
                    ``x + self.zero_bias``, ``x + x``. The README's demo model.
==================  =============================================================

:func:`deep_mlp`, :func:`deep_cnn` and :func:`deep_transformer` generate the same
kinds of graph at any depth, for benchmarks; :func:`example_inputs` knows their
names too (their input shape does not depend on the depth).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "ZOO",
    "MLP",
    "ResNet",
    "Transformer",
    "Methods",
    "Redundant",
    "DeepMLP",
    "DeepCNN",
    "mlp",
    "resnet",
    "transformer",
    "methods",
    "redundant",
    "deep_mlp",
    "deep_cnn",
    "deep_transformer",
    "example_inputs",
]

SEED = 0

# Input shapes, shared by the models and example_inputs.
_BATCH = 2
_MLP_IN = 16
_IMAGE = (3, 16, 16)  # channels, height, width
_SEQ, _DIM, _HEADS = 8, 32, 4
_METHODS_SHAPE = (4, 6)


def _seeded(build: Callable[[], nn.Module], seed: int = SEED) -> nn.Module:
    """Build a module from ``seed`` without disturbing the caller's RNG, and put it in eval mode."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build()
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                _randomize_bn(module)
    return model.eval()


def _randomize_bn(bn: nn.modules.batchnorm._BatchNorm) -> None:
    """Give a batch norm statistics and affine parameters that are not the defaults."""
    with torch.no_grad():
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
        if bn.affine:
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)


# --------------------------------------------------------------------------- mlp


class MLP(nn.Module):
    """Linear layers separated by every spelling of ReLU, with Dropout modules."""

    def __init__(self, sizes: tuple[int, ...] = (_MLP_IN, 32, 32, 32, 10), p: float = 0.1):
        super().__init__()
        self.fc1 = nn.Linear(sizes[0], sizes[1])
        self.act1 = nn.ReLU()
        self.drop1 = nn.Dropout(p)
        self.fc2 = nn.Linear(sizes[1], sizes[2])
        self.drop2 = nn.Dropout(p)
        self.fc3 = nn.Linear(sizes[2], sizes[3])
        self.fc4 = nn.Linear(sizes[3], sizes[4])

    def forward(self, x: Tensor) -> Tensor:
        x = self.drop1(self.act1(self.fc1(x)))  # call_module ReLU
        x = self.drop2(torch.relu(self.fc2(x)))  # call_function torch.relu
        x = F.relu(self.fc3(x))  # call_function F.relu
        return self.fc4(x).relu()  # call_method relu


def mlp() -> MLP:
    """The ``mlp`` zoo model, seeded and in eval mode. Input: ``(2, 16)``."""
    return _seeded(MLP)


# ------------------------------------------------------------------------ resnet


class BasicBlock(nn.Module):
    """Two 3x3 conv/bn layers with a residual ``out + identity`` (projected when the shape changes)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.downsample: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.downsample(x))  # operator.add


class ResNet(nn.Module):
    """A stem, residual stages, global average pooling, ``torch.flatten(x, 1)`` and a Linear head."""

    def __init__(self, widths: tuple[int, ...] = (8, 16), blocks_per_stage: int = 1, num_classes: int = 10):
        super().__init__()
        self.stem = nn.Conv2d(_IMAGE[0], widths[0], 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU()
        layers: list[nn.Module] = []
        channels = widths[0]
        for stage, width in enumerate(widths):
            for index in range(blocks_per_stage):
                stride = 2 if stage > 0 and index == 0 else 1
                layers.append(BasicBlock(channels, width, stride))
                channels = width
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.relu(self.bn(self.stem(x)))
        x = self.layers(x)
        x = torch.flatten(self.pool(x), 1)
        return self.fc(x)


def resnet() -> ResNet:
    """The ``resnet`` zoo model, seeded and in eval mode. Input: ``(2, 3, 16, 16)``."""
    return _seeded(ResNet)


# ------------------------------------------------------------------- transformer


class EncoderBlock(nn.Module):
    """A pre-norm transformer encoder block written out by hand (no nn.MultiheadAttention).

    Attention uses ``reshape``/``permute``/``transpose``/``view``, ``torch.matmul``, the ``@``
    operator and ``softmax``; the feed-forward part uses ``nn.GELU``; both end in Dropout
    and a residual add.
    """

    def __init__(self, dim: int = _DIM, heads: int = _HEADS, hidden: int = 2 * _DIM, p: float = 0.1):
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim={dim} is not divisible by heads={heads}")
        self.heads = heads
        self.head_dim = dim // heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.attn_drop = nn.Dropout(p)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(p)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)
        self.mlp_drop = nn.Dropout(p)

    def forward(self, x: Tensor) -> Tensor:
        batch, seq, dim = x.size(0), x.size(1), x.size(2)  # call_method size: traces to proxies
        qkv = self.qkv(self.norm1(x)).reshape(batch, seq, 3, self.heads, self.head_dim)
        qkv = qkv.permute(2, 0, 3, 1, 4)  # (3, batch, heads, seq, head_dim)
        q, k, v = qkv[0], qkv[1], qkv[2]  # operator.getitem
        scores = torch.matmul(q, k.transpose(-2, -1)) * self.scale
        attn = self.attn_drop(F.softmax(scores, dim=-1))
        out = (attn @ v).transpose(1, 2).contiguous().view(batch, seq, dim)  # operator.matmul
        x = x + self.proj_drop(self.proj(out))
        return x + self.mlp_drop(self.fc2(self.act(self.fc1(self.norm2(x)))))


class Transformer(nn.Module):
    """A learned positional embedding (read as ``get_attr pos``), encoder blocks, a final LayerNorm."""

    def __init__(self, blocks: int = 1, seq: int = _SEQ, dim: int = _DIM, heads: int = _HEADS):
        super().__init__()
        self.pos = nn.Parameter(torch.randn(1, seq, dim) * 0.02)
        self.blocks = nn.Sequential(*(EncoderBlock(dim, heads) for _ in range(blocks)))
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(self.blocks(x + self.pos))


def transformer() -> Transformer:
    """The ``transformer`` zoo model (one block), seeded and in eval mode. Input: ``(2, 8, 32)``."""
    return _seeded(Transformer)


# ----------------------------------------------------------------------- methods


class Methods(nn.Module):
    """Mostly ``call_method`` nodes, including chains the cleanup rules collapse."""

    def forward(self, x: Tensor) -> Tensor:
        a = x.transpose(0, 1).transpose(0, 1)  # a double transpose
        b = a.relu().relu()  # relu twice, as methods
        c = b.view(-1).contiguous().view(x.size(0), x.size(1))
        by_method = c.sum(dim=1)  # the same reduction, spelt two ways
        by_function = torch.sum(c, 1)
        d = c.mul(1).add(by_method.unsqueeze(1))
        return d.neg().abs() + by_function.unsqueeze(-1)


def methods() -> Methods:
    """The ``methods`` zoo model (no parameters), in eval mode. Input: ``(4, 6)``."""
    return _seeded(Methods)


# --------------------------------------------------------------------- redundant


class Redundant(nn.Module):
    """A model the bundled cleanup rules shrink a lot; the README demo.

    Each line of :meth:`forward` is one thing a rule removes, in the spelling the rule
    matches: conv+bn (eval), ``torch.relu(torch.relu(x))``, Dropout, ``torch.flatten(x, 1)``
    of a tensor already 2-D, ``x.transpose(0, 1).transpose(0, 1)``, ``x * 1``, ``x + 0``,
    ``x + self.zero_bias`` with an all-zero parameter, and ``x + x``.
    """

    def __init__(self, channels: int = 8, features: int = 16):
        super().__init__()
        self.conv = nn.Conv2d(_IMAGE[0], channels, 3, padding=1)
        self.bn = nn.BatchNorm2d(channels)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.drop = nn.Dropout(0.25)
        self.fc = nn.Linear(channels, features)
        self.zero_bias = nn.Parameter(torch.zeros(features))
        self.head = nn.Linear(features, 10)

    def forward(self, x: Tensor) -> Tensor:
        x = self.bn(self.conv(x))  # conv + bn, foldable in eval mode
        x = torch.relu(torch.relu(x))  # relu is idempotent
        x = torch.flatten(self.pool(x), 1)  # a real flatten: 4-D to 2-D
        x = self.drop(x)  # dropout is the identity in eval mode
        x = torch.flatten(x, 1)  # a no-op: x is already 2-D
        x = self.fc(x)
        x = x.transpose(0, 1).transpose(0, 1)  # two transposes cancel
        x = x * 1  # operator.mul by one
        x = x + 0  # operator.add of zero
        x = x + self.zero_bias  # get_attr zero_bias, an all-zero parameter
        x = x + x  # operator.add of a value to itself: 2 * x
        return self.head(x)


def redundant() -> Redundant:
    """The ``redundant`` zoo model, seeded and in eval mode. Input: ``(2, 3, 16, 16)``."""
    return _seeded(Redundant)


# ------------------------------------------------------------- deep generators


class DeepMLP(nn.Module):
    """``layers`` residual layers ``x + drop(relu(linear(x)))``: four nodes per layer."""

    def __init__(self, layers: int, width: int = _MLP_IN, p: float = 0.1):
        super().__init__()
        self.linears = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))
        self.drop = nn.Dropout(p)

    def forward(self, x: Tensor) -> Tensor:
        for linear in self.linears:
            x = x + self.drop(torch.relu(linear(x)))
        return x


class DeepCNN(nn.Module):
    """A conv/bn/relu stem, ``blocks`` residual basic blocks at one width, pooling and a head."""

    def __init__(self, blocks: int, width: int = 8, num_classes: int = 10):
        super().__init__()
        self.stem = nn.Conv2d(_IMAGE[0], width, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(width)
        self.relu = nn.ReLU()
        self.blocks = nn.Sequential(*(BasicBlock(width, width) for _ in range(blocks)))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(width, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.blocks(self.relu(self.bn(self.stem(x))))
        return self.fc(torch.flatten(self.pool(x), 1))


def _check_depth(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return value


def deep_mlp(layers: int) -> DeepMLP:
    """An MLP of ``layers`` residual layers (about ``4 * layers`` nodes). Input: ``(2, 16)``."""
    _check_depth("layers", layers)
    return _seeded(lambda: DeepMLP(layers))


def deep_cnn(blocks: int) -> DeepCNN:
    """A CNN of ``blocks`` residual conv blocks (about ``7 * blocks`` nodes). Input: ``(2, 3, 16, 16)``."""
    _check_depth("blocks", blocks)
    return _seeded(lambda: DeepCNN(blocks))


def deep_transformer(blocks: int) -> Transformer:
    """A transformer of ``blocks`` encoder blocks (about ``30 * blocks`` nodes). Input: ``(2, 8, 32)``."""
    _check_depth("blocks", blocks)
    return _seeded(lambda: Transformer(blocks=blocks))


# --------------------------------------------------------------------- registry

#: The fixed-size zoo models by name. Each call returns a fresh, identical instance.
ZOO: dict[str, Callable[[], nn.Module]] = {
    "mlp": mlp,
    "resnet": resnet,
    "transformer": transformer,
    "methods": methods,
    "redundant": redundant,
}

_INPUT_SHAPES: dict[str, tuple[int, ...]] = {
    "mlp": (_BATCH, _MLP_IN),
    "resnet": (_BATCH, *_IMAGE),
    "transformer": (_BATCH, _SEQ, _DIM),
    "methods": _METHODS_SHAPE,
    "redundant": (_BATCH, *_IMAGE),
    "deep_mlp": (_BATCH, _MLP_IN),
    "deep_cnn": (_BATCH, *_IMAGE),
    "deep_transformer": (_BATCH, _SEQ, _DIM),
}


def example_inputs(name: str, *, seed: int = SEED) -> tuple[Tensor, ...]:
    """Positional inputs for the zoo model ``name`` (a :data:`ZOO` key or a ``deep_*`` name).

    The tensors are float32 on the CPU, drawn from a private generator seeded with ``seed``,
    so the same call always returns equal tensors and the global RNG is left alone.
    """
    try:
        shape = _INPUT_SHAPES[name]
    except KeyError:
        known = ", ".join(sorted(_INPUT_SHAPES))
        raise KeyError(f"no zoo model named {name!r}; known: {known}") from None
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=generator),)

