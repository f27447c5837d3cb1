"""Which graph values may share storage, what a call may write, draw or do besides its output.

The planner asks three kinds of question about the graph it rewrites, all answered here:

* **Aliasing.** A node's value may share storage with some of its inputs (its *bases*): a
  view (``x.view(...)``, ``x[0]``, each piece of ``x.split(...)``), a call that may return
  its input itself (``x.contiguous()``, ``x.to(dtype)``, ``F.dropout(x, training=False)``,
  ``nn.Identity``), an in-place call (``x.add_(1)`` returns ``x``). Operators
  (``OpOverload``) say so in their schemas' alias annotations (``Tensor(a) self -> Tensor(a)``),
  read through :mod:`fxrules.engine.fxaccess`; Python-level functions, Tensor methods and
  modules are looked up in the reviewed tables below. A call the engine does not know may
  alias every input. From the bases follow a value's *roots* (the placeholders, ``get_attr``
  nodes and fresh results its storage comes from), its *descendants* (the views of it, views
  of views, ...) and its *storage tree* (every node that may share storage with it: the
  descendants of its roots, and ``get_attr`` nodes of the same tensor storage).
* **Purity.** A call is known pure when it is a torch operator, a function of torch's tensor
  namespaces, a Tensor method, an ``operator``/``math`` function or a reviewed builtin, or a
  ``torch.nn`` module (or a subclass that computes as one, see
  :func:`fxrules.engine.matcher.computes_as`) without hooks; and none of the reviewed
  effectful ones. Everything else (a function wrapped with ``torch.fx.wrap``, a method of a
  non-tensor object, a user module kept as a leaf) is *unknown*: it may write any of its
  inputs, alias any of them, and write any tensor the model holds.
* **Random draws.** Which calls consume random numbers (a train-mode dropout, ``rand_like``,
  ``bernoulli``, an operator tagged ``nondeterministic_seeded``): removing or adding one
  shifts every later draw.

Inputs (placeholders) are assumed distinct from each other and from the model's parameters
and buffers: the graph cannot know what a caller passes.
"""

from __future__ import annotations

import builtins
import operator
from typing import Any, Callable, Iterable, Optional

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.ao.nn import intrinsic as nni

from fxrules.engine import fxaccess
from fxrules.engine.users import HUB

# ---------------------------------------------------------------------------
# Reviewed tables
# ---------------------------------------------------------------------------

VIEW_METHODS = frozenset({
    "view", "view_as", "reshape", "reshape_as", "transpose", "transpose_", "permute", "t", "unsqueeze", "squeeze",
    "expand", "expand_as", "narrow", "select", "__getitem__", "split", "split_with_sizes", "tensor_split", "chunk",
    "unbind", "hsplit", "vsplit", "dsplit", "diagonal", "as_strided", "flatten", "unflatten", "detach", "movedim",
    "moveaxis", "swapaxes", "swapdims", "unfold", "real", "imag", "view_as_real", "view_as_complex", "mT", "mH", "T",
    "H", "adjoint", "indices", "values", "crow_indices", "col_indices", "ccol_indices", "row_indices", "align_to",
    "align_as", "rename", "refine_names", "squeeze_", "unsqueeze_", "t_", "swapaxes_", "swapdims_", "as_strided_",
    "detach_", "positive", "resolve_conj", "resolve_neg", "conj", "alias", "data", "broadcast_to", "ravel",
    "diag_embed", "matrix_H",
})
"""Tensor methods whose result may be a view of ``self`` (``reshape``, ``flatten``: a view when the
strides allow it; ``resolve_conj``/``conj``: ``self`` when there is nothing to resolve)."""

SELF_RETURNING_METHODS = frozenset({
    "contiguous", "to", "type", "type_as", "float", "double", "half", "bfloat16", "int", "long", "short", "char",
    "byte", "bool", "cfloat", "cdouble", "cpu", "cuda", "requires_grad_", "coalesce", "to_dense", "expand_as", "as_subclass",
    "pin_memory", "share_memory_", "to_sparse",
})
"""Tensor methods that may return ``self`` itself (``x.to(x.dtype)``, ``x.contiguous()`` on a contiguous ``x``)."""

