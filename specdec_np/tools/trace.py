"""A decoding run as one self-contained HTML page (`python -m specdec_np trace`, `make trace`).

Speculative decoding is easiest to understand by watching it: a tree drafted, scored by the target
in one pass, a path accepted by a lossless rule, the cache compacted, the text grown by a few
tokens. The page steps through a real run: per step the tree as a picture (who proposed each
node: the draft, stage 2's n-gram guess or its copy of a repeat), each node's q and p, every check
the verification rule made and why it accepted or rejected, the token the target added, the KV
cache before and after compaction, and the completion coloured by who produced each token (the
paper's Fig. 3).

The page shows what ran: its data is `generate(..., keep_trees=True)`'s own record of each step
(`record.Step` and its `Trace`, the record the statistics are computed from), not a
recomputation. It needs no network: the data, styles and script are inside the file, and it reads
without colour (shapes and text labels say the same as the colours). The page's markup, styles
and script are files of their own, trace_page/page.html, page.css and page.js (package data),
which `page` puts together.
"""

from __future__ import annotations

import dataclasses
import html
import json
from importlib import resources

import numpy as np

from .. import methods, verify
from ..files import atomic_file
from ..tokenizer import decode
from ..tree import COPY, DRAFT, NGRAM, SOURCES, path_key

# Why a draft pass fed a row (who proposed it, record.DraftPass): a tree node, fed to get its
# children; stage 2's trigram guess; stage 2's guess copied from a repeat. The root is "root".
ORIGIN = {DRAFT: "node", NGRAM: "guess", COPY: "copy"}
SHOWN = 4  # the residual table's rows: each distribution's most likely tokens, and the tokens tested


def residuals(trace) -> list:
    """Per node where a child was rejected by a ratio test: p, q and what they became after each
    rejection (p' = norm(max(p - q, 0)), and without replacement q' = q without the rejected token),
    recomputed with verify's own functions from the recorded rows, on the few tokens that matter.

    The page shows them because after a rejection the rule tests the next sibling, or draws the
    target's token, against p' and q', not against the p and q of the node's column; a test checks
    that the numbers here are the ones the rule's checks used."""
    tree, out = trace.tree, []
    for node, p in trace.p_rows.items():
        tested = [c for c in trace.checks if c.test == "ratio" and int(tree.parents[c.node]) == node]
        q = tree.draft_dists[node] if tree.draft_dists is not None else None
        stages = [(np.asarray(p, dtype=np.float64), q)]
        for c in tested:
            if c.accepted:
                break
            p_res, q_res = stages[-1]
            if trace.rule == "point_mass":  # the tried child's share is gone; the rest renormalised
                p_res = p_res.copy()
                p_res[c.token] = 0.0
                p_res = p_res / p_res.sum() if p_res.sum() > 0 else p_res
            else:
                p_res = verify.residual(p_res, q_res)
                if trace.rule == "recursive_wor":
                    q_res = verify.without(q_res, c.token)
            stages.append((p_res, q_res))
        tokens = [c.token for c in tested] + [c.token for c in trace.checks if c.test == "draw" and c.node == node]
        for dist in (d for stage in (stages[0], stages[-1]) for d in stage if d is not None):
            tokens += [int(t) for t in np.argsort(-dist, kind="stable")[:SHOWN]]
        tokens = list(dict.fromkeys(tokens))
        rows = lambda d: None if d is None else [float(d[t]) for t in tokens] + [float(max(0.0, 1.0 - d[tokens].sum()))]
        out.append({"node": node, "tested": [c.node for c in tested], "tokens": tokens,
                    "stages": [{"p": rows(pp), "q": rows(qq)} for pp, qq in stages]})
    return out


def passes(trace) -> tuple[list, list]:
    """The step's draft passes as the page's timeline draws them, and per tree node the pass that built
    it (None for the root and where no draft pass ran).

    A pass builds the children of the nodes it feeds: node i was built by the pass that fed its
    parent. A parent stage 2 guessed was fed ahead of time, in the same pass as the guess's own
    parent, so its children needed no pass of their own. Per pass: its rows (catch-up rows first),
    each fed row (its token, depth, where it came from, and the tree node it became, None when it
    did not end in the tree), and the tree nodes it built."""
    tree = trace.tree
    node_of = {path_key(tree.tokens, tree.parents, i): i for i in range(len(tree))}
    fed_in = {k: j for j, dp in enumerate(trace.passes) for k in dp.keys}
    built_by = [None] + [fed_in.get(path_key(tree.tokens, tree.parents, int(tree.parents[i])))
                         for i in range(1, len(tree))]
    out = []
    for j, dp in enumerate(trace.passes):
        fed = [{"token": int(k[-1]) if k else int(tree.tokens[0]), "depth": len(k),
                "origin": ORIGIN[origin] if k else "root", "node": node_of.get(k)}
               for k, origin in zip(dp.keys, dp.origins)]
        out.append({"rows": dp.rows, "catch_up": dp.rows - len(dp.keys), "fed": fed,
                    "built": [i for i in range(1, len(tree)) if built_by[i] == j]})
    return out, built_by


