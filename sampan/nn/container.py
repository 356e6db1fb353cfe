"""Containers: Sequential, LayerList, LayerDict, ParameterList, ParameterDict; and Unflatten."""
from __future__ import annotations

from collections import OrderedDict

from ..errors import SampanValueError, ShapeError
from ..tensor import Tensor
from .layer import Layer, Parameter, is_parameter


class Sequential(Layer):
    """Run layers one after another.

    Example::

        >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        >>> net(sampan.randn(3, 4)).shape
        (3, 2)
    """

    def __init__(self, *layers):
        super().__init__()
        if len(layers) == 1 and isinstance(layers[0], (dict, OrderedDict)):
            for name, layer in layers[0].items():
                self.add_sublayer(str(name), layer)
        else:
            for i, layer in enumerate(layers):
                self.add_sublayer(str(i), layer)

    def forward(self, x):
        for layer in self._layers.values():
            x = layer(x)
        return x

    def __getitem__(self, idx):
        items = list(self._layers.items())
        if isinstance(idx, slice):
            return Sequential(OrderedDict(items[idx]))
        if isinstance(idx, str):
            return self._layers[idx]
        return items[idx][1]

    def __len__(self):
        return len(self._layers)

    def __iter__(self):
        return iter(self._layers.values())

    def append(self, layer):
        self.add_sublayer(str(len(self._layers)), layer)
        return self


class LayerList(Layer):
    """A list of layers whose parameters are registered.

    Example::

        >>> blocks = nn.LayerList([nn.Linear(4, 4) for _ in range(3)])
        >>> len(blocks.parameters())
        6
    """

    def __init__(self, layers=None):
        super().__init__()
        for layer in layers or ():
            self.append(layer)

    def _index(self, i):
        n = len(self._layers)
        if not -n <= i < n:
            raise IndexError(f"LayerList: index {i} out of range for {n} layers")
        return str(i % n)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return LayerList(list(self._layers.values())[idx])
        return self._layers[self._index(idx)]

    def __setitem__(self, idx, layer):
        self.add_sublayer(self._index(idx), layer)

    def __len__(self):
        return len(self._layers)

    def __iter__(self):
        return iter(self._layers.values())

    def append(self, layer):
        """Add `layer` at the end."""
        if not isinstance(layer, Layer):
            raise SampanValueError(f"LayerList.append: got {type(layer).__name__}; "
                                   "expected a Layer")
        self.add_sublayer(str(len(self._layers)), layer)
        return self

    def extend(self, layers):
        for layer in layers:
            self.append(layer)
        return self

    def insert(self, index, layer):
        items = list(self._layers.values())
        items.insert(index, layer)
        self._layers.clear()
        for i, m in enumerate(items):
            self.add_sublayer(str(i), m)

    def forward(self, *args, **kwargs):
        raise NotImplementedError("LayerList has no forward; iterate over it")


class LayerDict(Layer):
    """A dict of layers whose parameters are registered (insertion order kept).

    Example::

        >>> heads = nn.LayerDict({"cls": nn.Linear(8, 3), "reg": nn.Linear(8, 1)})
        >>> heads["reg"](sampan.randn(2, 8)).shape
        (2, 1)
    """

    def __init__(self, layers=None):
        super().__init__()
        if layers is not None:
            self.update(layers)

    def __getitem__(self, key):
        return self._layers[key]

    def __setitem__(self, key, layer):
        self.add_sublayer(key, layer)

    def __delitem__(self, key):
        del self._layers[key]

    def __len__(self):
        return len(self._layers)

    def __iter__(self):
        return iter(self._layers)

    def __contains__(self, key):
        return key in self._layers

    def keys(self):
        return self._layers.keys()

    def values(self):
        return self._layers.values()

    def items(self):
        return self._layers.items()

    def update(self, layers):
        items = layers.items() if hasattr(layers, "items") else layers
        for k, v in items:
            self.add_sublayer(k, v)

    def pop(self, key):
        return self._layers.pop(key)

    def forward(self, *args, **kwargs):
        raise NotImplementedError("LayerDict has no forward; index it")


def _as_param(value):
    """Tensors are stored as Parameters (PyTorch converts them too); other objects as
    they are."""
    if isinstance(value, Tensor) and not is_parameter(value):
        return Parameter(value)
    return value


def _param_line(key, p):
    if isinstance(p, Tensor):
        kind = "Parameter" if is_parameter(p) else "Tensor"
        size = "x".join(str(d) for d in p.shape)
        return f"  ({key}): {kind} containing: [sampan.{p.dtype} of size {size}]"
    return f"  ({key}): Object of type: {type(p).__name__}"


