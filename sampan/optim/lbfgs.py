"""L-BFGS with an optional strong-Wolfe line search, as `torch.optim.LBFGS`.

All parameters are treated as one flat vector. A `step(closure)` runs up to
`max_iter` quasi-Newton iterations: the search direction comes from the two-loop
recursion over the last `history_size` curvature pairs ``(s, y)``; the step length is
`lr` (the very first one scaled by ``1/sum|g|``), or the one a strong-Wolfe line search
(cubic interpolation, then zoom) finds. The iteration and its stopping tests follow
PyTorch's, so the iterates agree with `torch.optim.LBFGS` given the same closure.
"""
from __future__ import annotations

import numpy as np

from sampan.autograd import enable_grad, no_grad
from sampan.autograd.tape import bump_version
from sampan.errors import SampanValueError, op_error

from ._eager import EagerOnly, check_range
from .optimizer import Optimizer

__all__ = ["LBFGS"]


def _cubic_min(x1, f1, g1, x2, f2, g2, bounds=None):
    """Minimiser of the cubic through (x1, f1, g1) and (x2, f2, g2), clipped to `bounds`."""
    lo, hi = bounds if bounds is not None else (min(x1, x2), max(x1, x2))
    d1 = g1 + g2 - 3.0 * (f1 - f2) / (x1 - x2)
    disc = d1 * d1 - g1 * g2
    if disc < 0:
        return (lo + hi) / 2.0
    d2 = np.sqrt(disc)
    if x1 <= x2:
        x = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2.0 * d2))
    else:
        x = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2.0 * d2))
    return min(max(x, lo), hi)


def _strong_wolfe(evaluate, t, d, f, g, gtd, c1=1e-4, c2=0.9, tol_change=1e-9, max_ls=25):
    """Step length along `d` meeting the strong Wolfe conditions (bracket, then zoom).

    `evaluate(t)` returns (loss, flat gradient) at ``x + t*d``. Returns
    ``(loss, grad, t, evaluations)`` at the chosen step.
    """
    d_norm = float(np.max(np.abs(d)))
    g = g.copy()
    f_new, g_new = evaluate(t)
    evals, it = 1, 0
    gtd_new = float(g_new @ d)
    t_prev, f_prev, g_prev, gtd_prev = 0.0, f, g, gtd
    done = False
    # phase 1: grow the step until the minimum is bracketed (or Wolfe holds)
    while it < max_ls:
        if f_new > f + c1 * t * gtd or (it > 1 and f_new >= f_prev):
            br, br_f, br_g, br_gtd = [t_prev, t], [f_prev, f_new], [g_prev, g_new.copy()], \
                [gtd_prev, gtd_new]
            break
        if abs(gtd_new) <= -c2 * gtd:
            br, br_f, br_g = [t], [f_new], [g_new]
            done = True
            break
        if gtd_new >= 0:
            br, br_f, br_g, br_gtd = [t_prev, t], [f_prev, f_new], [g_prev, g_new.copy()], \
                [gtd_prev, gtd_new]
            break
        nxt = _cubic_min(t_prev, f_prev, gtd_prev, t, f_new, gtd_new,
                         bounds=(t + 0.01 * (t - t_prev), t * 10))
        t_prev, f_prev, g_prev, gtd_prev = t, f_new, g_new.copy(), gtd_new
        t = nxt
        f_new, g_new = evaluate(t)
        evals += 1
        gtd_new = float(g_new @ d)
        it += 1
    if it == max_ls:
        br, br_f, br_g = [0.0, t], [f, f_new], [g, g_new]
    # phase 2: zoom into the bracket
    stalled = False
    low, high = (0, 1) if br_f[0] <= br_f[-1] else (1, 0)
    while not done and it < max_ls:
        if abs(br[1] - br[0]) * d_norm < tol_change:
            break
        t = _cubic_min(br[0], br_f[0], br_gtd[0], br[1], br_f[1], br_gtd[1])
        hi_t, lo_t = max(br), min(br)
        margin = 0.1 * (hi_t - lo_t)
        if min(hi_t - t, t - lo_t) < margin:
            # too close to an end: after one such step, or outside, move in by `margin`
            if stalled or t >= hi_t or t <= lo_t:
                t = hi_t - margin if abs(t - hi_t) < abs(t - lo_t) else lo_t + margin
                stalled = False
            else:
                stalled = True
        else:
            stalled = False
        f_new, g_new = evaluate(t)
        evals += 1
        gtd_new = float(g_new @ d)
        it += 1
        if f_new > f + c1 * t * gtd or f_new >= br_f[low]:
            br[high], br_f[high], br_g[high], br_gtd[high] = t, f_new, g_new.copy(), gtd_new
            low, high = (0, 1) if br_f[0] <= br_f[1] else (1, 0)
        else:
            if abs(gtd_new) <= -c2 * gtd:
                done = True
            elif gtd_new * (br[high] - br[low]) >= 0:
                br[high], br_f[high], br_g[high], br_gtd[high] = \
                    br[low], br_f[low], br_g[low], br_gtd[low]
            br[low], br_f[low], br_g[low], br_gtd[low] = t, f_new, g_new.copy(), gtd_new
    return br_f[low], br_g[low], br[low], evals