_VIEW_FUNCTION_NAMES = (
    "reshape", "flatten", "unflatten", "transpose", "swapaxes", "swapdims", "permute", "t", "unsqueeze", "squeeze",
    "narrow", "select", "split", "split_with_sizes", "tensor_split", "chunk", "unbind", "hsplit", "vsplit", "dsplit",
    "diagonal", "as_strided", "detach", "movedim", "moveaxis", "view_as_real", "view_as_complex", "real", "imag",
    "broadcast_to", "atleast_1d", "atleast_2d", "atleast_3d", "adjoint", "conj", "resolve_conj", "resolve_neg",
    "positive", "ravel", "alias_copy", "unfold", "squeeze_", "unsqueeze_", "expand_copy", "dropout", "alpha_dropout",
    "feature_dropout", "feature_alpha_dropout", "dropout1d", "dropout2d", "dropout3d", "nan_to_num_",
)


def _functions(namespaces: Iterable[Any], names: Iterable[str]) -> frozenset:
    found = set()
    for space in namespaces:
        for name in names:
            value = getattr(space, name, None)
            if value is not None:
                try:
                    found.add(value)
                except TypeError:
                    pass
    return frozenset(found)


VIEW_FUNCTIONS = _functions((torch, torch.Tensor, F), _VIEW_FUNCTION_NAMES) | _functions(
    (torch.Tensor,), VIEW_METHODS | SELF_RETURNING_METHODS)
"""call_function targets whose result may alias their first argument: torch's view functions, the
dropout functions (the input itself when not training), and the Tensor methods above called as
functions (``torch.Tensor.view``)."""

ALL_INPUT_VIEW_FUNCTIONS = frozenset({torch.broadcast_tensors, torch.meshgrid, torch.atleast_1d, torch.atleast_2d,
                                      torch.atleast_3d})
"""call_function targets whose results may be views of any of their arguments."""

VIEW_ATTRIBUTES = frozenset({"T", "mT", "H", "mH", "real", "imag", "data", "grad"})
"""Attributes read with ``getattr`` (a traced ``x.T``) that are views of the tensor."""

ALIASING_MODULES = (nn.Identity, nn.Flatten, nn.Unflatten, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d,
                    nn.AlphaDropout, nn.FeatureAlphaDropout)
"""torch.nn modules whose output may be their input or a view of it (dropout: in eval mode)."""

_SCHEMA_LIES = frozenset({"dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout"})
"""aten ops whose schema returns a fresh tensor but whose kernel returns the input itself when not
training (CompositeImplicitAutograd ``at::dropout``)."""

_DROPOUT_P_OPS = frozenset({"scaled_dot_product_attention"})
"""aten ops tagged as drawing random numbers that draw none when their ``dropout_p`` (the fifth
argument, default 0) is the literal 0 (``aten.scaled_dot_product_attention``: the attention fusions)."""

PURE_BUILTINS = frozenset({
    builtins.getattr, builtins.len, builtins.isinstance, builtins.issubclass, builtins.hasattr, builtins.int,
    builtins.float, builtins.bool, builtins.complex, builtins.str, builtins.tuple, builtins.list, builtins.dict,
    builtins.set, builtins.frozenset, builtins.slice, builtins.range, builtins.min, builtins.max, builtins.abs,
    builtins.sum, builtins.all, builtins.any, builtins.round, builtins.divmod, builtins.pow, builtins.zip,
    builtins.enumerate, builtins.sorted, builtins.reversed, builtins.type, builtins.repr, builtins.hash, builtins.id,
    builtins.callable, builtins.format, builtins.map, builtins.filter, builtins.chr, builtins.ord,
})
"""Builtins that compute on their arguments only."""

PURE_MODULES = ("torch", "torch.functional", "torch.nn.functional", "torch._C._nn", "torch._C._linalg",
                "torch._C._fft", "torch._C._special", "torch._C._VariableFunctions", "torch.linalg", "torch.fft",
                "torch.special", "torch._tensor", "torch._refs", "_operator", "operator", "math")
"""Modules (``__module__``) whose functions compute tensors or numbers from their arguments only,
except the effectful ones listed in :data:`EFFECTFUL_FUNCTIONS`."""

