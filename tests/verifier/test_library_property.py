"""The design card's property across the whole library: on random models from the bundled zoo,
applying every non-[changes] rule keeps the outputs whenever the shapes are kept."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fxrules
from fxrules import zoo
from fxrules.verifier.driver import compare

LIBRARY = fxrules.load_rules(fxrules.LIBRARY)
KEEPING = LIBRARY.select(contracts=["exact", "approx"])
ZOO_MODELS = sorted(zoo.ZOO) + ["deep_mlp", "deep_cnn", "deep_transformer"]


def _model(name: str, depth: int) -> torch.nn.Module:
    return getattr(zoo, name)(depth) if name.startswith("deep_") else zoo.ZOO[name]()


def _redraw_weights(model: torch.nn.Module, seed: int) -> None:
    """Every parameter and floating buffer drawn anew (variances kept positive)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
            if not tensor.dtype.is_floating_point:
                continue
            values = torch.randn(tensor.shape, generator=generator, dtype=torch.float64) * 0.5
            if name.endswith("running_var"):
                values = values.abs() * 2 + 0.1
            tensor.copy_(values.to(tensor.dtype))


def _run(module: torch.nn.Module, inputs: tuple, seed: int):
    torch.manual_seed(seed)  # train-mode dropout draws the same masks before and after
    with torch.no_grad():
        return module(*[t.clone() for t in inputs])


@settings(max_examples=min(15, settings.default.max_examples))
@given(name=st.sampled_from(ZOO_MODELS), depth=st.integers(1, 3), weights=st.integers(0, 2**31 - 1),
       values=st.integers(0, 2**31 - 1), training=st.sampled_from([False, False, True]),
       dtype=st.sampled_from([torch.float32, torch.float64]))
@pytest.mark.slow
def test_non_changes_rules_keep_zoo_outputs(name, depth, weights, values, training, dtype):
    model = _model(name, depth).to(dtype)
    _redraw_weights(model, weights)
    model.train(training)
    inputs = tuple(t.to(dtype) for t in zoo.example_inputs(name, seed=values % 1000))
    before = _run(model, inputs, values)
    result = fxrules.apply_rules(model, KEEPING, example_inputs=inputs)
    after = _run(result.module, inputs, values)
    outcome = compare(before, after, "approx", reference=None)
    if outcome.shapes_kept:
        assert outcome.problem is None, (outcome.problem, result.report.counts)
    if not training:
        assert result.report.applied, f"no library rule fired on the {name} model"


def test_the_library_fires_widely_on_the_zoo():
    fired = set()
    for name in sorted(zoo.ZOO):
        model = zoo.ZOO[name]()
        result = fxrules.apply_rules(model, KEEPING, example_inputs=zoo.example_inputs(name))
        fired |= set(result.report.counts)
    assert len(fired) >= 10, sorted(fired)
