#!/usr/bin/env python
"""Render a sampan Chrome trace (``prof.export_chrome_trace``) as a PNG Gantt chart: one
lane per (thread, category), the busiest lanes on top, spans coloured by category, and
the live-memory counter underneath. Used for the README's picture of a training epoch.

    python tools/trace_png.py out/trace.json docs/trace.png --lanes 8 --window 0:400

Needs matplotlib, which sampan does not depend on: install it for this tool only
(``pip install matplotlib`` in any environment; the tool reads JSON and imports nothing
from sampan). ``--window START:END`` (ms from the trace's start) zooms in; without it
the whole trace is drawn."""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

COLOURS = {"op": "#4C72B0", "backward": "#DD8452", "kernel": "#55A868", "jit": "#C44E52",
           "optim": "#8172B3", "data": "#937860", "rec": "#DA8BC3", "collective": "#8C8C8C",
           "user": "#CCB974"}
CAT_ORDER = ("user", "data", "op", "backward", "optim", "kernel", "jit", "rec", "collective")


def load(path):
    """(spans, memory samples, thread names) from a Chrome trace JSON file."""
    with open(path) as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    names, spans, mem = {}, [], []
    for e in events:
        ph = e.get("ph")
        if ph == "M" and e.get("name") == "thread_name":
            names[e["tid"]] = e["args"]["name"]
        elif ph == "X":
            spans.append((e["tid"], e.get("cat", "?"), e["name"], float(e["ts"]) / 1e3,
                          float(e.get("dur", 0)) / 1e3))
        elif ph == "C" and "bytes_live" in e.get("args", {}):
            mem.append((float(e["ts"]) / 1e3, e["args"]["bytes_live"]))
    return spans, sorted(mem), names


def _union(bars):
    total, end = 0.0, float("-inf")
    for ts, dur in sorted(bars):
        if ts + dur > end:
            total += ts + dur - max(ts, end)
            end = ts + dur
    return total


def lanes(spans, n_lanes):
    """The `n_lanes` (tid, cat) lanes with the most busy time (nested spans counted once),
    in display order (by thread, then category order); and each lane's busy ms."""
    bars = defaultdict(list)
    for tid, cat, _, ts, dur in spans:
        bars[(tid, cat)].append((ts, dur))
    busy = {k: _union(v) for k, v in bars.items()}
    top = sorted(busy, key=lambda k: -busy[k])[:n_lanes]
    tids = []
    for tid, _ in top:
        if tid not in tids:
            tids.append(tid)

    def order(k):
        c = CAT_ORDER.index(k[1]) if k[1] in CAT_ORDER else len(CAT_ORDER)
        return tids.index(k[0]), c
    return sorted(top, key=order), busy


def render(trace, png, n_lanes=8, window=None, title=None, width=11.0):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    spans, mem, names = load(trace)
    if not spans:
        raise SystemExit(f"{trace}: no spans to draw")
    if window is not None:       # clipped to the window, so lane totals are the window's
        lo, hi = window
        spans = [(t, c, n, max(ts, lo), min(ts + d, hi) - max(ts, lo))
                 for t, c, n, ts, d in spans if ts + d >= lo and ts <= hi]
        before = [m for m in mem if m[0] < lo]
        mem = ([(lo, before[-1][1])] if before else []) + [m for m in mem if lo <= m[0] <= hi]
    keep, busy = lanes(spans, n_lanes)
    row = {k: i for i, k in enumerate(keep)}
    fig, (ax, axm) = plt.subplots(2, 1, figsize=(width, 0.45 * len(keep) + 2.2), sharex=True,
                                  gridspec_kw={"height_ratios": [max(len(keep), 1), 1.6]})
    per_lane = defaultdict(list)
    lo_t = min(s[3] for s in spans) if window is None else window[0]
    hi_t = max(s[3] + s[4] for s in spans) if window is None else window[1]
    least = (hi_t - lo_t) / (width * 110)     # a span narrower than a pixel gets one pixel
    for tid, cat, _, ts, dur in spans:
        if (tid, cat) in row:
            per_lane[(tid, cat)].append((ts, max(dur, least)))
    for k, bars in per_lane.items():
        ax.broken_barh(bars, (row[k] - 0.4, 0.8), facecolors=COLOURS.get(k[1], "#999999"),
                       edgecolor="none")
    labels = [f"{names.get(t, t)} · {c}  ({busy[(t, c)]:.0f} ms)" for t, c in keep]
    ax.set_yticks(range(len(keep)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.grid(axis="x", alpha=0.3)
    cats = sorted({c for _, c in keep}, key=lambda c: CAT_ORDER.index(c)
                  if c in CAT_ORDER else 99)
    ax.legend(handles=[Patch(color=COLOURS.get(c, "#999999"), label=c) for c in cats],
              loc="upper right", fontsize=8, ncol=len(cats), framealpha=0.9)
    ax.set_title(title or f"{trace}: top {len(keep)} lanes", fontsize=10)
    if mem:
        xs, ys = zip(*mem)
        axm.step(xs, [y / 2 ** 20 for y in ys], where="post", color="#333333", lw=0.8)
        axm.fill_between(xs, [y / 2 ** 20 for y in ys], step="post", alpha=0.2,
                         color="#333333")
    axm.set_ylabel("live MiB", fontsize=8)
    axm.set_xlabel("ms since the profile started", fontsize=8)
    axm.grid(alpha=0.3)
    if window is not None:
        axm.set_xlim(*window)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", help="a Chrome trace JSON written by sampan.profiler")
    ap.add_argument("png", help="the PNG to write")
    ap.add_argument("--lanes", type=int, default=8, help="how many lanes to draw")
    ap.add_argument("--window", help="START:END in ms from the trace's start")
    ap.add_argument("--title")
    a = ap.parse_args(argv)
    window = None
    if a.window:
        lo, _, hi = a.window.partition(":")
        window = (float(lo), float(hi))
    print(render(a.trace, a.png, a.lanes, window, a.title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
