"""The user's documentation runs as written: every ```python block of every docs/*.md page,
in order, in one namespace per page, in a temporary directory.

A block that must not run (it needs a cluster, or shows a script meant for `sampan launch`)
is preceded by the line `<!-- not run: REASON -->`; a page must keep at least one block
that runs. The README links every page and every page is in docs/."""
from __future__ import annotations

import os
import re

import pytest

import sampan

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
README = os.path.join(ROOT, "README.md")
SKIP = re.compile(r"<!-- not run: [^>]+-->\s*$")
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def pages():
    return sorted(f for f in os.listdir(DOCS) if f.endswith(".md"))


def blocks(path):
    """(first line number, code, runs) for each ```python block of the file at `path`."""
    text = open(path, encoding="utf-8").read()
    out = []
    for m in BLOCK.finditer(text):
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        line = text.count("\n", 0, m.start(1)) + 1
        out.append((line, m.group(1), not SKIP.match(before)))
    return out


def run_page(path, ns=None):
    """Execute the page's runnable blocks; tracebacks name the page and its own lines."""
    ns = {"__name__": "__docs__"} if ns is None else ns
    for line, code, runs in blocks(path):
        if runs:
            exec(compile("\n" * (line - 1) + code, path, "exec"), ns)
    return ns


@pytest.mark.parametrize("page", pages())
def test_page_examples_run(page, tmp_path, monkeypatch):
    path = os.path.join(DOCS, page)
    found = blocks(path)
    assert any(runs for _, _, runs in found), f"{page} has no runnable ```python example"
    monkeypatch.chdir(tmp_path)
    sampan.manual_seed(0)
    run_page(path)


def _anchors(path):
    """GitHub's anchors for the headings of a markdown file."""
    text = re.sub(r"^```.*?^```", "", open(path, encoding="utf-8").read(), flags=re.S | re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.*)$", text, re.M)}


def test_readme_links_every_page_and_every_link_exists():
    text = open(README, encoding="utf-8").read()
    linked = set(re.findall(r"\]\((docs/[^)#]+\.md)", text))
    assert linked == {f"docs/{p}" for p in pages()}, linked ^ {f"docs/{p}" for p in pages()}
    sources = [os.path.join(DOCS, p) for p in pages()] + [
        README, os.path.join(ROOT, "benchmarks", "RESULTS.md")]
    for src in sources:
        body = open(src, encoding="utf-8").read()
        for target, anchor in re.findall(r"\]\(([^)#:]+)(?:#([^)]*))?\)", body):
            path = os.path.normpath(os.path.join(os.path.dirname(src), target))
            assert os.path.exists(path), f"{src} links to missing {target}"
            if anchor:
                assert anchor in _anchors(path), f"{src}: no heading #{anchor} in {target}"


def test_readme_opens_with_the_two_commands():
    lines = [ln for ln in open(README, encoding="utf-8").read().splitlines() if ln.strip()]
    assert lines[0].startswith("# ") and lines[1] == "```"
    assert lines[2].startswith("make demo") and lines[3].startswith("make test")


def test_every_public_subsystem_is_reachable_from_the_readme():
    """What a new user looks for is named in the README and documented in a page."""
    readme = open(README, encoding="utf-8").read()
    docs = "".join(open(os.path.join(DOCS, p), encoding="utf-8").read() for p in pages())
    for name in ("sampan.quant", "sampan.prune", "sampan deploy", "sampan.models", "sampan.amp",
                 "sampan.jit", "sampan.inference", "sampan serve", "sampan.distributed",
                 "sampan.rec", "sampan.profiler", "sampan.onnx", "sampan.backends",
                 "sampan.passes", "sampan.train", "sampan.data", "sampan.experimental",
                 "sampan.ir"):
        assert name in readme, f"README does not name {name}"
        assert name in docs, f"no docs page shows {name}"
    for name in ("sampan.linalg", "sampan.utils.data", "sampan.nn", "sampan.optim"):
        assert name in docs, f"no docs page shows {name}"


def test_headings_name_features_not_issue_numbers():
    for path in [README, os.path.join(ROOT, "benchmarks", "RESULTS.md")] + [
            os.path.join(DOCS, p) for p in pages()]:
        text = re.sub(r"^```.*?^```", "", open(path, encoding="utf-8").read(), flags=re.S | re.M)
        for ln in text.splitlines():
            if ln.startswith("#"):
                assert not re.search(r"issue\s*\d", ln, re.I), f"{path}: {ln}"