class _ParamStore(Layer):
    """Keys in order; tensors live in `_parameters` (so named_parameters and state_dict
    see them under these keys), other objects in `_objects`."""

    def __init__(self):
        super().__init__()
        self.__dict__["_keys"] = []
        self.__dict__["_objects"] = {}

    def _put(self, key, value):
        value = _as_param(value)
        self._objects.pop(key, None)
        self._parameters.pop(key, None)
        if value is None or is_parameter(value):
            self.register_parameter(key, value)
        else:
            self._objects[key] = value
        if key not in self._keys:
            self._keys.append(key)

    def _get(self, key):
        return self._objects[key] if key in self._objects else self._parameters[key]

    def _remove(self, key):
        value = self._get(key)
        self._objects.pop(key, None)
        self._parameters.pop(key, None)
        self._keys.remove(key)
        return value

    def __len__(self):
        return len(self._keys)

    def extra_repr(self):
        return "\n".join(_param_line(k, self._get(k)) for k in self._keys)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} has no forward; index it")


class ParameterList(_ParamStore):
    """A list of parameters registered under "0", "1", ... (tensors become Parameters).

    Example::

        >>> ps = nn.ParameterList([nn.Parameter(sampan.zeros(3)) for _ in range(2)])
        >>> [n for n, _ in ps.named_parameters()]
        ['0', '1']
    """

    def __init__(self, values=None):
        super().__init__()
        for v in values or ():
            self.append(v)

    def _index(self, i):
        n = len(self._keys)
        if not isinstance(i, int) or not -n <= i < n:
            raise IndexError(f"ParameterList: index {i!r} out of range for {n} entries")
        return str(i % n)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return ParameterList([self._get(k) for k in self._keys[idx]])
        return self._get(self._index(idx))

    def __setitem__(self, idx, value):
        self._put(self._index(idx), value)

    def __iter__(self):
        return iter([self._get(k) for k in self._keys])

    def __iadd__(self, values):
        return self.extend(values)

    def append(self, value):
        """Add `value` at the end; returns self."""
        self._put(str(len(self._keys)), value)
        return self

    def extend(self, values):
        for v in values:
            self.append(v)
        return self


class ParameterDict(_ParamStore):
    """A dict of parameters registered under their (string) keys, in insertion order.

    Example::

        >>> pd = nn.ParameterDict({"scale": nn.Parameter(sampan.ones(4))})
        >>> list(pd.state_dict())
        ['scale']
    """

    def __init__(self, parameters=None):
        super().__init__()
        if parameters is not None:
            self.update(parameters)

    def _key(self, key):
        if not isinstance(key, str) or "." in key or not key:
            raise SampanValueError(f"ParameterDict: got key {key!r}; expected a non-empty "
                                   "string without '.'")
        return key

    def __getitem__(self, key):
        if key not in self._keys:
            raise KeyError(key)
        return self._get(key)

    def __setitem__(self, key, value):
        self._put(self._key(key), value)

    def __delitem__(self, key):
        if key not in self._keys:
            raise KeyError(key)
        self._remove(key)

    def __iter__(self):
        return iter(list(self._keys))

    def __contains__(self, key):
        return key in self._keys

    def keys(self):
        return list(self._keys)

    def values(self):
        return [self._get(k) for k in self._keys]

    def items(self):
        return [(k, self._get(k)) for k in self._keys]

    def get(self, key, default=None):
        return self._get(key) if key in self._keys else default

    def pop(self, key):
        if key not in self._keys:
            raise KeyError(key)
        return self._remove(key)

    def clear(self):
        for k in list(self._keys):
            self._remove(k)

    def update(self, parameters):
        items = parameters.items() if hasattr(parameters, "items") else parameters
        for k, v in items:
            self[k] = v


class Unflatten(Layer):
    """Expand dim `dim` into the shape `unflattened_size` (one entry may be -1).

    Example: ``nn.Unflatten(1, (2, 5))(sampan.randn(3, 10)).shape`` is (3, 2, 5)"""

    def __init__(self, dim, unflattened_size):
        super().__init__()
        if not isinstance(unflattened_size, (tuple, list)) or not all(
                isinstance(d, int) for d in unflattened_size):
            raise SampanValueError(f"Unflatten: got unflattened_size={unflattened_size!r}; "
                                   "expected a tuple or list of ints")
        self.dim, self.unflattened_size = dim, unflattened_size

    def forward(self, x):
        from ..ops.shape import reshape
        d = self.dim % x.ndim if x.ndim and -x.ndim <= self.dim < x.ndim else None
        if d is None:
            raise ShapeError(f"Unflatten: dim={self.dim} for an input of shape "
                             f"{tuple(x.shape)}; expected a dim in [-{x.ndim}, {x.ndim})")
        size = list(self.unflattened_size)
        n = x.shape[d]
        known = 1
        for s in size:
            known *= s if s != -1 else 1
        if size.count(-1) > 1 or (-1 in size and (known == 0 or n % known)) or (
                -1 not in size and known != n):
            raise ShapeError(f"Unflatten: unflattened_size={tuple(size)} for dim {d} of size "
                             f"{n} (input {tuple(x.shape)}); expected sizes whose product "
                             f"is {n}")
        return reshape(x, tuple(x.shape[:d]) + tuple(size) + tuple(x.shape[d + 1:]))

    def extra_repr(self):
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"


# the names sampan.nn exports from this module (not __all__: the module itself is not API)
EXPORTS = ["Sequential", "LayerList", "LayerDict", "ParameterList", "ParameterDict",
           "Unflatten"]