EFFECTFUL_FUNCTIONS = frozenset({
    builtins.print, builtins.input, builtins.setattr, builtins.delattr, builtins.exec, builtins.eval, builtins.open,
    builtins.next, builtins.iter, builtins.breakpoint, builtins.__import__, builtins.globals, builtins.locals,
    builtins.vars, builtins.compile,
    torch.manual_seed, torch.seed, torch.set_rng_state, torch.set_default_dtype, torch.set_default_device,
    torch.set_grad_enabled, torch.set_printoptions, torch.set_num_threads, torch.use_deterministic_algorithms,
    torch.save, torch.load, torch.Tensor.backward, torch.Tensor.register_hook, torch.Tensor.retain_grad,
    torch.Tensor.record_stream, torch.Tensor.register_post_accumulate_grad_hook,
})
"""Functions with an effect beyond their output (besides in-place writes, which are found by name)."""

EFFECTFUL_METHODS = frozenset({"backward", "register_hook", "register_post_accumulate_grad_hook", "retain_grad",
                               "record_stream", "share_memory_", "apply_", "map_", "map2_"})
"""Tensor methods with an effect beyond their output and ``self`` (``apply_`` runs a Python callable)."""

RANDOM_FUNCTION_NAMES = ("rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm",
                         "bernoulli", "multinomial", "normal", "poisson", "rrelu", "rrelu_", "gumbel_softmax",
                         "native_dropout", "binomial", "_standard_gamma", "_sample_dirichlet")
RANDOM_FUNCTIONS = _functions((torch, F, torch.Tensor), RANDOM_FUNCTION_NAMES)
"""call_function targets that always draw random numbers."""

DROPOUT_FUNCTIONS = {
    F.dropout: True, F.dropout1d: True, F.dropout2d: True, F.dropout3d: True, F.alpha_dropout: False,
    F.feature_alpha_dropout: False, torch.dropout: None, torch.alpha_dropout: None, torch.feature_dropout: None,
    torch.feature_alpha_dropout: None, F.rrelu: False,
}
"""Functions that draw random numbers when their ``training`` argument (the third, else the keyword
``training``/``train``) is true; the value is its default (None: no default)."""

RANDOM_METHODS = frozenset({"bernoulli", "bernoulli_", "multinomial", "normal_", "uniform_", "random_",
                            "exponential_", "geometric_", "cauchy_", "log_normal_", "rrelu_"})
"""Tensor methods that draw random numbers."""

RANDOM_MODULES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout,
                  nn.RReLU)
"""torch.nn modules that draw random numbers in training mode (dropout with ``p == 0`` draws none)."""

RUNNING_STATS_MODULES = (fxaccess.NORM_WITH_STATISTICS,)
"""torch.nn modules that update their running statistics (buffers) when called in training mode."""

COPY_FUNCTIONS = frozenset({torch.clone, torch.Tensor.clone})
"""call_function targets whose result is a fresh copy by contract (``clone``): the program asked for it."""

FUSED_MODULES = (nni.ConvReLU1d, nni.ConvReLU2d, nni.ConvReLU3d, nni.LinearReLU, nni.BNReLU2d, nni.BNReLU3d)
"""torch.ao.nn.intrinsic's fused modules that fxrules.builders makes (``fuse_conv_relu``, ...): containers
(``nn.Sequential``) whose constructors take only their parts' exact torch.nn classes and run them in
order: a conv, linear or batch norm, then a ReLU. They compute as those parts (a fresh result, no
effect but a train-mode batch norm's statistics: :func:`module_updates_statistics`), so they are
known, unlike other containers, which run whatever children they are given."""

_FUSED_NORMS = (nni.BNReLU2d, nni.BNReLU3d)

STATEFUL_CALL_MODULES = RANDOM_MODULES + RUNNING_STATS_MODULES + _FUSED_NORMS
"""The module classes whose instances' state (training mode, ``p``, ``track_running_stats``) decides
whether a call draws random numbers or updates statistics (:func:`module_draws_random`,
:func:`module_updates_statistics`); for any other class both are False."""

