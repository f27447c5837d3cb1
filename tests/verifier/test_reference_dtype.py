"""The verifier's float64 reference for [approx] runs the host with float64 as the default dtype.

A host that makes floats from integers (`int64 + 0.25`, drawn by the verifier) made float32 ones
in the "float64" run, the float64 module then failed on them, and the reference was silently
missing: a fold's rounding on large values was then judged by float32 tolerance alone
(fuse_conv1d_bn_relu was graded wrong on such a host though it is as accurate as the original).
"""

from __future__ import annotations

import torch
from torch import nn

from fxrules.verifier import driver


class IntPlusQuarter(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        return self.fc(torch.add(x, 0.25))


def test_the_reference_of_an_integer_input_host_is_float64_and_the_default_is_restored():
    default = torch.get_default_dtype()
    reference = driver._reference(IntPlusQuarter(), (torch.arange(6).reshape(2, 3),))
    assert reference is not None and reference.dtype == torch.float64
    assert torch.get_default_dtype() is default
