"""A builder the guard tests name from rule text (``allow_imports=["tests"]``)."""

import copy

import torch
from torch import nn


class FusedWithBatchNorm(nn.Sequential):
    """A conv followed by a batch norm in training mode: calling it updates the running statistics."""


def fuse_with_training_bn(conv: nn.Module) -> nn.Module:
    """A fused module holding a copy of ``conv`` and a fresh, training-mode BatchNorm2d.

    It records the buffers it made (``made_state``, a plain dict, not module state), so a test can
    compare what the rewritten model holds before any call with what the builder built."""
    fused = FusedWithBatchNorm(copy.deepcopy(conv), nn.BatchNorm2d(conv.out_channels, affine=False)).train()
    fused.made_state = {name: buffer.clone() for name, buffer in fused.named_buffers()}
    return fused


class CountsCalls(nn.Module):
    """Counts its calls in a buffer and draws a random number: a real run shows in its state and
    in the global generator. Fake tensors cannot run it (it reads a value with ``.item()``)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        self.calls += 1
        torch.rand(1)
        return x * (1 + 0 * int(x.sum().item() > 1e9))


def counts_calls(conv: nn.Module) -> nn.Module:
    """``conv`` then a :class:`CountsCalls`, in eval mode."""
    return nn.Sequential(copy.deepcopy(conv), CountsCalls()).eval()
