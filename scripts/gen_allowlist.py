"""Generate fxrules/lang/allowlist.json: what rule files may name, from torch's own lists.

Run with the torch the table should describe::

    PYTHONPATH=. python scripts/gen_allowlist.py > /tmp/table.json && mv /tmp/table.json fxrules/lang/allowlist.json

(not straight into the table: fxrules imports it, and a shell redirect empties it first).

Sources (torch's lists of tensor functions, not a hand-written list):

* functions: ``torch.overrides.get_testing_overrides()`` (every function torch dispatches
  ``__torch_function__`` for) and ``torch.overrides.get_ignored_functions()`` (tensor factories
  and the like), each named by the public path where it lives in ``torch``,
  ``torch.nn.functional``, ``torch.special``, ``torch.linalg`` or ``torch.fft``; every public
  function of ``operator`` and ``math``; a fixed list of pure builtins;
* Tensor methods: the public methods in ``get_overridable_functions()[torch.Tensor]``;
* operators: the op names of the ``aten`` and ``prims`` namespaces
  (``torch._C._dispatch_get_all_op_names()``), overloads checked structurally;
* module types: the ``nn.Module`` subclasses exported by ``torch.nn``;
* flags: which of those draw random numbers (the ``random_*`` arrays): ops with an overload tagged
  ``nondeterministic_seeded`` (torch's own mark), functions and methods of the same names, and
  the reviewed :data:`PYTHON_RANDOM` and :data:`RANDOM_MODULE_TYPES`.

Then everything with an effect outside its outputs is taken out (files, processes, network,
native libraries, global state, RNG seeding, grad mode, code execution, serialization,
export/script/compile, callables taken and called): ``DENIED_WORDS`` and ``DENIED_NAMES`` below,
which tests/security/test_allowlist.py re-applies to the checked-in table. The table is read
without torch: a JSON object of sorted arrays (fxrules.lang.packaged), read into frozensets.
"""

from __future__ import annotations

import builtins
import inspect
import math
import operator
import re
import sys

import torch
import torch.overrides

from fxrules.lang.packaged import json_text

NAMESPACES = {
    "torch": torch,
    "torch.nn.functional": torch.nn.functional,
    "torch.special": torch.special,
    "torch.linalg": torch.linalg,
    "torch.fft": torch.fft,
}

PURE_BUILTINS = (
    "abs", "all", "any", "bool", "complex", "divmod", "enumerate", "float", "int", "isinstance", "len", "list",
    "max", "min", "pow", "range", "reversed", "round", "slice", "sorted", "sum", "tuple", "zip", "dict", "str",
)
"""Builtins that compute from their arguments only (``getattr``/``type`` are match-only, below)."""

MATCH_ONLY = (
    "builtins.getattr", "builtins.type", "operator.attrgetter", "operator.methodcaller", "operator.itemgetter",
    "operator.call", "builtins.print",
    # cost grows with the value, not the size of the arguments: `math.factorial(1000000000)` or
    # `builtins.pow(10, 100000000)` in a replacement ran for hours in apply_rules' shape propagation
    "math.factorial", "math.comb", "math.perm", "builtins.pow", "operator.pow", "operator.ipow",
    "operator.lshift", "operator.ilshift",
)
"""Graphs contain these (a traced ``x.shape`` is ``getattr``, a ``print`` in ``forward`` is kept, ``x ** 2`` is
``operator.pow``): a pattern may match them (matching an effect is how the planner protects it), nothing may create
them: they reach arbitrary attributes or callables, or their cost grows with their arguments' values."""

DENIED_WORDS = re.compile(
    r"file|save|load|seed|rng|print|profil|record|hook|script|jit|compile|export|serial|pickle|^hub$|^hub_|_hub$|system|"
    r"exec|eval|import|library|extension|distributed|process|thread|^set_|_set_|deterministic|grad_enabled|"
    r"anomaly|storage|share|mmap|open|warn|default|vmap|^func|callback|fork|stream|sync|_debug|flush|"
    r"inference_mode|no_grad|enable_grad|^backward$|^apply_$|^map_$|^map2_$|numpy|register|parallel|cufft|"
    r"plan_cache|token|_test_|foobar|autocast|parse|type_comment|get_device_module|with_distance|SyncBatchNorm",
    re.IGNORECASE,
)
"""Words in a name that mark an effect outside the outputs (reviewed by hand: over-refusing is safe)."""