def step_record(step) -> dict:
    """One record.Step as plain JSON values (it must have been kept with keep_trees)."""
    t = step.trace
    timeline, built_by = passes(t)
    return {
        "tokens": step.tokens, "source": step.source, "target_block": step.target_block,
        "draft_blocks": step.draft_blocks, "ngram_queries": step.ngram_queries,
        "tree": {"tokens": t.tree.tokens.tolist(), "parents": t.tree.parents.tolist(), "q": t.tree.q.tolist(),
                 "kind": t.tree.kind},
        "proposers": t.tree.source.tolist(), "copied": t.copied, "p": t.p_nodes, "built_by": built_by,
        "passes": timeline,
        "path": t.path, "rule": t.rule, "checks": [dataclasses.asdict(c) for c in t.checks],
        "cache": list(t.cache), "residuals": residuals(t),
    }


def record(result, enc, prompt, method: str, about: str = "") -> dict:
    """The page's data: the run's steps as recorded, its totals, and the text of every token shown."""
    if any(s.trace is None for s in result.stats.steps):
        raise ValueError("a trace needs each step's tree: decode with generate(..., keep_trees=True)")
    stats, steps = result.stats, [step_record(s) for s in result.stats.steps]
    for step in steps:  # a step whose path was cut (only the last can be): why, for the page to say
        step["cut"] = result.stop_reason if len(step["tokens"]) < len(step["path"]) else None
    ids = set(prompt) | set(result.tokens)
    for step in steps:
        ids |= set(step["tree"]["tokens"]) | {c["token"] for c in step["checks"]}
        ids |= {c["value"] for c in step["checks"] if c["test"] == "argmax"}  # the target's argmax
        ids |= {t for r in step["residuals"] for t in r["tokens"]}
        ids |= {row["token"] for dp in step["passes"] for row in dp["fed"]}
    return {
        "method": method, "about": about, "sources": list(SOURCES),
        # What the page says of the method: staged (the draft with stage 2) or not.
        "staged": methods.runs_draft(method) and methods.needs_ngram(method),
        "prompt": [int(t) for t in prompt], "prompt_text": decode(enc, prompt),
        "tokens": result.tokens, "stop": result.stop_reason,
        "text": {str(t): decode(enc, [t]) for t in sorted(int(t) for t in ids)},
        "totals": {"tokens": len(result.tokens), "target_passes": stats.target_passes,
                   "tokens_per_pass": stats.tokens_per_pass, "draft_passes": stats.draft_passes,
                   "ngram_queries": stats.ngram_queries},
        "steps": steps,
    }


def page_file(name: str) -> str:
    """One of the page's files (trace_page/page.html, page.css, page.js), shipped as package data."""
    return resources.files(__package__).joinpath("trace_page", name).read_text(encoding="utf-8")


def page(data: dict) -> str:
    """The HTML page around `data`: page.html with page.css and page.js inlined (the page needs no
    other file), and the JSON in a script element, every `<` escaped so that no token's text can end it."""
    payload = json.dumps(data, ensure_ascii=False, default=lambda x: x.item()).replace("<", "\\u003c")
    title = html.escape(f"specdec_np trace: {data['method']}, {data['totals']['tokens']} tokens")
    template = page_file("page.html").replace("__STYLE__", page_file("page.css").rstrip("\n"))
    template = template.replace("__SCRIPT__", page_file("page.js").rstrip("\n")).replace("__TITLE__", title)
    return template.replace("__DATA__", payload)


def write(path, result, enc, prompt, method: str, about: str = "") -> dict:
    """Write the trace page of `result` (decoded with keep_trees=True) to `path`, atomically; returns the data."""
    data = record(result, enc, prompt, method, about)
    with atomic_file(path, "w") as f:
        f.write(page(data))
    return data
