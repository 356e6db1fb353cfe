"""einsum: one primitive over a canonical equation, and the PyTorch frontend.

The frontend (`einsum`) turns what a user writes (implicit output, `...`, size-1 dims that
broadcast) into a canonical equation: explicit output, letters only, every letter one size
in every operand that has it. Broadcast size-1 dims are reshaped away first, so the
primitive (and its gradient) never broadcasts. The kernel runs small contractions in
numpy's einsum loop and larger ones as a plan of batched matmuls (BLAS) in numpy's
contraction order; the gradient of each operand is again an einsum of the output gradient
with the other operands."""
from __future__ import annotations

import math
import string

import numpy as np

from .. import dtypes as _dt
from ..errors import DTypeError, SampanValueError, ShapeError, op_error
from ..tensor import Tensor, apply
from ._util import Sample, randf, rng
from .registry import Spec, defop

_LETTERS = string.ascii_letters


def _t(x):
    return x if isinstance(x, Tensor) else Tensor(x)


def _bad(equation, shapes, expected, hint=None, cls=SampanValueError):
    got = f"equation {equation!r} with operands of shapes " + ", ".join(
        str(tuple(s)) for s in shapes)
    return op_error(cls, "einsum", got, expected, hint)


def _split_term(term, equation, shapes):
    """A term's letters, with '...' kept as one item; raises on other characters."""
    if term.count("...") > 1 or term.replace("...", "").count("."):
        raise _bad(equation, shapes, "at most one '...' per term (and no other '.')")
    out = []
    rest = term
    while rest:
        if rest.startswith("..."):
            out.append("...")
            rest = rest[3:]
            continue
        c = rest[0]
        if c not in _LETTERS:
            raise _bad(equation, shapes, "subscripts made of letters a-z, A-Z, ',', '->' and "
                       f"'...'", f"{c!r} is not one of them")
        out.append(c)
        rest = rest[1:]
    return out


def parse(equation, shapes, broadcast=True):
    """(canonical equation, per operand the shape to reshape it to or None).

    `broadcast=False` (the primitive's rule) accepts only a canonical equation: no '...',
    explicit output, each letter one size everywhere."""
    if not isinstance(equation, str):
        raise _bad(equation, shapes, "an equation string such as 'ij,jk->ik'")
    eq = equation.replace(" ", "")
    if eq.count("->") > 1 or eq.replace("->", "").count("-") or eq.replace("->", "").count(
            ">"):
        raise _bad(equation, shapes, "at most one '->'")
    lhs, arrow, rhs = eq.partition("->")
    terms = [_split_term(t, equation, shapes) for t in lhs.split(",")]
    if len(terms) != len(shapes):
        raise _bad(equation, shapes, f"{len(terms)} operand(s), one per term of the "
                   f"equation", f"the equation names {len(terms)}, got {len(shapes)}")
    ell_dims = []
    for k, (term, shape) in enumerate(zip(terms, shapes)):
        n = sum(1 for c in term if c != "...")
        has_ell = "..." in term
        if (not has_ell and n != len(shape)) or (has_ell and n > len(shape)):
            raise _bad(equation, shapes, f"as many subscripts as dims in each operand",
                       f"operand {k} has {len(shape)} dim(s) and its term "
                       f"{''.join(term)!r} names {n}" + ("" if has_ell else
                                                         " (and has no '...')"),
                       ShapeError)
        ell_dims.append(len(shape) - n if has_ell else 0)
    any_ell = any("..." in t for t in terms)
    if not broadcast and (any_ell or not arrow):
        raise _bad(equation, shapes, "a canonical equation (explicit output, no '...')")
    used = set(eq)
    free = [c for c in _LETTERS if c not in used]
    nell = max(ell_dims, default=0)
    if nell > len(free):
        raise _bad(equation, shapes, "fewer than 52 distinct dims in all")
    ell = free[:nell]
    full = []
    for term, ne in zip(terms, ell_dims):
        t = []
        for c in term:
            t.extend(ell[nell - ne:] if c == "..." else [c])
        full.append(t)
    if arrow:
        out_terms = _split_term(rhs, equation, shapes)
        out = []
        for c in out_terms:
            out.extend(ell if c == "..." else [c])
        names = [c for c in out_terms if c != "..."]
        for c in names:
            if names.count(c) > 1:
                raise _bad(equation, shapes, "each output subscript once",
                           f"{c!r} appears {names.count(c)} times in the output")
            if not any(c in t for t in terms):
                raise _bad(equation, shapes, "output subscripts that appear in an input",
                           f"{c!r} is in the output only")
        if "..." in out_terms and not any_ell:
            out = [c for c in out if c not in ell]
    else:
        counts = {}
        for t in terms:
            for c in t:
                if c != "...":
                    counts[c] = counts.get(c, 0) + 1
        out = ell + sorted(c for c, n in counts.items() if n == 1)
    sizes = _letter_sizes(equation, shapes, full, broadcast)
    new_shapes = []
    canon = []
    for t, shape in zip(full, shapes):
        keep = [i for i, c in enumerate(t) if not (shape[i] == 1 and sizes[c] != 1)]
        if len(keep) < len(t):
            new_shapes.append(tuple(shape[i] for i in keep))
            t = [t[i] for i in keep]
        else:
            new_shapes.append(None)
        canon.append("".join(t))
    return ",".join(canon) + "->" + "".join(out), new_shapes, tuple(sizes[c] for c in out)