MODE_INDEPENDENT_MODULES = frozenset({
    nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d, nn.Linear,
    nn.Bilinear, nn.Identity, nn.Flatten, nn.Unflatten, nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.PReLU, nn.GELU, nn.SiLU,
    nn.Mish, nn.Sigmoid, nn.Tanh, nn.Hardswish, nn.Hardsigmoid, nn.Hardtanh, nn.ELU, nn.SELU, nn.CELU, nn.Softplus,
    nn.Softsign, nn.Tanhshrink, nn.LogSigmoid, nn.Softmax, nn.LogSoftmax, nn.GLU, nn.Threshold, nn.MaxPool1d,
    nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d,
    nn.AdaptiveAvgPool3d, nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d, nn.LayerNorm,
    nn.GroupNorm, nn.Upsample, nn.Sequential, nn.ModuleList, nn.ModuleDict, *FUSED_MODULES,
})
"""torch.nn classes whose ``forward`` never reads ``self.training`` (the class itself: a subclass's own
code may): a module of one computes the same in both modes (a container runs its children, each
asked on its own). A builder's result takes the replaced module's training mode on these only
(:func:`fxrules.engine.transaction._place_built`); a test reads each class's ``forward``."""

_KNOWN_MODULE_PREFIXES = ("torch.nn.modules.", "torch.ao.nn.", "torch.nn.intrinsic.", "torch.nn.qat.",
                          "torch.nn.quantized.")
_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict, nn.ParameterList, nn.ParameterDict)


# ---------------------------------------------------------------------------
# What a call is
# ---------------------------------------------------------------------------


def function_is_known(target: Any) -> bool:
    """Whether ``target`` (a call_function target) is a function fxrules knows to compute from its
    arguments only (its in-place writes aside): see the module docstring."""
    if fxaccess.is_op_overload(target) or fxaccess.is_op_packet(target):
        return True
    try:
        if target in EFFECTFUL_FUNCTIONS:
            return False
        if target in PURE_BUILTINS:
            return True
    except TypeError:  # an unhashable target
        return False
    if getattr(target, "__objclass__", None) in fxaccess.TENSOR_METHOD_OWNERS:
        return True
    module = getattr(target, "__module__", None)
    return isinstance(module, str) and module in PURE_MODULES


def method_is_known(name: Any) -> bool:
    """Whether a call_method name is a Tensor method without effects beyond ``self`` and its output."""
    return isinstance(name, str) and name not in EFFECTFUL_METHODS and hasattr(torch.Tensor, name)


def module_class_is_known(cls: type, computes_as: Callable[[type, type], bool]) -> bool:
    """Whether modules of class ``cls`` compute as a torch.nn class: a torch.nn class itself (not a
    container, whose calls run its children), or a subclass of one that ``computes_as`` it."""
    for base in cls.__mro__:
        if base in FUSED_MODULES:
            return base is cls or computes_as(cls, base)
        module = getattr(base, "__module__", "") or ""
        if module.startswith(_KNOWN_MODULE_PREFIXES) and base is not nn.Module:
            if issubclass(base, _CONTAINERS):
                return False
            return base is cls or computes_as(cls, base)
    return False


def module_draws_random(module: nn.Module) -> bool:
    """A train-mode dropout or RReLU (dropout with ``p == 0`` returns its input and draws nothing)."""
    if not isinstance(module, RANDOM_MODULES) or not module.training:
        return False
    return not (isinstance(module, fxaccess.DROPOUT_BASE) and getattr(module, "p", None) == 0)


def module_updates_statistics(module: nn.Module) -> bool:
    """A norm module in training mode that tracks running statistics: calling it writes its buffers (a
    fused batch norm and ReLU: its batch norm's)."""
    if isinstance(module, _FUSED_NORMS) and len(module) > 0:
        module = module[0]
    return isinstance(module, RUNNING_STATS_MODULES) and module.training and \
        bool(getattr(module, "track_running_stats", False))


def function_draws_random(target: Any, args: tuple, kwargs: dict) -> bool:
    """Whether this call_function call draws random numbers."""
    if fxaccess.is_op_overload(target):
        if not fxaccess.op_draws_random(target):
            return False
        if fxaccess.op_name(target) in _SCHEMA_LIES or fxaccess.op_name(target) == "native_dropout":
            train = args[2] if len(args) > 2 else kwargs.get("train", True)
            return train is not False
        if fxaccess.op_name(target) in _DROPOUT_P_OPS:
            p = args[4] if len(args) > 4 else kwargs.get("dropout_p", 0.0)
            return not (p == 0 and type(p) in (int, float))
        return True
    try:
        if target in RANDOM_FUNCTIONS:
            return True
        default = DROPOUT_FUNCTIONS.get(target, _NOT_DROPOUT)
    except TypeError:
        return False
    if default is _NOT_DROPOUT:
        return False
    training = args[2] if len(args) > 2 else kwargs.get("training", kwargs.get("train", default))
    if training is False:
        return False
    p = args[1] if len(args) > 1 else kwargs.get("p")
    return not (p == 0 and type(p) in (int, float))


