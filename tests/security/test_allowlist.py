"""The allow-list (fxrules.lang.allowlist): every public callable is on the table or refused everywhere,
and nothing on the table has an effect outside its outputs."""

from __future__ import annotations

import builtins
import math
import operator
import re
import sys
import types

import pytest
import torch

import fxrules
from fxrules.lang import allowlist
from fxrules.lang.allowlist import Position

POSITIONS = tuple(Position)

ROOTS = {"torch": torch, "builtins": builtins, "operator": operator, "math": math, "fxrules": fxrules}


def _public_callables():
    """(dotted path, object) for every public callable reachable by attribute walk over imported modules.

    Only modules already in sys.modules are entered (nothing is imported); each object is reported
    once per path under its module, down to modules of the same root.
    """
    seen_modules: set[int] = set()
    out: list[tuple[str, object]] = []
    stack = [(name, module) for name, module in ROOTS.items()]
    while stack:
        prefix, module = stack.pop()
        if id(module) in seen_modules:
            continue
        seen_modules.add(id(module))
        try:
            names = list(vars(module))
        except TypeError:
            continue
        for name in names:
            if name.startswith("_"):
                continue
            value = vars(module).get(name)
            path = f"{prefix}.{name}"
            if isinstance(value, types.ModuleType):
                if value.__name__ in sys.modules and value.__name__.split(".")[0] == prefix.split(".")[0]:
                    stack.append((path, value))
                continue
            if callable(value):
                out.append((path, value))
    return out


CALLABLES = _public_callables()


def test_the_walk_sees_a_lot():
    assert len(CALLABLES) > 5000
    assert any(p == "torch.hub.load" for p, _ in CALLABLES)


def _allowed_somewhere(path: str) -> bool:
    return (any(allowlist.function_allowed(path, p) for p in POSITIONS)
            or allowlist.refuse_module_type(path) is None or allowlist.refuse_builder(path) is None
            or allowlist.refuse_constant(path) is None or allowlist.refuse_condition_call(path) is None)


def test_every_public_callable_is_on_the_table_or_refused_in_every_position():
    table = (allowlist.FUNCTIONS | allowlist.MATCH_ONLY_FUNCTIONS | allowlist.MODULE_TYPES | allowlist.BUILDERS
             | allowlist.CONSTANTS | {f"torch.Tensor.{m}" for m in allowlist.TENSOR_METHODS})
    loose = [path for path, _ in CALLABLES if _allowed_somewhere(path) and path not in table
             and not allowlist._operator(path)]
    assert loose == []


def test_nothing_but_the_table_is_allowed_by_path_tricks():
    for path in ("torch._C._nn.gelu", "torch.ops.aten", "torch.ops.aten.add.overloads", "torch.ops.aten.add._schema",
                 "torch.ops.profiler._record_function_enter", "torch.ops.load_library", "torch.ops.aten.add.__call__",
                 "torch.nn.functional.torch.save", "torch.relu.__globals__", "builtins.__import__"):
        assert not _allowed_somewhere(path), path


# -- the table's review ------------------------------------------------------------------------------

EFFECT_WORDS = re.compile(
    r"file|save|load|seed|rng|print|profil|hook|script|jit|compile|export|serial|pickle|^hub$|^hub_|_hub$|system|exec|eval|"
    r"import|library|extension|distributed|process|thread|^set_|deterministic|grad_enabled|anomaly|storage|"
    r"share|mmap|open|callback|autocast|parse|numpy|register|parallel|token|cufft|getattr|setattr|delattr|"
    r"globals|locals|^vars$|^input$|breakpoint|^exit$|^quit$|^help$|vmap|while_loop|^apply_$|^map2?_$")

