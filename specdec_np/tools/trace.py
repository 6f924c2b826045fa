"""A decoding run as one self-contained HTML page (`python -m specdec_np trace`, `make trace`).

Per step the page shows the tree (who proposed each node), each node's q and p, every check the rule made and why,
the target's token, the KV cache before and after compaction, and the completion coloured by who produced each token
(the paper's Fig. 3), from the loop's own record (`generate(..., keep_trees=True)`). Its markup, styles and script
are package data (trace_page/), inlined by `page`: it needs no network.
"""

from __future__ import annotations

import dataclasses
import html
import json
from pathlib import Path

import numpy as np

from .. import verify
from ..methods import METHODS
from ..files import atomic_file, read_text
from ..tokenizer import decode
from ..tree import COPY, DRAFT, NGRAM, SOURCES, path_key
from .costcurve import bends, block_cost_ms
from .machine import busy, machine_name

# Why a draft pass fed a row (record.DraftPass): a tree node; stage 2's trigram guess; its copy of a repeat.
ORIGIN = {DRAFT: "node", NGRAM: "guess", COPY: "copy"}
COST_ROUNDS = 7  # timings of each pass size for the page's costs
MAX_COSTED = 64  # rows: larger passes (a long prompt's prefill) are not timed for the page, which shows no cost
SHOWN = 4  # the residual table's rows: each distribution's most likely tokens, and the tokens tested


def residuals(trace) -> list:
    """Per node with a child tested by a ratio: p, q and what each rejection made of them (by verify's own
    functions), on the few tokens that matter: the next sibling is tested against p' and q', not p and q."""
    tree, out = trace.tree, []
    for node, p in trace.p_rows.items():
        tested = [c for c in trace.checks if c.test == "ratio" and int(tree.parents[c.node]) == node]
        q = tree.draft_dists[node] if tree.draft_dists is not None else None
        stages = [(np.asarray(p, dtype=np.float64), q)]
        for c in tested:
            if c.accepted:
                break
            p_res, q_res = stages[-1]
            if trace.rule == "point_mass":  # the tried child's share is gone, the rest renormalised
                p_res = verify.without(p_res, c.token)
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
    """(the step's draft passes: rows, each fed row's token, depth, origin and node, the nodes it built;
    per node the pass that built it, the one that fed its parent (a guess is fed in its parent's pass))."""
    tree = trace.tree
    node_of = {path_key(tree.tokens, tree.parents, i): i for i in range(len(tree))}
    fed_in = {k: j for j, dp in enumerate(trace.passes) for k in dp.keys}
    built_by = [None] + [fed_in.get(path_key(tree.tokens, tree.parents, int(tree.parents[i])))
                         for i in range(1, len(tree))]
    out = []
    for j, dp in enumerate(trace.passes):
        fed = [{"token": int(k[-1]) if k else int(tree.tokens[0]), "depth": len(k),
                "origin": ORIGIN[origin] if k else "root", "node": node_of.get(k)}
               for k, origin in zip(dp.keys, dp.source)]
        out.append({"rows": dp.rows, "catch_up": dp.rows - len(dp.keys), "fed": fed,
                    "built": [i for i in range(1, len(tree)) if built_by[i] == j]})
    return out, built_by


def step_record(step) -> dict:
    """One record.Step as plain JSON values (it must have been kept with keep_trees)."""
    t = step.trace
    timeline, built_by = passes(t)
    return {"tokens": step.tokens, "source": step.source, "target_block": step.target_block,
            "draft_blocks": step.draft_blocks, "ngram_queries": step.ngram_queries,
            "tree": {"tokens": t.tree.tokens.tolist(), "parents": t.tree.parents.tolist(), "q": t.tree.q.tolist(),
                     "kind": t.tree.kind},
            "proposers": t.tree.source.tolist(), "copied": t.copied, "p": t.p_nodes, "built_by": built_by,
            "passes": timeline, "path": t.path, "rule": t.rule, "checks": [dataclasses.asdict(c) for c in t.checks],
            "cache": list(t.cache), "residuals": residuals(t)}