_NOT_DROPOUT = object()


def function_may_draw_random(target: Any) -> bool:
    """Whether some call of ``target`` may draw random numbers (:func:`function_draws_random` is False for
    every call of a target this is False for: the arguments only decide among the targets it is True for)."""
    if fxaccess.is_op_overload(target):
        return fxaccess.op_draws_random(target)
    try:
        return target in RANDOM_FUNCTIONS or target in DROPOUT_FUNCTIONS
    except TypeError:
        return True


def method_draws_random(name: Any) -> bool:
    return isinstance(name, str) and name in RANDOM_METHODS


# ---------------------------------------------------------------------------
# Aliasing of graph values
# ---------------------------------------------------------------------------


class Aliasing:
    """Bases, roots, descendants and storage trees of one graph's nodes (see the module docstring).

    ``module_of`` names the modules of call_module nodes, ``attr_of`` the tensors of get_attr
    nodes; ``module_is_known`` says whether a module computes as a torch.nn class. What a target
    is (a view, self-returning, fresh, unknown) is remembered per target for the run; bases are
    computed per node (a rewrite rewires arguments).
    """

    def __init__(self, module_of: Callable[[str], Any], attr_of: Optional[Callable[[str], Any]],
                 module_is_known: Callable[[Any], bool],
                 module_writes_input: Callable[[Any], bool] = lambda module: getattr(module, "inplace", False) is True,
                 hands_on: Optional[Callable[[fx.Node], bool]] = None):
        """``module_writes_input``: whether a module's ``inplace`` is True (the planner answers it from the
        facts it keeps per module, without ``getattr``'s cost for a module that has none). ``hands_on``:
        whether a user may view, write or return what it reads
        (:meth:`fxrules.engine.planner.Effects.hands_on_storage`); with it, the users of a node read by many
        are indexed (:meth:`storage_users`), and every node made or whose arguments are set must be told
        (:meth:`rewired`)."""
        self.module_of = module_of
        self.attr_of = attr_of
        self.module_is_known = module_is_known
        self.module_writes_input = module_writes_input
        self.hands_on = hands_on
        # node with at least HUB users -> {user: None}: its users that hands_on, in the order of node.users
        # (some perhaps no longer users: left out when read); see storage_users
        self.hub_users: dict = {}
        self._function_kinds: dict = {}
        self._keys: dict = {}  # get_attr target -> storage key of its tensor (None: not a tensor)
        self._tied: Optional[tuple] = None  # (graph, {storage key: get_attr nodes}, any shared), built on first use

    # -- one node ------------------------------------------------------------------
    def bases(self, node: fx.Node) -> tuple:
        """The input nodes ``node``'s value may share storage with (empty: a fresh value or none)."""
        op = node.op
        if op == "call_function":
            return self._function_bases(node)
        if op == "call_method":
            name = node.target
            if not node.args or not isinstance(node.args[0], fx.Node):
                return tuple(node.all_input_nodes) if not method_is_known(name) else ()
            if not method_is_known(name):
                return tuple(node.all_input_nodes)
            if name in VIEW_METHODS or name in SELF_RETURNING_METHODS or writes_by_name(name):
                return (node.args[0],)
            return ()
        if op == "call_module":
            module = self.module_of(node.target)
            if module is None or not self.module_is_known(module):
                return tuple(node.all_input_nodes)
            if isinstance(module, ALIASING_MODULES) or self.module_writes_input(module):
                return tuple(a for a in node.args[:1] if isinstance(a, fx.Node))
            return ()
        return ()

    def _function_bases(self, node: fx.Node) -> tuple:
        target = node.target
        try:
            kind = self._function_kinds.get(target)
        except TypeError:
            return tuple(node.all_input_nodes)
        if kind is None:
            kind = function_kind(target)
            if kind == _SCHEMA:  # the schema's answer, read once per target for the run
                kind = schema_alias_positions(target)
            self._function_kinds[target] = kind
        out = node.kwargs.get("out") if node.kwargs else None
        if isinstance(out, fx.Node):
            return (out,)
        if kind.__class__ is tuple:
            return nodes_at(node, kind) if kind else ()
        if kind == _FRESH:
            if node.kwargs and node.kwargs.get("inplace") is True and node.args and isinstance(node.args[0], fx.Node):
                return (node.args[0],)
            return ()
        if kind == _FIRST:
            first = node.args[0] if node.args else None
            return (first,) if isinstance(first, fx.Node) else ()
        if kind == _GETATTR:
            if len(node.args) > 1 and node.args[1] in VIEW_ATTRIBUTES and isinstance(node.args[0], fx.Node):
                return (node.args[0],)
            return ()
        return tuple(node.all_input_nodes)  # _ALL: unknown, or views of every argument

    # -- users that reach a node's storage --------------------------------------------
    def storage_users(self, node: fx.Node) -> Any:
        """The users of ``node`` that may view, write or return it, in the order of ``node.users`` (with more
        users besides, for a node read by few: its users themselves).

        The walks below ask a node's users which of them view or write it. A node read by thousands (an
        input every block reads) has few such users, and the planner asks about it per match: walking all
        its users made a run of matches next to it quadratic (per block ``(x * 1).add_(1)`` beside ``x + 0``,
        6,400 nodes: 18 s of 26 in these walks). From :data:`HUB` users on, a node's users that
        ``hands_on`` are kept in an index, made on the first ask and told of every node made or rewired
        (:meth:`rewired`), which keeps it in the order of ``node.users``; a user lost is left out when read (a
        stale entry could only be a node erased or no longer reading ``node``, which the walks' own tests
        leave out too: dropping them saves work)."""
        users = node.users
        if self.hands_on is None or len(users) < HUB:
            return users
        index = self.hub_users.get(node)
        if index is None:
            hands_on = self.hands_on
            index = self.hub_users[node] = {user: None for user in users if hands_on(user)}
            return index
        live = [user for user in index if user in users]
        if len(live) != len(index):
            index = self.hub_users[node] = dict.fromkeys(live)
        return live

    def rewired(self, user: fx.Node) -> None:
        """``user`` was just made, or its arguments just set (a rewrite moved it to another value, or repointed
        it): torch takes it out of the users of each of its inputs and puts it back last, and so does the
        index of each indexed one."""
        hub_users = self.hub_users
        hands_on = None
        for value in user.all_input_nodes:
            index = hub_users.get(value)
            if index is None:
                continue
            if hands_on is None:
                hands_on = self.hands_on(user)
            if hands_on:
                index.pop(user, None)
                index[user] = None

    # -- walks -----------------------------------------------------------------
    def roots(self, node: fx.Node) -> set:
        """The nodes whose storage ``node``'s value may come from: walking bases up to nodes without any."""
        found: set = set()
        seen = {node}
        stack = [node]
        while stack:
            current = stack.pop()
            bases = self.bases(current)
            if not bases:
                found.add(current)
            for base in bases:
                if base not in seen:
                    seen.add(base)
                    stack.append(base)
        return found

    def ancestors(self, node: fx.Node) -> set:
        """``node`` and every node whose storage its value may share through its bases, walked up (the walk
        :meth:`roots` makes: the roots are those without bases). ``node`` is in :meth:`descendants` of each."""
        seen = {node}
        stack = [node]
        while stack:
            for base in self.bases(stack.pop()):
                if base not in seen:
                    seen.add(base)
                    stack.append(base)
        return seen

    def descendants(self, node: fx.Node) -> dict:
        """``node`` and every node that may share storage with it through it (views, views of views),
        as an ordered set."""
        return self.tree_of((node,))

    def tree_of(self, tops: Iterable[fx.Node], limit: Optional[int] = None) -> Optional[dict]:
        """The :meth:`descendants` of each of ``tops``, in order, as one ordered set; None as soon as it
        would hold more than ``limit`` nodes (when given)."""
        found: dict = {}
        for top in tops:
            if top in found:
                continue
            found[top] = None
            stack = [top]
            while stack:
                current = stack.pop()
                for user in self.storage_users(current):
                    if user not in found and user.op != "output" and current in self.bases(user):
                        found[user] = None
                        stack.append(user)
                        if limit is not None and len(found) > limit:
                            return None
        return found

    def storage_tops(self, node: fx.Node) -> set:
        """The nodes whose descendants are :meth:`storage_tree`: ``node``'s roots, and the get_attr nodes
        holding a tensor of the same storage as a get_attr root (tied parameters)."""
        roots = self.roots(node)
        for root in list(roots):
            if root.op == "get_attr":
                roots.update(self.tied(root))
        return roots

    def storage_tree(self, node: fx.Node) -> dict:
        """Every node that may share storage with ``node``: the descendants of its roots, and of
        get_attr nodes holding a tensor of the same storage (tied parameters)."""
        return self.tree_of(self.storage_tops(node))

    def tied(self, node: fx.Node) -> list:
        """get_attr nodes of ``node``'s graph whose tensor shares ``node``'s tensor's storage."""
        if self.attr_of is None or node.graph is None:
            return []
        key = self.storage_key_of(node)
        if key is None:
            return []
        return [n for n in self._tied_index(node.graph).get(key, ()) if n is not node and not fxaccess.erased(n)]

    def any_tied(self, graph: fx.Graph) -> bool:
        """Whether two get_attr nodes of ``graph`` read tensors sharing a storage (counting erased ones); when
        not, :meth:`tied` answers nothing for any of its nodes."""
        if self.attr_of is None:
            return False
        self._tied_index(graph)
        return self._tied[2]

    def _tied_index(self, graph: fx.Graph) -> dict:
        # The get_attr nodes by storage key, once per graph (a scan per call was quadratic: 173 calls
        # over 173 get_attr nodes, each a sorted find_nodes, took 30 ms at 5,000 nodes). Rewrites
        # erase get_attr nodes but never create any (a replacement reads only attributes its pattern
        # binds), so the index stays complete; erased nodes are left out when read.
        index = self._tied
        if index is None or index[0] is not graph:
            by_key: dict = {}
            for other in graph.find_nodes(op="get_attr"):
                other_key = self.storage_key_of(other)
                if other_key is not None:
                    by_key.setdefault(other_key, []).append(other)
            index = self._tied = (graph, by_key, any(len(nodes) > 1 for nodes in by_key.values()))
        return index[1]

    def storage_key_of(self, node: fx.Node) -> Any:
        """The storage key of the tensor a get_attr node reads (None for anything else), remembered
        per target for the run: a target names one tensor (new modules get new names)."""
        target = node.target
        key = self._keys.get(target, _NO_KEY)
        if key is _NO_KEY:
            try:
                value = self.attr_of(target)
            except Exception:
                value = None
            key = self._keys[target] = storage_key(value) if isinstance(value, torch.Tensor) else None
        return key

    def first_write(self, nodes: Iterable[fx.Node], written_by: Callable[[fx.Node], list],
                    skip: Any = (), after: Optional[fx.Node] = None,
                    before: Optional[fx.Node] = None) -> Optional[tuple]:
        """``(written node, writer)`` for the earliest node outside ``skip`` (strictly after ``after``
        and before ``before`` when given) that writes one of ``nodes`` in place, or None."""
        best: Optional[tuple] = None
        for value in nodes:
            for user in self.storage_users(value):
                if user in skip or (after is not None and not after < user) \
                        or (before is not None and not user < before):
                    continue
                if value in written_by(user) and (best is None or user < best[1]):
                    best = (value, user)
        return best