KNOWN_BAD = (
    "torch.hub.load", "torch.hub.download_url_to_file", "torch.save", "torch.load", "torch.from_file",
    "torch.utils.cpp_extension.load", "torch.utils.cpp_extension.load_inline", "torch.ops.load_library",
    "torch.classes.load_library", "torch.compile", "torch.jit.script", "torch.jit.trace", "torch.jit.load",
    "torch.jit.save", "torch.export.export", "torch.export.save", "torch.export.load", "torch.onnx.export",
    "torch.set_default_dtype", "torch.set_default_device", "torch.set_default_tensor_type", "torch.manual_seed",
    "torch.seed", "torch.initial_seed", "torch.set_rng_state", "torch.random.manual_seed",
    "torch.use_deterministic_algorithms", "torch.set_grad_enabled", "torch.set_num_threads",
    "torch.set_printoptions", "torch.set_float32_matmul_precision", "torch.set_warn_always",
    "torch.backends.cudnn.flags", "torch.backends.mkldnn.flags", "torch.autograd.set_detect_anomaly",
    "torch._dynamo.utils.subprocess.run", "torch._C._jit_pass_inline", "torch.package.PackageImporter",
    "torch.utils.data.DataLoader", "torch.multiprocessing.spawn", "torch.distributed.init_process_group",
    "torch.cuda.memory._record_memory_history", "torch.autograd.grad", "torch.cond", "torch.vmap",
    "torch.func.functional_call", "torch.library.define", "torch.overrides.handle_torch_function",
    "torch.get_device_module", "torch.nn.DataParallel", "torch.nn.parallel.DistributedDataParallel",
    "torch.Tensor.apply_", "torch.Tensor.map_", "torch.Tensor.map2_", "torch.Tensor.register_hook",
    "torch.Tensor.backward", "torch.Tensor.share_memory_", "torch.Tensor.untyped_storage", "torch.Tensor.numpy",
    "torch.ops.aten.from_file", "torch.ops.aten._print", "torch.ops.aten.save",
    "builtins.eval", "builtins.exec", "builtins.open", "builtins.__import__", "builtins.compile",
    "builtins.getattr", "builtins.setattr", "builtins.delattr", "builtins.globals", "builtins.vars",
    "builtins.input", "builtins.breakpoint", "builtins.print", "builtins.type", "builtins.object",
    "operator.attrgetter", "operator.methodcaller", "operator.call", "operator.itemgetter",
    "fxrules.apply_rules", "fxrules.load_rules", "fxrules.tools.cli.main", "fxrules.testing.check_rule",
    # red team: a memory address, device runtimes initialised, process queries, futures, pinned memory,
    # storage repointed
    "torch.Tensor.const_data_ptr", "torch.Tensor.cuda", "torch.Tensor.xpu", "torch.Tensor.ipu", "torch.Tensor.mtia",
    "torch.get_float32_matmul_precision", "torch.is_vulkan_available", "torch.wait",
    "torch.ops.aten.pin_memory", "torch.ops.aten._pin_memory", "torch.ops.aten.is_pinned",
    "torch.ops.aten._cudnn_init_dropout_state", "torch.ops.aten.set", "torch.ops.aten.set.source_Tensor",
    "torch.ops.aten._version",
)


@pytest.mark.parametrize("path", KNOWN_BAD)
def test_known_bad_names_are_refused_where_they_could_run(path):
    for position in (Position.REPLACEMENT, Position.EXAMPLE):
        assert allowlist.refuse_function(path, position) is not None
    method = path.removeprefix("torch.Tensor.")
    if method != path:
        assert allowlist.refuse_method(method, Position.REPLACEMENT) is not None
    assert allowlist.refuse_constant(path) is not None
    assert allowlist.refuse_condition_call(path) is not None
    assert allowlist.refuse_builder(path) is not None
    assert allowlist.refuse_module_type(path) is not None


def test_no_table_entry_has_an_effect_word():
    entries = (allowlist.FUNCTIONS | allowlist.MODULE_TYPES | allowlist.CONSTANTS
               | {f"torch.Tensor.{m}" for m in allowlist.TENSOR_METHODS}
               | {f"torch.ops.{ns}.{n}" for ns, names in allowlist.OPERATORS.items() for n in names})
    flagged = sorted(p for p in entries if EFFECT_WORDS.search(p.rsplit(".", 1)[-1]))
    assert flagged == []


def test_table_entries_are_defined_in_torch_math_operator_or_builtins():
    """What a table path names today is an object of torch, math, operator or builtins (no re-exported os/sys)."""
    for path in sorted(allowlist.FUNCTIONS):
        root, *rest = path.split(".")
        value = ROOTS[root]
        for part in rest:
            value = getattr(value, part)
        module = getattr(value, "__module__", None) or ""
        assert module.split(".")[0] in ("torch", "math", "operator", "_operator", "builtins", "typing", ""), path


def test_the_table_names_the_torch_it_was_made_from():
    assert re.match(r"\d+\.\d+", allowlist.TORCH_VERSION)


def test_the_builders_table_is_fxrules_builders():
    import fxrules.builders

    assert {f"fxrules.builders.{n}" for n in fxrules.builders.BUILDERS} <= allowlist.BUILDERS
    for path in allowlist.BUILDERS:
        assert callable(getattr(fxrules.builders, path.rsplit(".", 1)[1]))


def test_allowed_packages_extend_the_list_but_not_torch():
    assert allowlist.refuse_builder("mypkg.build", allowlist.packages_of(["mypkg"])) is None
    assert allowlist.refuse_function("torch.save", Position.REPLACEMENT, allowlist.packages_of(["torch"])) is not None
