"""Containers: Sequential, LayerList, LayerDict."""
from __future__ import annotations

from collections import OrderedDict

from ..errors import SampanValueError
from .layer import Layer


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


# the names sampan.nn exports from this module (not __all__: the module itself is not API)
EXPORTS = ["Sequential", "LayerList", "LayerDict"]
