"""`Layer`: the base class of every network piece, and `Parameter`.

A Layer is built in `__init__` and run in `forward`; assigning a `Parameter`, a
Layer or a buffer (via `register_buffer`) to an attribute registers it, so the
whole tree can be walked (`named_parameters`, `state_dict`, `apply` …).

A `Parameter` is an ordinary sampan `Tensor` carrying a flag: ops see a plain
Tensor (the eager fast path checks ``type(x) is Tensor``), while
``isinstance(t, Parameter)`` still answers True.
"""
from __future__ import annotations

import functools
import inspect
import itertools
from collections import OrderedDict, namedtuple

import numpy as np

from .. import dtypes as _dt
from ..autograd.hooks import RemovableHandle
from ..autograd.tape import bump_version
from ..errors import DeviceError, SampanError, SampanValueError, ShapeError
from ..tensor import Tensor


class _ParameterMeta(type):
    def __instancecheck__(cls, obj):
        return type(obj) is Tensor and getattr(obj, "_is_param", False)


class Parameter(metaclass=_ParameterMeta):
    """A trainable tensor: a plain sampan Tensor flagged as a parameter.

    Example::

        >>> w = nn.Parameter(sampan.zeros(3, 4))
        >>> isinstance(w, nn.Parameter), type(w) is sampan.Tensor, w.requires_grad
        (True, True, True)
    """

    def __new__(cls, data, requires_grad=True):
        src = data if isinstance(data, Tensor) else Tensor(data)
        t = Tensor.__new__(Tensor)
        t._data = src._data
        t._is_param = True
        if requires_grad:
            t.requires_grad_(True)
        return t


def is_parameter(t) -> bool:
    """True for tensors made by `Parameter`."""
    return type(t) is Tensor and getattr(t, "_is_param", False)


LoadResult = namedtuple("LoadResult", ["missing_keys", "unexpected_keys"])