def _letter_sizes(equation, shapes, full, broadcast):
    """Each letter's size; size-1 dims broadcast (as in PyTorch) unless `broadcast` is off."""
    sizes = {}
    for k, (t, shape) in enumerate(zip(full, shapes)):
        for c, d in zip(t, shape):
            s = sizes.get(c)
            if s is None or (broadcast and s == 1):
                sizes[c] = d
            elif d != s and not (broadcast and d == 1):
                raise _bad(equation, shapes, "one size for each subscript (or 1, which "
                           "broadcasts)" if broadcast else "one size for each subscript",
                           f"{c!r} is {s} in one place and {d} in operand {k}", ShapeError)
    return sizes


def _terms(equation):
    lhs, _, out = equation.partition("->")
    return lhs.split(","), out


# ---------------------------------------------------------------------- the primitive
def _einsum_rule(*xs, equation):
    shapes = [tuple(x.shape) for x in xs]
    if not xs:
        raise _bad(equation, shapes, "at least one operand")
    d = xs[0].dtype
    for x in xs[1:]:
        if x.dtype != d:
            raise op_error(DTypeError, "einsum", "dtypes " + ", ".join(str(x.dtype) for x in xs),
                           "one dtype (sampan.einsum promotes before calling the op)")
    if d == np.bool_:
        raise op_error(DTypeError, "einsum", "bool operands", "numeric operands (as PyTorch)")
    _, _, out_shape = parse(equation, shapes, broadcast=False)
    return Spec(out_shape, d)


_SMALL = 4096


def _einsum_kernel(*xs, equation):
    if xs[0].dtype == _dt.bfloat16 or xs[0].dtype == np.float16:
        return _einsum_kernel(*[x.astype(np.float32) for x in xs],
                              equation=equation).astype(xs[0].dtype)
    terms, out = _terms(equation)
    size = {}
    for t, x in zip(terms, xs):
        size.update(zip(t, x.shape))
    if len(xs) == 1 or math.prod(size.values()) <= _SMALL:
        # one operand, or few products in all: numpy's C loop costs less than a plan
        r = np.asarray(np.einsum(equation, *xs))
        # 'ij->ji' gives numpy's view; an op result owns its memory
        return r.copy() if len(xs) == 1 and np.may_share_memory(r, xs[0]) else r
    ops = list(zip(xs, terms))
    path = [(0, 1)] if len(xs) == 2 else np.einsum_path(equation, *xs, optimize="greedy")[0][1:]
    for step in path:   # numpy's order; each step's operands contracted pairwise
        group = [ops[k] for k in step]
        ops = [o for k, o in enumerate(ops) if k not in step]
        while len(group) > 1:
            need = set(out).union(*[set(t) for _, t in group[2:] + ops])
            group = [_pair(*group[0], *group[1], need)] + group[2:]
        ops.append(group[0])
    r, t = ops[0]
    return np.ascontiguousarray(np.einsum(t + "->" + out, r) if t != out else r)