class LBFGS(EagerOnly, Optimizer):
    """Limited-memory BFGS, as `torch.optim.LBFGS`; `step` needs a closure.

    The closure clears the gradients, computes the loss, calls `backward()` and
    returns the loss; `step(closure)` may call it up to `max_eval` times and returns
    the first loss. One parameter group only. `line_search_fn` is None (fixed step
    `lr`) or ``"strong_wolfe"``.

    Example::

        >>> opt = sampan.optim.LBFGS([x], lr=1, line_search_fn="strong_wolfe")
        >>> def closure():
        ...     opt.zero_grad(); loss = f(x); loss.backward(); return loss
        >>> opt.step(closure)
    """

    def __init__(self, params, lr=1.0, max_iter=20, max_eval=None, tolerance_grad=1e-7,
                 tolerance_change=1e-9, history_size=100, line_search_fn=None):
        if max_eval is None:
            max_eval = max_iter * 5 // 4
        super().__init__(params, {"lr": lr, "max_iter": max_iter, "max_eval": max_eval,
                                  "tolerance_grad": tolerance_grad,
                                  "tolerance_change": tolerance_change,
                                  "history_size": history_size,
                                  "line_search_fn": line_search_fn})
        if len(self.param_groups) != 1:
            raise SampanValueError("LBFGS: got several parameter groups; it supports one "
                                   "(no per-parameter options)")
        self._params = self.param_groups[0]["params"]

    def _check_group(self, g):
        check_range("LBFGS", "learning rate", g["lr"])
        if g["line_search_fn"] not in (None, "strong_wolfe"):
            raise SampanValueError(f"LBFGS: line_search_fn {g['line_search_fn']!r}; expected "
                                   "None or 'strong_wolfe'")
        if g["max_iter"] < 1 or g["history_size"] < 1:
            raise SampanValueError(f"LBFGS: max_iter {g['max_iter']} and history_size "
                                   f"{g['history_size']} must be >= 1")

    # ------------------------------------------------------------ the flat vector
    def _flat_grad(self) -> np.ndarray:
        parts = [np.zeros(p._data.size, p._data.dtype) if p.grad is None
                 else np.ravel(p.grad._data) for p in self._params]
        return np.concatenate(parts)

    def _add(self, t, d) -> None:
        offset = 0
        for p in self._params:
            n = p._data.size
            p._data += (t * d[offset:offset + n]).reshape(p._data.shape)
            offset += n
            bump_version(p)

    def _set(self, values) -> None:
        for p, v in zip(self._params, values):
            p._data[...] = v
            bump_version(p)

    def _evaluate(self, closure) -> float:
        with enable_grad():
            return float(closure())

    def step(self, closure=None):
        """Run up to `max_iter` iterations; returns the loss before the first one."""
        if closure is None:
            raise op_error(SampanValueError, "LBFGS.step", "no closure",
                           "a closure that computes the loss, calls backward() and returns it")
        group = self.param_groups[0]
        lr, max_iter, max_eval = group["lr"], group["max_iter"], group["max_eval"]
        tol_grad, tol_change = group["tolerance_grad"], group["tolerance_change"]
        history = group["history_size"]
        state = self.state.setdefault(self._params[0], {})
        state.setdefault("func_evals", 0)
        state.setdefault("n_iter", 0)
        with enable_grad():
            first = closure()
        loss = float(first)
        evals = 1
        state["func_evals"] += 1
        g = self._flat_grad()
        if np.max(np.abs(g)) <= tol_grad:
            return first
        d, t = state.get("d"), state.get("t")
        dirs, stps, ro = state.get("old_dirs"), state.get("old_stps"), state.get("ro")
        h_diag = state.get("H_diag")
        g_prev, loss_prev = state.get("prev_flat_grad"), state.get("prev_loss")
        n_iter = 0
        with no_grad():
            while n_iter < max_iter:
                n_iter += 1
                state["n_iter"] += 1
                if state["n_iter"] == 1:
                    d = -g
                    dirs, stps, ro, h_diag = [], [], [], 1.0
                else:
                    y = g - g_prev
                    s = d * t
                    ys = float(y @ s)
                    if ys > 1e-10:  # keep only pairs with positive curvature
                        if len(dirs) == history:
                            dirs.pop(0), stps.pop(0), ro.pop(0)
                        dirs.append(y), stps.append(s), ro.append(1.0 / ys)
                        h_diag = ys / float(y @ y)
                    # two-loop recursion: d = -H g
                    q = -g
                    al = [0.0] * len(dirs)
                    for i in range(len(dirs) - 1, -1, -1):
                        al[i] = float(stps[i] @ q) * ro[i]
                        q = q - al[i] * dirs[i]
                    d = q * h_diag
                    for i in range(len(dirs)):
                        be = float(dirs[i] @ d) * ro[i]
                        d = d + (al[i] - be) * stps[i]
                g_prev = g.copy()
                loss_prev = loss
                t = min(1.0, 1.0 / float(np.sum(np.abs(g)))) * lr if state["n_iter"] == 1 \
                    else lr
                gtd = float(g @ d)
                if gtd > -tol_change:  # not a descent direction
                    break
                used = 0
                if group["line_search_fn"] == "strong_wolfe":
                    x0 = [p._data.copy() for p in self._params]

                    def evaluate(step_len, x0=x0, d=d):
                        self._add(step_len, d)
                        f_val = self._evaluate(closure)
                        grad = self._flat_grad()
                        self._set(x0)
                        return f_val, grad

                    loss, g, t, used = _strong_wolfe(evaluate, t, d, loss, g, gtd,
                                                     max_ls=max_eval - evals)
                    self._add(t, d)
                    done = np.max(np.abs(g)) <= tol_grad
                else:
                    self._add(t, d)
                    done = False
                    if n_iter != max_iter:
                        loss = self._evaluate(closure)
                        g = self._flat_grad()
                        done = np.max(np.abs(g)) <= tol_grad
                        used = 1
                evals += used
                state["func_evals"] += used
                if n_iter == max_iter or evals >= max_eval or done:
                    break
                if np.max(np.abs(d * t)) <= tol_change or abs(loss - loss_prev) < tol_change:
                    break
        state.update({"d": d, "t": t, "old_dirs": dirs, "old_stps": stps, "ro": ro,
                      "H_diag": h_diag, "prev_flat_grad": g_prev, "prev_loss": loss_prev})
        return first
