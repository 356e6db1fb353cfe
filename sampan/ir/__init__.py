"""The Graph IR: SSA Values with shape and dtype, Nodes naming ops of the table,
a text form that parses back to an equal Graph, and a verifier.

Example::

    >>> from sampan.ir import parse, verify
    >>> g = parse(text); verify(g); assert parse(str(g)) == g
"""
from .graph import Graph, Node, Value
from .text import ParseError, parse, print_graph
from .verify import VerifyError, verify
from .viz import render, to_dot

__all__ = ["Graph", "Node", "Value", "parse", "print_graph", "verify", "VerifyError",
           "ParseError", "to_dot", "render"]
