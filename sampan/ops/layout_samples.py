"""Test samples of the layout composites, registered in `COMPOSITES` (the op harness runs
each against its PyTorch oracle in tests/ops/torch_oracle_layout.py, for gradients, second
order and eager == jit). Functions that take a list or return a tuple are registered
through a wrapper with one tensor out (tuple outputs stacked), the oracle doing the same."""
from __future__ import annotations

import numpy as np

from . import einsum as _es
from . import layout_mm as _mm
from . import layout_shape as _sh
from ._util import Sample, randf, rng
from .composite import COMPOSITES
from .shape import stack


def _r(seed, *shape):
    return randf(rng(seed), *shape)


def _i(*a):
    return np.array(a, np.int64)


def _ints(seed, *shape):
    return rng(seed).integers(-3, 4, size=shape).astype(np.int64)


_S = {
    "mm": (_mm.mm, lambda: [Sample((_r(400, 3, 4), _r(401, 4, 2))),
                          Sample((_ints(402, 2, 3), _ints(403, 3, 2)))]),
    "bmm": (_mm.bmm, lambda: [Sample((_r(404, 2, 3, 4), _r(405, 2, 4, 2)))]),
    "mv": (_mm.mv, lambda: [Sample((_r(406, 3, 4), _r(407, 4)))]),
    "dot": (_mm.dot, lambda: [Sample((_r(408, 5), _r(409, 5))),
                            Sample((_ints(410, 4), _ints(411, 4)))]),
    "vdot": (_mm.vdot, lambda: [Sample((_r(412, 4), _r(413, 4)))]),
    "inner": (_mm.inner, lambda: [Sample((_r(414, 2, 3), _r(415, 4, 3))),
                                Sample((_r(416, 3), _r(417, 2, 3)))]),
    "outer": (_mm.outer, lambda: [Sample((_r(418, 3), _r(419, 4)))]),
    "ger": (_mm.ger, lambda: [Sample((_r(420, 2), _r(421, 3)))]),
    "addmm": (_mm.addmm, lambda: [Sample((_r(422, 3, 2), _r(423, 3, 4), _r(424, 4, 2)),
                                       {"beta": 0.5, "alpha": 2.0}),
                                Sample((_r(425, 2), _r(426, 3, 4), _r(427, 4, 2)))]),
    "addmv": (_mm.addmv, lambda: [Sample((_r(428, 3), _r(429, 3, 4), _r(430, 4)),
                                       {"beta": 2.0})]),
    "addbmm": (_mm.addbmm, lambda: [Sample((_r(431, 3, 2), _r(432, 2, 3, 4), _r(433, 2, 4, 2)),
                                         {"beta": 0.5, "alpha": -1.0})]),
    "baddbmm": (_mm.baddbmm, lambda: [Sample((_r(434, 2, 3, 2), _r(435, 2, 3, 4),
                                            _r(436, 2, 4, 2)), {"alpha": 0.5}),
                                    Sample((_r(437, 3, 2), _r(438, 2, 3, 4), _r(439, 2, 4, 2)),
                                           {"beta": -1.0})]),
    "tensordot": (_es.tensordot, lambda: [
        Sample((_r(440, 2, 3, 4), _r(441, 3, 4, 2)), {"dims": 2}),
        Sample((_r(442, 3, 2, 4), _r(443, 2, 3, 2)), {"dims": ([1, 0], [0, 1])})]),
    # the frontend: '...' with batch broadcasting, implicit output
    "einsum_frontend": (lambda *xs, equation: _es.einsum(equation, *xs), lambda: [
        Sample((_r(444, 2, 1, 2, 3), _r(445, 3, 3, 2)), {"equation": "...ij,...jk"}),
        Sample((_r(446, 3, 3), _r(447, 3)), {"equation": "ii,i->"})]),
    "t": (_sh.t, lambda: [Sample((_r(448, 3, 4),)), Sample((_r(449, 3),))]),
    "movedim": (_sh.movedim, lambda: [Sample((_r(450, 2, 3, 4),), {"source": (0, 1),
                                                                 "destination": (2, 0)}),
                                    Sample((_r(451, 2, 3, 4),), {"source": -1,
                                                                 "destination": 0})]),
    "unbind": (lambda x, dim=0: stack(_sh.unbind(x, dim), 0), lambda: [
        Sample((_r(452, 2, 3, 2),), {"dim": 1})]),
    "tile": (_sh.tile, lambda: [Sample((_r(453, 2, 3),), {"dims": (2,)}),
                              Sample((_r(454, 3),), {"dims": (2, 2)})]),
    "repeat": (lambda x, sizes: _sh.repeat(x, *sizes), lambda: [
        Sample((_r(455, 2, 3),), {"sizes": (2, 1, 2)}),
        Sample((_r(456, 3),), {"sizes": (2, 0)})]),
    "repeat_interleave_composite": (_sh.repeat_interleave, lambda: [
        Sample((_r(457, 2, 3),), {"repeats": 2, "dim": 1}),
        Sample((_r(458, 3, 2), _i(1, 0, 2)), {"dim": 0, "output_size": 3}, diff=(0,))]),
    "meshgrid": (lambda *xs, indexing="ij": stack(_sh.meshgrid(*xs, indexing=indexing)),
                 lambda: [Sample((_r(459, 3), _r(460, 4)), {"indexing": "xy"}),
                          Sample((_r(461, 2), _r(462, 3), _r(463, 2)), {"indexing": "ij"})]),
    "vstack": (lambda *xs: _sh.vstack(xs), lambda: [Sample((_r(464, 3), _r(465, 2, 3)))]),
    "hstack": (lambda *xs: _sh.hstack(xs), lambda: [Sample((_r(466, 2, 3), _r(467, 2, 1))),
                                                  Sample((_r(468, 2), _r(469, 3)))]),
    "dstack": (lambda *xs: _sh.dstack(xs), lambda: [Sample((_r(470, 2, 3), _r(471, 2, 3)))]),
    "column_stack": (lambda *xs: _sh.column_stack(xs), lambda: [
        Sample((_r(472, 2), _r(473, 2, 3)))]),
    "atleast_1d": (_sh.atleast_1d,
                   lambda: [Sample((np.float32(1.5) * np.ones((), np.float32),))]),
    "atleast_2d": (_sh.atleast_2d, lambda: [Sample((_r(474, 3),))]),
    "atleast_3d": (_sh.atleast_3d, lambda: [Sample((_r(475, 4),)), Sample((_r(476, 2, 3),))]),
    "ravel": (_sh.ravel, lambda: [Sample((_r(477, 2, 3),))]),
    "take": (_sh.take, lambda: [Sample((_r(478, 2, 3), _i(0, -1, 4, 2).reshape(2, 2)),
                                     diff=(0,))]),
    "rot90": (_sh.rot90, lambda: [Sample((_r(479, 2, 3, 4),), {"k": 1, "dims": (1, 2)}),
                                Sample((_r(480, 2, 3, 4),), {"k": -1, "dims": (0, 2)})]),
    "fliplr": (_sh.fliplr, lambda: [Sample((_r(481, 2, 3),))]),
    "flipud": (_sh.flipud, lambda: [Sample((_r(482, 3, 2),))]),
    "kron": (_sh.kron, lambda: [Sample((_r(483, 2, 3), _r(484, 2, 2))),
                              Sample((_r(485, 3), _r(486, 2, 2)))]),
    "cross": (_sh.cross, lambda: [Sample((_r(487, 4, 3), _r(488, 1, 3)), {"dim": 1}),
                                Sample((_r(489, 3, 2), _r(490, 3, 2)), {"dim": None})]),
    "trace": (_sh.trace, lambda: [Sample((_r(491, 3, 4),)), Sample((_ints(492, 3, 3),))]),
    "cartesian_prod": (_sh.cartesian_prod, lambda: [Sample((_r(493, 2), _r(494, 3)))]),
    "block_diag": (_sh.block_diag, lambda: [Sample((_r(495, 2, 2), _r(496, 3),
                                                  np.full((), 2.5, np.float32)))]),
    "diag": (_sh.diag, lambda: [Sample((_r(497, 3),), {"diagonal": 1}),
                              Sample((_r(498, 3, 4),), {"diagonal": -1})]),
}

for _name, _entry in _S.items():
    if _name in COMPOSITES:
        raise ValueError(f"composite {_name!r} is registered twice")
    COMPOSITES[_name] = _entry