def _reduce_own(a, ta, keep):
    """a with its diagonals taken and the letters no one else needs summed: (array, term)."""
    t = "".join(c for c in dict.fromkeys(ta) if c in keep)
    return (a, ta) if t == ta else (np.einsum(ta + "->" + t, a), t)


def _pair(a, ta, b, tb, need):
    """Contract two operands as one batched matrix product (numpy's optimize=True calls
    tensordot, which loops over a batch: 12x slower than matmul on 'bij,bjk->bik')."""
    a, ta = _reduce_own(a, ta, need | set(tb))
    b, tb = _reduce_own(b, tb, need | set(ta))
    batch = [c for c in ta if c in tb and c in need]
    contr = [c for c in ta if c in tb and c not in need]
    left = [c for c in ta if c not in tb]
    right = [c for c in tb if c not in ta]
    size = dict(zip(ta, a.shape))
    size.update(zip(tb, b.shape))

    def n(cs):
        return math.prod([size[c] for c in cs])
    am = a.transpose([ta.index(c) for c in batch + left + contr]).reshape(
        n(batch), n(left), n(contr))
    bm = b.transpose([tb.index(c) for c in batch + contr + right]).reshape(
        n(batch), n(contr), n(right))
    r = np.matmul(am, bm).reshape([size[c] for c in batch + left + right])
    return r, "".join(batch + left + right)


def _einsum_flops(*xs, equation):
    terms, _ = _terms(equation)
    sizes = {}
    for t, x in zip(terms, xs):
        for c, d in zip(t, x.shape):
            sizes[c] = d if isinstance(d, int) else 1
    n = 1
    for d in sizes.values():
        n *= d
    return n * max(1, len(xs) - 1) * 2


def _ein(equation, *xs):
    """The primitive on a canonical equation; a permutation of one operand is a permute."""
    from .shape import permute
    terms, out = _terms(equation)
    if len(xs) == 1 and len(set(terms[0])) == len(terms[0]) and sorted(terms[0]) == sorted(out):
        return permute(xs[0], tuple(terms[0].index(c) for c in out))
    return apply(EINSUM, tuple(xs), {"equation": equation})


def _einsum_grad(g, y, *xs, equation):
    terms, out = _terms(equation)
    return tuple(_operand_grad(g, xs, terms, out, k) if x.requires_grad else None
                 for k, x in enumerate(xs))


def _operand_grad(g, xs, terms, out, k):
    """d/d xs[k]: the output gradient contracted with the other operands onto xs[k]'s
    letters; letters only xs[k] has (summed out) broadcast back; a letter xs[k] repeats
    (a diagonal) goes back onto the diagonal through identity matrices."""
    from .shape import expand, reshape
    term = terms[k]
    uniq = "".join(dict.fromkeys(term))
    avail = set(out).union(*[set(terms[j]) for j in range(len(xs)) if j != k])
    keep = "".join(c for c in uniq if c in avail)
    others = [j for j in range(len(xs)) if j != k]
    gk = _ein(",".join([out] + [terms[j] for j in others]) + "->" + keep,
              g, *[xs[j] for j in others])
    size = {c: xs[k].shape[term.index(c)] for c in uniq}
    if len(keep) < len(uniq):
        gk = reshape(gk, tuple(size[c] if c in keep else 1 for c in uniq))
        gk = expand(gk, tuple(size[c] for c in uniq))
    if len(uniq) == len(term):
        return gk if uniq == term else _ein(uniq + "->" + term, gk)
    used = set("".join(terms) + out)
    fresh = iter(c for c in _LETTERS if c not in used)
    target, eyes, seen = [], [], set()
    for c in term:
        if c in seen:
            n = next(fresh)
            eyes.append(c + n)
            target.append(n)
        else:
            seen.add(c)
            target.append(c)
    mats = [Tensor(np.eye(size[e[0]], dtype=xs[k].dtype)) for e in eyes]
    return _ein(",".join([uniq] + eyes) + "->" + "".join(target), gk, *mats)


def _samples():
    r = rng(300)
    return [Sample((randf(r, 2, 3, 4), randf(r, 2, 4, 2)), {"equation": "bij,bjk->bik"}),
            # a diagonal (ii) and a letter only one operand has (b, summed out)
            Sample((randf(r, 2, 3, 3), randf(r, 3, 2)), {"equation": "bii,ik->k"})]