DENIED_NAMES = frozenset({
    # take a callable and call it, or run python code
    "torch.cond", "torch.while_loop", "torch.autograd.grad", "torch.Tensor.apply_", "torch.Tensor.map_",
    "torch.Tensor.map2_", "torch.Tensor.backward", "torch.Tensor.retain_grad", "torch.Tensor.pin_memory",
    "torch.Tensor.cpu_", "torch.Tensor.numpy", "torch.Tensor.data_ptr", "torch.Tensor.is_shared",
    "torch.Tensor.is_pinned", "torch.Tensor.untyped_storage", "torch.Tensor.storage_offset",
    # global state or process-wide queries
    "torch.get_num_threads", "torch.get_num_interop_threads", "torch.is_grad_enabled", "torch.is_inference_mode_enabled",
    "torch.is_anomaly_enabled", "torch.initial_seed", "torch.typename", "torch.is_storage",
    "torch.nn.functional.handle_torch_function", "torch.nn.functional.has_torch_function",
    "torch.nn.functional.has_torch_function_unary", "torch.nn.functional.has_torch_function_variadic",
    "torch.nn.functional.assert_int_or_pair", "torch.nn.functional.boolean_dispatch",
    "torch.from_numpy", "torch.frombuffer", "torch.asarray", "torch.as_tensor",
    # found by the red team: a memory address; device runtimes initialised (native libraries loaded,
    # process-wide state); process queries; futures waited on; pinned (page-locked) memory; storage repointed
    "torch.Tensor.const_data_ptr", "torch.Tensor.cuda", "torch.Tensor.xpu", "torch.Tensor.ipu", "torch.Tensor.mtia",
    "torch.get_float32_matmul_precision", "torch.is_vulkan_available", "torch.wait",
    "torch.ops.aten.pin_memory", "torch.ops.aten._pin_memory", "torch.ops.aten.is_pinned",
    "torch.ops.aten._cudnn_init_dropout_state", "torch.ops.aten.set", "torch.ops.aten._version",
})
"""Names whose words look harmless but which take callables, expose memory, or read process state."""

OP_NAMESPACES = ("aten", "prims")


def denied(path: str) -> bool:
    last = path.rsplit(".", 1)[-1]
    return path in DENIED_NAMES or bool(DENIED_WORDS.search(last)) or bool(DENIED_WORDS.search(path.split(".")[1] if path.count(".") > 1 else ""))


def _known(value, known: set) -> bool:
    try:
        return value in known
    except TypeError:  # unhashable
        return False


def functions() -> set[str]:
    # membership by equality, not identity: torch.mm is a fresh builtin object at each attribute access
    known = set(torch.overrides.get_testing_overrides()) | set(torch.overrides.get_ignored_functions())
    out: set[str] = set()
    for prefix, module in NAMESPACES.items():
        for name in dir(module):
            if name.startswith("_"):
                continue
            value = getattr(module, name, None)
            if _known(value, known) and callable(value) and not isinstance(value, type):
                out.add(f"{prefix}.{name}")
    for name in dir(operator):
        if not name.startswith("_") and callable(getattr(operator, name)):
            out.add(f"operator.{name}")
    for name in dir(math):
        if not name.startswith("_") and callable(getattr(math, name)):
            out.add(f"math.{name}")
    out |= {f"builtins.{name}" for name in PURE_BUILTINS if hasattr(builtins, name)}
    out -= set(MATCH_ONLY)
    return {p for p in out if not denied(p)}


def methods() -> set[str]:
    names = set()
    for f in torch.overrides.get_overridable_functions()[torch.Tensor]:
        name = getattr(f, "__name__", None)
        if isinstance(name, str) and not name.startswith("_") and callable(getattr(torch.Tensor, name, None)):
            names.add(name)
    return {n for n in names if not denied(f"torch.Tensor.{n}")}


def operators() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {ns: set() for ns in OP_NAMESPACES}
    for qualified in torch._C._dispatch_get_all_op_names():
        ns, _, rest = qualified.partition("::")
        if ns in out:
            name = rest.split(".", 1)[0]
            if not denied(f"torch.ops.{ns}.{name}") and not name.startswith("__"):
                out[ns].add(name)
    return out


def module_types() -> set[str]:
    out = set()
    for name in dir(torch.nn):
        value = getattr(torch.nn, name)
        if (not name.startswith("_") and inspect.isclass(value) and issubclass(value, torch.nn.Module)
                and not denied(f"torch.nn.{name}")):
            out.add(f"torch.nn.{name}")
    return out