_NO_KEY = object()

_FRESH, _FIRST, _ALL, _SCHEMA, _GETATTR = "fresh", "first", "all", "schema", "getattr"
FRESH_KIND = _FRESH
""":func:`function_kind` of a function whose result never shares storage with its arguments."""


def function_kind(target: Any) -> str:
    """How a call_function target's result may share storage with its arguments: ``fresh`` (never),
    ``first`` (its first argument), ``schema`` (as its operator schema says), ``getattr`` (a view
    attribute), ``all`` (any argument: a function the engine does not know, or ``broadcast_tensors``)."""
    try:
        return _function_kind(target)
    except TypeError:  # an unhashable target
        return _ALL


def _function_kind(target: Any) -> str:
    if fxaccess.is_op_overload(target):
        if fxaccess.op_name(target) in _SCHEMA_LIES:
            return _FIRST
        return _SCHEMA
    if fxaccess.is_op_packet(target):
        return _ALL
    if target is builtins.getattr:
        return _GETATTR
    if target is operator.getitem:
        return _FIRST
    if target in ALL_INPUT_VIEW_FUNCTIONS:
        return _ALL
    if target in VIEW_FUNCTIONS or writes_by_name(getattr(target, "__name__", "")) \
            or target in _INPLACE_OPERATOR_FUNCTIONS:
        return _FIRST
    if not function_is_known(target):
        return _ALL
    return _FRESH


