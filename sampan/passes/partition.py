"""`partition`: give each node to the first kernel provider of an ordered list that
supports it (`sampan.backends`: `Provider.supports(node)`), as onnxruntime's
`providers=[...]` does. The provider's name goes to `node.meta["provider"]`, which the
jit codegen binds (`Provider.bind(node)`); the graph's text does not change.

The list is the pass's `providers` option, else `graph.meta["providers"]` (read for older
callers), else the list of eager dispatch and the jit (`sampan.backends.get_providers()`).
With "onnxruntime" in the list, the nodes it supports are first cut into engine nodes by
the `onnxruntime_offload` pass (unless that pass ran already), with its options.

Example::

    >>> PassManager(["partition"], options={"partition": {"providers": ["mine"]}}).run(g)
    >>> [n.meta["provider"] for n in g.nodes]
"""
from __future__ import annotations

from .manager import register_pass

OPTIONS = "providers"


def order_of(g) -> list:
    from ..backends import get_providers
    from ..backends.provider import check_order
    names = g.meta.get(OPTIONS)
    return check_order(names, "partition") if names else get_providers()


def assign(g, order=None, nodes=None) -> dict:
    """Set `node.meta["provider"]` of every node of `g` (or of `nodes`) by `order` (names;
    default `order_of(g)`); returns {provider name: number of nodes}."""
    from ..backends.provider import first_supporting
    order = list(order or order_of(g))
    counts: dict = {}
    for n in (g.nodes if nodes is None else nodes):
        p = first_supporting(n, order).name
        n.meta["provider"] = p
        counts[p] = counts.get(p, 0) + 1
    return counts


@register_pass("partition", options={"providers": None}, blocks=True)
def partition(g, providers=None):
    """Assign each node to the first provider of the list that supports it."""
    if providers:
        from ..backends.provider import check_order
        order = check_order(providers, "partition")
    else:
        order = order_of(g)
    if "onnxruntime" in order and "offload_report" not in g.meta and any(
            n.op != "engine" for n in g.nodes):
        from .offload import onnxruntime_offload
        g = onnxruntime_offload(g) or g
    g.meta["partition"] = assign(g, order)
    g.meta[OPTIONS] = list(order)     # nodes that later passes add get the same list
    return g