class Layer:
    """Base class of layers and models.

    Example::

        >>> class MLP(nn.Layer):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.fc1 = nn.Linear(4, 8)
        ...         self.fc2 = nn.Linear(8, 2)
        ...     def forward(self, x):
        ...         return self.fc2(nn.functional.relu(self.fc1(x)))
        >>> MLP()(sampan.randn(3, 4)).shape
        (3, 2)
    """

    def __init__(self):
        d = self.__dict__
        d["_parameters"] = OrderedDict()
        d["_buffers"] = OrderedDict()
        d["_non_persistent"] = set()
        d["_layers"] = OrderedDict()
        d["_forward_pre_hooks"] = OrderedDict()
        d["_forward_hooks"] = OrderedDict()
        d["_backward_hooks"] = OrderedDict()
        d["_backward_pre_hooks"] = OrderedDict()
        d["training"] = True

    def __init_subclass__(cls, **kwargs):
        """Give every layer constructor PyTorch's `device=` and `dtype=` keywords, once,
        here: an `__init__` that does not take them itself has them removed from its
        call; afterwards `dtype` converts the floating parameters and buffers and
        `device` is checked (only "cpu" runs today)."""
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is None or getattr(init, "_factory_kwargs", False):
            return
        try:
            params = inspect.signature(init).parameters
        except (TypeError, ValueError):  # pragma: no cover
            return
        own_dtype, own_device = "dtype" in params, "device" in params

        @functools.wraps(init)
        def __init__(self, *args, **kw):
            dtype = kw.get("dtype") if own_dtype else kw.pop("dtype", None)
            device = kw.get("device") if own_device else kw.pop("device", None)
            if device is not None:
                _check_device(type(self).__name__, device)
            init(self, *args, **kw)
            if dtype is not None:
                self._cast_floating(_dt.as_dtype(dtype), "dtype=")

        __init__._factory_kwargs = True
        cls.__init__ = __init__

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__}.forward is not defined")

    def __call__(self, *args, **kwargs):
        if self._forward_pre_hooks:
            for hook in list(self._forward_pre_hooks.values()):
                r = hook(self, args)
                if r is not None:
                    args = r if isinstance(r, tuple) else (r,)
        d = self.__dict__
        if d.get("_backward_hooks") or d.get("_backward_pre_hooks"):
            from ._backward_hooks import call_with_backward_hooks
            return call_with_backward_hooks(self, args, kwargs, self._run_forward)
        return self._run_forward(*args, **kwargs)

    def _run_forward(self, *args, **kwargs):
        out = self.forward(*args, **kwargs)
        if self._forward_hooks:
            for hook in list(self._forward_hooks.values()):
                r = hook(self, args, out)
                if r is not None:
                    out = r
        return out

    # ------------------------------------------------------------------ registration
    def _check_init(self, what):
        if "_parameters" not in self.__dict__:
            raise SampanError(f"{type(self).__name__}: cannot assign {what} before "
                              "Layer.__init__() ran; call super().__init__() first")

    def __setattr__(self, name, value):
        d = self.__dict__
        if is_parameter(value):
            self._check_init("parameters")
            self._drop(name)
            d["_parameters"][name] = value
        elif isinstance(value, Layer):
            self._check_init("sub-layers")
            self._drop(name)
            d["_layers"][name] = value
        elif "_parameters" in d and name in d["_parameters"]:
            if value is not None:
                raise SampanValueError(
                    f"{type(self).__name__}.{name}: got a {type(value).__name__}; expected a "
                    "Parameter (wrap it: nn.Parameter(t)) or None")
            d["_parameters"][name] = None
        elif "_buffers" in d and name in d["_buffers"]:
            if value is not None and not isinstance(value, Tensor):
                raise SampanValueError(f"{type(self).__name__}.{name}: buffer got a "
                                       f"{type(value).__name__}; expected a Tensor or None")
            d["_buffers"][name] = value
        elif "_layers" in d and name in d["_layers"]:
            if value is not None:
                raise SampanValueError(f"{type(self).__name__}.{name}: got a "
                                       f"{type(value).__name__}; expected a Layer or None")
            d["_layers"][name] = None
        else:
            object.__setattr__(self, name, value)

    def _drop(self, name):
        d = self.__dict__
        d.pop(name, None)
        for k in ("_parameters", "_buffers", "_layers"):
            d[k].pop(name, None)
        d["_non_persistent"].discard(name)

    def __getattr__(self, name):
        # only called when normal lookup fails: look in the registries
        d = self.__dict__
        for k in ("_parameters", "_buffers", "_layers"):
            reg = d.get(k)
            if reg is not None and name in reg:
                return reg[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name):
        d = self.__dict__
        for k in ("_parameters", "_buffers", "_layers"):
            if name in d.get(k, ()):
                del d[k][name]
                d["_non_persistent"].discard(name)
                return
        object.__delattr__(self, name)

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self._parameters) | set(self._buffers)
                      | set(self._layers))

    def register_parameter(self, name: str, param):
        """Register `param` (a Parameter or None) under `name`."""
        self._check_init("parameters")
        if param is not None and not is_parameter(param):
            raise SampanValueError(f"register_parameter({name!r}): got "
                                   f"{type(param).__name__}; expected a Parameter or None")
        self._drop(name)
        self._parameters[name] = param

    def add_sublayer(self, name: str, layer):
        """Register `layer` (or None) as a child named `name`; returns it."""
        self._check_init("sub-layers")
        if layer is not None and not isinstance(layer, Layer):
            raise SampanValueError(f"add_sublayer({name!r}): got {type(layer).__name__}; "
                                   "expected a Layer")
        self._drop(name)
        self._layers[name] = layer
        return layer

    add_module = add_sublayer
    register_module = add_sublayer

    def get_submodule(self, target: str = ""):
        """The descendant at dotted path `target` ("" is self). Example:
        ``net.get_submodule("encoder.0")``."""
        layer = self
        done = []
        for name in target.split(".") if target else ():
            child = layer._layers.get(name) if isinstance(layer, Layer) else None
            if child is None:
                where = ".".join(done) or type(self).__name__
                raise AttributeError(f"get_submodule({target!r}): {where} "
                                     f"({type(layer).__name__}) has no sub-layer {name!r}")
            layer = child
            done.append(name)
        return layer

    get_sublayer = get_submodule

    def _get_leaf(self, target, kind, what):
        path, _, name = target.rpartition(".")
        layer = self.get_submodule(path)
        reg = getattr(layer, kind)
        if name not in reg or reg[name] is None:
            raise AttributeError(f"get_{what}({target!r}): {type(layer).__name__} has no "
                                 f"{what} {name!r}")
        return reg[name]

    def get_parameter(self, target: str):
        """The parameter at dotted path `target`. Example:
        ``net.get_parameter("fc.weight")``."""
        return self._get_leaf(target, "_parameters", "parameter")

    def get_buffer(self, target: str):
        """The buffer at dotted path `target`. Example: ``net.get_buffer("bn.running_mean")``."""
        return self._get_leaf(target, "_buffers", "buffer")

    def register_buffer(self, name: str, tensor, persistent: bool = True):
        """Register a non-trainable tensor (e.g. running statistics). Non-persistent
        buffers are left out of `state_dict`.

        Example: ``self.register_buffer("running_mean", sampan.zeros(8))``"""
        self._check_init("buffers")
        if tensor is not None and not isinstance(tensor, Tensor):
            raise SampanValueError(f"register_buffer({name!r}): got {type(tensor).__name__}; "
                                   "expected a Tensor or None")
        self._drop(name)
        self._buffers[name] = tensor
        if not persistent:
            self._non_persistent.add(name)

    # ------------------------------------------------------------------ traversal
    def named_layers(self, prefix: str = "", include_self: bool = True, _memo=None):
        """(qualified name, layer) for this layer and every descendant, each once."""
        memo = set() if _memo is None else _memo
        if id(self) in memo:
            return
        memo.add(id(self))
        if include_self:
            yield prefix, self
        for name, child in self._layers.items():
            if child is None:
                continue
            yield from child.named_layers(f"{prefix}.{name}" if prefix else name, True, memo)

    named_modules = named_layers

    def layers(self, include_self: bool = True):
        """Every layer of the tree (see `named_layers`)."""
        return [m for _, m in self.named_layers(include_self=include_self)]

    modules = layers

    def named_children(self):
        """(name, layer) of the direct sub-layers."""
        seen = set()
        for name, child in self._layers.items():
            if child is not None and id(child) not in seen:
                seen.add(id(child))
                yield name, child

    def children(self):
        return [c for _, c in self.named_children()]

    def _named(self, kind, prefix, recurse):
        seen = set()
        layers = self.named_layers(prefix) if recurse else [(prefix, self)]
        for lname, layer in layers:
            for name, t in getattr(layer, kind).items():
                if t is None or id(t) in seen:
                    continue
                seen.add(id(t))
                yield (f"{lname}.{name}" if lname else name), t

    def named_parameters(self, prefix: str = "", recurse: bool = True):
        """(qualified name, parameter) pairs; a shared parameter appears once."""
        return self._named("_parameters", prefix, recurse)

    def parameters(self, recurse: bool = True):
        """The parameters of this layer and (by default) every descendant, as a list."""
        return [p for _, p in self.named_parameters(recurse=recurse)]

    def named_buffers(self, prefix: str = "", recurse: bool = True):
        return self._named("_buffers", prefix, recurse)

    def buffers(self, recurse: bool = True):
        return [b for _, b in self.named_buffers(recurse=recurse)]

    def num_parameters(self, trainable_only: bool = False) -> int:
        """Number of scalars in the parameters. Example: ``nn.Linear(3, 4).num_parameters()``
        is 16."""
        return int(sum(p.numel() for p in self.parameters()
                       if p.requires_grad or not trainable_only))

    # ------------------------------------------------------------------ modes & utilities
    def train(self, mode: bool = True):
        """Set training mode on the whole tree (affects Dropout, BatchNorm …)."""
        for m in Layer.layers(self):   # not self.layers(): a subclass may name a sub-layer
            m.__dict__["training"] = bool(mode)    # "layers" (TransformerEncoder does)
        return self

    def eval(self):
        """Evaluation mode: ``model.eval()`` is ``model.train(False)``."""
        return self.train(False)

    def apply(self, fn):
        """Call `fn(layer)` on every descendant, then on self (e.g. custom init)."""
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    def zero_grad(self, set_to_none: bool = True):
        """Clear the gradients of every parameter (``set_to_none=False``: zero them in
        place, as PyTorch)."""
        for p in self.parameters():
            g = p.grad
            if set_to_none or g is None:
                p.grad = None
            elif isinstance(g._data, np.ndarray) and g._data.flags.writeable:
                g._data[...] = 0
                bump_version(g)
            else:
                p.grad = Tensor(np.zeros(g.shape, g.dtype))

    def requires_grad_(self, requires_grad: bool = True):
        """Set `requires_grad` on every parameter (e.g. to freeze a layer); returns self."""
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def to(self, *args, dtype=None, device=None, non_blocking=False):
        """Convert floating parameters and buffers to `dtype` in place (the Parameter
        objects stay the same, so optimisers keep working); `device` is checked (only
        "cpu" runs today). Accepts ``to(dtype)``, ``to(device)``, ``to(device, dtype)`` and
        ``to(tensor)``. Returns self. Example: ``m.to("float64")``."""
        for a in args:
            if isinstance(a, Tensor):
                dtype = a.dtype
            elif _is_device(a):
                device = a
            else:
                dtype = a
        if device is not None:
            _check_device(f"{type(self).__name__}.to", device)
        if dtype is not None:
            self._cast_floating(_dt.as_dtype(dtype), "to")
        return self

    def _cast_floating(self, d, what):
        if not _dt.is_floating(d):
            raise SampanValueError(f"{type(self).__name__}.{what}: got dtype {d}; expected a "
                                   "floating dtype (only floating parameters and buffers are "
                                   "converted)")
        for t in itertools.chain(self.parameters(), self.buffers()):
            if _dt.is_floating(t.dtype) and t.dtype != d:
                t._data = t._data.astype(d)
                bump_version(t)
                if t.grad is not None:
                    t.grad = Tensor(t.grad._data.astype(d))
        return self

    def type(self, dst_type):
        """Convert the floating parameters and buffers to `dst_type`; returns self."""
        return self.to(dst_type)

    def float(self):
        """Floating parameters and buffers to float32; returns self."""
        return self.to(_dt.float32)

    def double(self):
        """Floating parameters and buffers to float64; returns self."""
        return self.to(_dt.float64)

    def half(self):
        """Floating parameters and buffers to float16; returns self."""
        return self.to(_dt.float16)

    def bfloat16(self):
        """Floating parameters and buffers to bfloat16; returns self."""
        return self.to(_dt.bfloat16)

    # ------------------------------------------------------------------ state
    def state_dict(self, prefix: str = "", keep_vars: bool = False) -> OrderedDict:
        """Parameters and persistent buffers by qualified name (tensors share memory).

        Example: ``m.load_state_dict(m.state_dict())``"""
        out = OrderedDict()
        for lname, layer in self.named_layers(prefix.rstrip(".")):
            pre = f"{lname}." if lname else ""
            for name, p in layer._parameters.items():
                if p is not None:
                    out[pre + name] = p if keep_vars else p.detach()
            for name, b in layer._buffers.items():
                if b is not None and name not in layer._non_persistent:
                    out[pre + name] = b if keep_vars else b.detach()
        return out

    def load_state_dict(self, state_dict, strict: bool = True):
        """Copy values from `state_dict` into this layer's parameters and buffers.

        With `strict`, missing or unexpected keys raise; mis-shaped values always
        raise. Returns ``(missing_keys, unexpected_keys)``."""
        own = self.state_dict(keep_vars=True)
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        bad = []
        for k, t in own.items():
            if k in state_dict:
                v = state_dict[k]
                shape = tuple(v.shape) if hasattr(v, "shape") else tuple(np.shape(v))
                if shape != tuple(t.shape):
                    bad.append(f"{k}: checkpoint {shape} vs layer {tuple(t.shape)}")
        if bad or (strict and (missing or unexpected)):
            lines = [f"{type(self).__name__}.load_state_dict: the state dict does not fit"]
            if missing:
                lines.append("  missing keys: " + ", ".join(missing))
            if unexpected:
                lines.append("  unexpected keys: " + ", ".join(unexpected))
            if bad:
                lines.append("  mis-shaped keys: " + "; ".join(bad))
            if not bad:
                lines.append("  pass strict=False to load the keys that match")
            raise ShapeError("\n".join(lines))
        for k, t in own.items():
            if k in state_dict:
                v = state_dict[k]
                a = v._data if isinstance(v, Tensor) else np.asarray(v)
                np.copyto(t._data, a.astype(t.dtype, copy=False))
                bump_version(t)
        return LoadResult(missing, unexpected)

    set_state_dict = load_state_dict

    # ------------------------------------------------------------------ hooks
    def register_forward_pre_hook(self, hook) -> RemovableHandle:
        """`hook(layer, args)` runs before forward; it may return replacement args."""
        h = RemovableHandle(self._forward_pre_hooks)
        self._forward_pre_hooks[h.id] = hook
        return h

    def register_forward_hook(self, hook) -> RemovableHandle:
        """`hook(layer, args, output)` runs after forward; it may return a new output."""
        h = RemovableHandle(self._forward_hooks)
        self._forward_hooks[h.id] = hook
        return h

    def register_full_backward_pre_hook(self, hook) -> RemovableHandle:
        """`hook(layer, grad_output)` runs when the gradients of the layer's outputs are
        known, before those of its inputs; it may return a replacement `grad_output`."""
        h = RemovableHandle(self._backward_pre_hooks)
        self._backward_pre_hooks[h.id] = hook
        return h

    def register_full_backward_hook(self, hook) -> RemovableHandle:
        """`hook(layer, grad_input, grad_output)` runs when the gradients of the layer's
        tensor inputs are known (tuples, None for an input that needs no gradient); it may
        return a replacement `grad_input`. Example::

            >>> h = fc.register_full_backward_hook(lambda m, gi, go: print(gi[0].shape))
        """
        h = RemovableHandle(self._backward_hooks)
        self._backward_hooks[h.id] = hook
        return h

    # ------------------------------------------------------------------ repr
    def extra_repr(self) -> str:
        """One line describing this layer's settings (shown in the tree repr)."""
        return ""

    def __repr__(self):
        # PyTorch's layout: a one-line extra_repr inline, else one entry a line
        extra = self.extra_repr()
        extra_lines = extra.split("\n") if extra else []
        child_lines = [f"({name}): " + repr(child).replace("\n", "\n  ")
                       for name, child in self._layers.items()]
        head = f"{type(self).__name__}("
        if len(extra_lines) == 1 and not child_lines:
            return head + extra_lines[0] + ")"
        if not extra_lines and not child_lines:
            return head + ")"
        return head + "\n  " + "\n  ".join(extra_lines + child_lines) + "\n)"


def _is_device(a) -> bool:
    from ..device import Device
    if isinstance(a, Device) or type(a).__name__ == "device":   # sampan's or torch's
        return True
    if isinstance(a, str):
        try:
            _dt.as_dtype(a)
            return False
        except Exception:
            return True
    return False


def _check_device(where, device):
    """Only the CPU runs layers today: anything else is a clear DeviceError."""
    from ..device import as_device
    d = as_device(device if isinstance(device, str) or type(device).__name__ == "Device"
                  else str(device))
    if d.type != "cpu":   # pragma: no cover (as_device raises for cuda already)
        raise DeviceError(f"{where}: device {d} is not available; layers run on 'cpu'")
    return d