_INPLACE_OPERATOR_FUNCTIONS = frozenset({operator.iadd, operator.isub, operator.imul, operator.itruediv,
                                         operator.ifloordiv, operator.imod, operator.ipow, operator.iand,
                                         operator.ior, operator.ixor, operator.ilshift, operator.irshift,
                                         operator.imatmul})


def writes_by_name(name: Any) -> bool:
    """An in-place method or function by torch's naming convention (``add_``, ``relu_``), or an
    in-place dunder (``__iadd__``, ``__setitem__``)."""
    if not isinstance(name, str):
        return False
    if name.endswith("__"):
        return name in _INPLACE_DUNDERS
    return name.endswith("_") and not name.startswith("_")


_INPLACE_DUNDERS = frozenset({"__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__",
                              "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__",
                              "__imatmul__", "__setitem__", "__delitem__"})


def op_result_may_alias(target: Any) -> bool:
    """Whether an ``OpOverload``'s result may share storage with an argument: its schema annotates
    a return (or an argument ``a -> *``), or it is one of the dropout ops that return their input."""
    if fxaccess.op_name(target) in _SCHEMA_LIES:
        return True
    schema = fxaccess.op_schema(target)
    if any(value.alias_info is not None and (value.alias_info.before_set or value.alias_info.after_set)
           for value in schema.returns):
        return True
    return any(argument.alias_info is not None and "*" in argument.alias_info.after_set
               for argument in schema.arguments)


