"""The Graph text writer (`sampan.ir.printer`) sits below `graph.py`: a Graph prints and
compares through it, `text.py` (the parser) re-exports its names."""
import numpy as np
import pytest

from sampan.errors import SampanError
from sampan.ir import graph, printer, text


def test_text_reexports_the_writer():
    for name in ("fmt_lit", "node_str", "print_graph", "type_str", "INLINE_CONST_MAX"):
        assert getattr(text, name) is getattr(printer, name)


def test_a_graph_prints_through_the_writer_and_parses_back():
    g = graph.Graph()
    x = g.add_input((2, 3), "float32")
    (y,) = g.add_node("relu", [x], {}).outputs
    g.outputs = [y]
    assert str(g) == printer.print_graph(g)
    assert text.parse(str(g)) == g


def test_an_attribute_that_is_not_plain_data_is_refused():
    with pytest.raises(SampanError, match="not plain data"):
        printer.fmt_lit(object())
    assert printer.fmt_lit(np.float32(-np.nan)) == "-nan"