def pass_costs(target, draft, result, prompt) -> dict:
    """What each pass of `result` costs on this machine now (the fastest of each size's rounds), in one-token passes
    of the same model: {"target": {rows: ratio}, "draft": ..., "machine", "busy", "bent": {"target": bends, ...}}."""
    costs = {"machine": machine_name(), "busy": busy(0.1), "bent": {}}
    for name, model, blocks in (("target", target, [s.target_block for s in result.stats.steps]),
                                ("draft", draft, [k for s in result.stats.steps for k in s.draft_blocks])):
        largest = min(MAX_COSTED, model.config.n_ctx - len(prompt)) if model is not None else 0  # not the prefill
        sizes = sorted({1} | {k for k in blocks if k <= largest}) if model is not None and blocks else []
        ms = block_cost_ms(model, sizes, len(prompt), COST_ROUNDS, summary=np.min) if sizes else {}
        costs[name], costs["bent"][name] = {k: ms[k] / ms[1] for k in sizes}, bends(ms)
    return costs


def record(result, enc, prompt, method: str, about: str = "", costs: dict | None = None) -> dict:
    """The page's data: the run's steps as recorded, its totals, each shown token's text, the passes' `costs`."""
    if any(s.trace is None for s in result.stats.steps):
        raise ValueError("a trace needs each step's tree: decode with generate(..., keep_trees=True)")
    stats, steps = result.stats, [step_record(s) for s in result.stats.steps]
    ids = set(prompt) | set(result.tokens)  # the tokens whose text the page shows
    for step in steps:
        step["cut"] = result.stop_reason if len(step["tokens"]) < len(step["path"]) else None  # why a path was cut
        ids |= set(step["tree"]["tokens"]) | {c["token"] for c in step["checks"]}
        ids |= {c["value"] for c in step["checks"] if c["test"] == "argmax"}  # the target's argmax
        ids |= {t for r in step["residuals"] for t in r["tokens"]}
        ids |= {row["token"] for dp in step["passes"] for row in dp["fed"]}
    return {"method": method, "about": about, "sources": list(SOURCES),
            "staged": METHODS[method].needs_ngram and METHODS[method].drafts_with == "draft",  # the draft, staged or not
            "proposer": METHODS[method].drafts_with or "draft",  # who drafts: EAGLE's head, or the draft
            "prompt": [int(t) for t in prompt], "prompt_text": decode(enc, prompt),
            "tokens": result.tokens, "stop": result.stop_reason,
            "text": {str(t): decode(enc, [t]) for t in sorted(int(t) for t in ids)},
            "totals": {"tokens": len(result.tokens), "target_passes": stats.target_passes,
                       "tokens_per_pass": stats.tokens_per_pass, "draft_passes": stats.draft_passes,
                       "ngram_queries": stats.ngram_queries, "parts": stats.parts},
            "steps": steps, "costs": json.loads(json.dumps(costs))}  # as the page reads them: sizes as strings


def page_file(name: str) -> str:
    """One of the page's files (trace_page/page.html, page.css, page.js), shipped as package data."""
    return read_text(Path(__file__).parent / "trace_page" / name, limit=1 << 20)


def page(data: dict) -> str:
    """The HTML page around `data`: its files inlined, the JSON in a script element with every `<` escaped."""
    payload = json.dumps(data, ensure_ascii=False, default=lambda x: x.item()).replace("<", "\\u003c")
    title = html.escape(f"specdec_np trace: {data['method']}, {data['totals']['tokens']} tokens")
    template = page_file("page.html").replace("__STYLE__", page_file("page.css").rstrip("\n"))
    template = template.replace("__SCRIPT__", page_file("page.js").rstrip("\n")).replace("__TITLE__", title)
    return template.replace("__DATA__", payload)


def write(path, result, enc, prompt, method: str, about: str = "", costs: dict | None = None) -> None:
    """Write the trace page of `result` (decoded with keep_trees=True) to `path`, atomically."""
    with atomic_file(path, "w") as f:
        f.write(page(record(result, enc, prompt, method, about, costs)))