def schema_alias_positions(target: Any) -> tuple:
    """The arguments an ``OpOverload``'s schema says its outputs alias, as ``(index, name)`` pairs
    (``Tensor(a) self -> Tensor(a)``; ``Tensor(a -> *) self -> Tensor(a)[]`` for the pieces of
    ``split``); empty for an op whose outputs are fresh. Read it once per target: walking a schema's
    alias sets costs microseconds, and an aten graph asks it of every node a check walks."""
    schema = fxaccess.op_schema(target)
    returned: set = set()
    for value in schema.returns:
        info = value.alias_info
        if info is not None:
            returned |= set(info.before_set) | set(info.after_set)
    positions = []
    for i, argument in enumerate(schema.arguments):
        info = argument.alias_info
        if info is None:
            continue
        if returned & (set(info.before_set) | set(info.after_set)) or "*" in info.after_set:
            positions.append((i, argument.name))
    return tuple(positions)


def schema_write_positions(target: Any) -> tuple:
    """The arguments an ``OpOverload``'s schema marks as written in place (``Tensor(a!)``), as
    ``(index, name)`` pairs; empty for an op that writes none."""
    return tuple((i, argument.name) for i, argument in enumerate(fxaccess.op_schema(target).arguments)
                 if argument.alias_info is not None and argument.alias_info.is_write)


def nodes_at(node: fx.Node, positions: tuple) -> tuple:
    """The nodes ``node`` passes at ``positions`` (``(index, name)`` pairs of its target's schema:
    positionally, or by keyword past its positional arguments); a list argument gives its nodes
    (``Tensor(a!)[]``, ``Tensor(a -> *)[]``)."""
    args = node.args
    found = []
    for i, name in positions:
        value = args[i] if i < len(args) else node.kwargs.get(name)
        if isinstance(value, fx.Node):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(v for v in value if isinstance(v, fx.Node))
    return tuple(found)


def storage_key(tensor: torch.Tensor) -> Any:
    """What identifies ``tensor``'s storage: its device and data pointer, or the storage object for
    tensors without data (meta, fake)."""
    try:
        pointer = fxaccess.storage_address(tensor)
    except Exception:
        return ("tensor", id(tensor))
    if pointer:
        return (str(tensor.device), pointer)
    return ("tensor", id(tensor))