CONSTANT_TYPES = ("dtype", "layout", "memory_format", "qscheme", "float", "int", "bool")


def constants() -> set[str]:
    """Values (not callables) a rule may name: dtypes, layouts, memory formats, numbers."""
    out = set()
    for prefix, module in (("torch", torch), ("math", math)):
        for name in dir(module):
            value = getattr(module, name, None)
            if not name.startswith("_") and type(value).__name__ in CONSTANT_TYPES and not denied(f"{prefix}.{name}"):
                out.add(f"{prefix}.{name}")
    return out


def builders() -> set[str]:
    import fxrules.builders

    return {f"fxrules.builders.{name}" for name in fxrules.builders.BUILDERS} | {"fxrules.builders.fold_aten_conv_bn"}


PYTHON_RANDOM = frozenset({
    # Python functions that draw random numbers through tensor calls the tags cannot see
    "torch.nn.functional.dropout1d", "torch.nn.functional.dropout2d", "torch.nn.functional.dropout3d",
    "torch.nn.functional.gumbel_softmax", "torch.nn.functional.fractional_max_pool2d",
    "torch.nn.functional.fractional_max_pool2d_with_indices", "torch.nn.functional.fractional_max_pool3d",
    "torch.nn.functional.fractional_max_pool3d_with_indices",
})
"""Reviewed: functions on the table that draw random numbers although no aten op of their name is tagged."""

RANDOM_MODULE_TYPES = frozenset({
    "torch.nn.Dropout", "torch.nn.Dropout1d", "torch.nn.Dropout2d", "torch.nn.Dropout3d", "torch.nn.AlphaDropout",
    "torch.nn.FeatureAlphaDropout", "torch.nn.RReLU", "torch.nn.FractionalMaxPool2d", "torch.nn.FractionalMaxPool3d",
})
"""Reviewed: module types whose forward draws random numbers (in training mode)."""


def random_ops() -> dict[str, set[str]]:
    """Op names with an overload tagged ``nondeterministic_seeded``: torch's own mark of an op that
    draws from the random number generator."""
    out: dict[str, set[str]] = {ns: set() for ns in OP_NAMESPACES}
    for qualified in torch._C._dispatch_get_all_op_names():
        ns, _, rest = qualified.partition("::")
        name, _, overload = rest.partition(".")
        if ns not in out:
            continue
        try:
            op = getattr(getattr(getattr(torch.ops, ns), name), overload or "default")
        except (AttributeError, RuntimeError):
            continue
        if torch.Tag.nondeterministic_seeded in op.tags:
            out[ns].add(name)
    return out


def random_names(functions: set[str], methods: set[str], ops: dict[str, set[str]]) -> tuple[set, set]:
    """The functions and Tensor methods on the table that draw random numbers: named like a tagged
    aten op, or reviewed (:data:`PYTHON_RANDOM`)."""
    tagged = ops["aten"] | ops["prims"]
    random_functions = {p for p in functions if p.rsplit(".", 1)[-1] in tagged or p in PYTHON_RANDOM}
    return random_functions, {m for m in methods if m in tagged}


def main() -> None:
    ops = operators()
    table_functions, table_methods = functions(), methods()
    seeded = random_ops()
    random_functions, random_methods = random_names(table_functions, table_methods, seeded)
    fields = {"torch_version": torch.__version__, "functions": table_functions, "match_only_functions": frozenset(MATCH_ONLY),
              "tensor_methods": table_methods, "constants": constants(), "builders": builders(),
              "module_types": module_types()}
    fields.update({f"{ns}_ops": names for ns, names in ops.items()})
    # flags: names on the table above that draw random numbers (SECURITY.md, docs/language.md)
    fields.update({"random_functions": random_functions, "random_methods": random_methods})
    fields.update({f"random_{ns}_ops": names & ops[ns] for ns, names in seeded.items()})
    fields["random_module_types"] = RANDOM_MODULE_TYPES
    sys.stdout.write(json_text(f"What rule files may name: generated by scripts/gen_allowlist.py; do not edit by "
                               f"hand. Made from torch {torch.__version__}. Read by fxrules.lang.allowlist without "
                               f"torch. The random_* arrays flag names of the table that draw random numbers.",
                               fields))


if __name__ == "__main__":
    main()