EINSUM = defop("einsum", _einsum_rule, kernel=_einsum_kernel, grad=_einsum_grad,
               flops=_einsum_flops, onnx="Einsum", samples=_samples,
               doc="Einstein summation over a canonical equation (see sampan.einsum)", amp="lower",
               gemm=True)


def einsum(equation, *operands):
    """Einstein summation, as ``torch.einsum``: implicit or explicit output, ``...``,
    repeated subscripts (diagonals), size-1 dims that broadcast. Operands may also come
    as one list, or in torch's sublist form ``einsum(a, [0, 1], b, [1, 2], [0, 2])``.
    Example::

        >>> sampan.einsum("bij,bjk->bik", a, b)     # batched matrix product
        >>> sampan.einsum("ii", m)                   # trace
    """
    if not isinstance(equation, str) and not isinstance(equation, (list, tuple)):
        equation, operands = _from_sublists((equation,) + operands)
    elif len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    from .shape import reshape
    xs = _promote([_t(o) for o in operands])
    canon, shapes, _ = parse(equation, [tuple(x.shape) for x in xs])
    xs = [x if s is None else reshape(x, s) for x, s in zip(xs, shapes)]
    return apply(EINSUM, tuple(xs), {"equation": canon})


def _from_sublists(args):
    """torch's sublist form ``einsum(a, [0, 1], b, [1, 2], [0, 2])`` as (equation, operands):
    ints 0-51 name dims, Ellipsis is '...'."""
    def term(sub):
        try:
            return "".join("..." if i is Ellipsis else _LETTERS[int(i)] for i in sub)
        except (IndexError, TypeError, ValueError):
            raise op_error(SampanValueError, "einsum", f"sublist {sub!r}",
                           "ints in [0, 52) or Ellipsis naming the dims") from None
    ops, terms = list(args[0::2]), [term(sub) for sub in args[1::2]]
    out = None
    if len(ops) > len(terms):                 # an odd count: the last is the output
        out = term(ops.pop())
    return ",".join(terms) + ("" if out is None else "->" + out), tuple(ops)


def _promote(xs):
    from .elementwise import cast
    if not xs:
        return xs
    d = xs[0].dtype
    for x in xs[1:]:
        d = _dt.promote_types(d, x.dtype)
    return [x if x.dtype == d else cast(x, d) for x in xs]


def tensordot(a, b, dims=2):
    """Sum products over `dims` (an int: a's last and b's first dims; or a pair of lists),
    as ``torch.tensordot``. Example: ``sampan.tensordot(a, b, dims=([1, 0], [0, 1]))``."""
    a, b = _promote([_t(a), _t(b)])
    if isinstance(dims, int) or (isinstance(dims, Tensor) and dims.ndim == 0):
        n = int(dims)
        if n < 0 or n > min(a.ndim, b.ndim):
            raise op_error(SampanValueError, "tensordot", f"dims={n} for shapes "
                           f"{tuple(a.shape)} and {tuple(b.shape)}",
                           "0 <= dims <= the smaller number of dims")
        da, db = list(range(a.ndim - n, a.ndim)), list(range(n))
    else:
        da, db = ([int(i) for i in np.atleast_1d(np.asarray(d))] for d in dims)
    if len(da) != len(db):
        raise op_error(SampanValueError, "tensordot", f"dims {da} and {db}",
                       "two lists of the same length")
    la = list(_LETTERS[:a.ndim])
    lb = list(_LETTERS[a.ndim:a.ndim + b.ndim])
    for i, j in zip(da, db):
        if not (-a.ndim <= i < a.ndim and -b.ndim <= j < b.ndim):
            raise op_error(ShapeError, "tensordot", f"dims {da} and {db} for shapes "
                           f"{tuple(a.shape)} and {tuple(b.shape)}", "dims within each tensor")
        if a.shape[i] != b.shape[j]:
            raise op_error(ShapeError, "tensordot", f"dim {i} of {tuple(a.shape)} with dim "
                           f"{j} of {tuple(b.shape)}", "contracted dims of equal size")
        lb[j % b.ndim] = la[i % a.ndim]
    out = [c for c in la if c not in lb] + [c for c in lb if c not in la]
    return apply(EINSUM, (a, b), {"equation": "".join(la) + "," + "".join(lb) + "->" +
                                  "".join(out)})
