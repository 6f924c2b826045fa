"""The trace page shows the run it claims to: its steps are the decode loop's own record, and replayed
(each step's checks -> its accepted path and added token) they give exactly the emitted tokens and
the reported statistics, greedy and sampled. The page parses, embeds every step and references
nothing outside itself; `python -m specdec_np trace` writes it."""

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from specdec_np.decode import generate
from specdec_np.plan import Plan
from specdec_np.tokenizer import encode
from specdec_np.tools import trace
from specdec_np.tools.cli import main
from specdec_np.tools.demo import PROMPT
from specdec_np.tree import COPY, NGRAM, SOURCES, TARGET

ROOT = Path(__file__).resolve().parents[2]
N_NEW = 24
RUNS = {
    "greedy": dict(),
    "sampled": dict(temperature=1.0, top_k=50, seed=1, plan=Plan(shape="fixed", widths=(2, 2, 1), sampled="without")),
}


@pytest.fixture(scope="module", params=list(RUNS))
def run(request, embedded):
    """(Result, the page's data, the page) of a short staged run on the demo's prompt, with its passes' costs
    as the command line measures them."""
    target, draft, ngram, enc = embedded
    prompt = encode(enc, PROMPT)
    res = generate(target, prompt, N_NEW, "staged", draft, ngram, keep_trees=True, **RUNS[request.param])
    data = trace.record(res, enc, prompt, "staged", request.param, trace.pass_costs(target, draft, res, prompt))
    return res, data, trace.page(data)


class Page(HTMLParser):
    """What a test needs of the page: every start tag with its attributes, and each element's text."""

    def __init__(self, text):
        super().__init__()
        self.tags, self.text, self.stack = [], {}, []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self.stack.append(len(self.tags) - 1)

    def handle_endtag(self, tag):
        if self.stack and self.tags[self.stack[-1]][0] == tag:
            self.stack.pop()

    def handle_data(self, data):
        if self.stack:
            self.text[self.stack[-1]] = self.text.get(self.stack[-1], "") + data

    def contents(self, tag, **attrs):
        return [self.text.get(i, "") for i, (t, a) in enumerate(self.tags)
                if t == tag and all(a.get(k) == v for k, v in attrs.items())]


def embedded_data(html):
    (payload,) = Page(html).contents("script", type="application/json", id="trace-data")
    return json.loads(payload)


NODE = shutil.which("node") or shutil.which("nodejs")
# The page's script run by Node.js against a stand-in for the few DOM calls it makes: what each step
# shows (the summary, the tree's SVG, the checks, the residual tables, the cache) as the browser
# would get it, without a browser (CI has none).
HARNESS = r"""
const els = {};
const el = id => els[id] || (els[id] = {id, textContent: "", innerHTML: "", value: 0, disabled: false, max: 0,
  classList: {toggle() {}}, querySelector() { return null; }, scrollTop: 0, clientHeight: 0});
globalThis.document = {getElementById: el, addEventListener() {}, body: {classList: {toggle() {}}}};
globalThis.location = {hash: ""};
globalThis.history = {replaceState() {}};
el("trace-data").textContent = require("fs").readFileSync(process.argv[2], "utf8");
__SCRIPT__
const opened = current;  // the step the page opened on
const shown = D.steps.map((_, k) => {
  show(k);
  return Object.fromEntries(["summary", "tree", "passes", "mask", "rule-head", "rule", "checks", "residual", "cache",
                             "totals", "text", "legend", "passes-head", "marks-key"].map(id =>
    [id, el(id).innerHTML || el(id).textContent]));
});
console.log(JSON.stringify(shown));
"""


def rendered(html, tmp_path):
    """Per step, what the page's script puts in each of its sections (skipped without Node.js)."""
    if NODE is None:
        pytest.skip("needs Node.js to run the page's script")
    script = next(s for s in Page(html).contents("script", type=None) if s.strip())
    (tmp_path / "data.json").write_text(json.dumps(embedded_data(html)), encoding="utf-8")
    (tmp_path / "run.js").write_text(HARNESS.replace("__SCRIPT__", script), encoding="utf-8")
    r = subprocess.run([NODE, str(tmp_path / "run.js"), str(tmp_path / "data.json")], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def replay(step):
    """A recorded step's accepted path and emitted tokens, from its checks alone: the nodes the rule
    accepted, in order, then the token of its final draw."""
    tree = step["tree"]
    *tests, draw = step["checks"]
    assert draw["test"] == "draw"
    path = [0] + [c["node"] for c in tests if c["accepted"]]
    assert all(tree["parents"][b] == a for a, b in zip(path, path[1:])), "accepted nodes must form a path"
    assert draw["node"] == path[-1]
    return path, [tree["tokens"][i] for i in path[1:]] + [draw["token"]]


def test_page_data_is_the_decode_loops_record(run):
    res, data, html = run
    assert embedded_data(html) == json.loads(json.dumps(data))  # the page embeds exactly this
    assert len(data["steps"]) == len(res.stats.steps) > 3
    for rec, step in zip(data["steps"], res.stats.steps):
        t = step.trace
        assert rec["checks"] == [dataclasses.asdict(c) for c in t.checks]
        assert rec["path"] == t.path and rec["tokens"] == step.tokens and rec["rule"] == t.rule
        assert rec["tree"]["tokens"] == t.tree.tokens.tolist()


def test_replayed_steps_give_the_tokens_and_the_statistics(run):
    res, _, html = run
    data = embedded_data(html)
    tokens, seq = [], list(data["prompt"])
    for step in data["steps"]:
        path, emitted = replay(step)
        assert path == step["path"]
        assert step["tokens"] == emitted[:len(step["tokens"])]  # cut only by max_new_tokens or end-of-text
        # Who proposed each emitted token: the accepted nodes' proposers, then the target.
        assert step["source"] == ([step["proposers"][i] for i in path[1:]] + [TARGET])[:len(step["tokens"])]
        # The cache: the root (the last emitted token) is the block's first tree row, and compaction
        # keeps the catch-up rows and the accepted path.
        start, n_c, after = step["cache"]
        assert start + n_c == len(seq) - 1 and step["tree"]["tokens"][0] == seq[-1]
        assert after == start + n_c + len(path)
        assert step["target_block"] == n_c + len(step["tree"]["tokens"])
        tokens += step["tokens"]
        seq += step["tokens"]
    s, totals, steps = res.stats, data["totals"], data["steps"]
    assert tokens == res.tokens == data["tokens"] and len(tokens) == N_NEW
    assert totals == {"tokens": N_NEW, "target_passes": s.target_passes, "tokens_per_pass": s.tokens_per_pass,
                      "draft_passes": s.draft_passes, "ngram_queries": s.ngram_queries, "parts": s.parts}
    assert sum(totals["parts"].values()) == N_NEW and totals["parts"]["target"] <= s.target_passes
    assert len(steps) == s.target_passes and len(tokens) / len(steps) == s.tokens_per_pass
    assert sum(len(step["draft_blocks"]) for step in steps) == s.draft_passes > 0
    assert sum(step["ngram_queries"] for step in steps) == s.ngram_queries > 0


def test_the_runs_show_what_the_page_explains(run):
    """Each run exercises what the page draws: drafted and stage 2 nodes, rejections, and for
    sampled rules the acceptance probability and the uniform draw."""
    res, data, _ = run
    proposers = {p for step in data["steps"] for p in step["proposers"][1:]}
    checks = [c for step in data["steps"] for c in step["checks"]]
    assert SOURCES.index("draft") in proposers and {NGRAM, COPY} & proposers  # stage 2's guesses or copies
    assert any(not c["accepted"] for c in checks if c["test"] != "draw")
    if res.stats.steps[0].trace.rule == "greedy":
        assert any(step["copied"] for step in data["steps"])
        assert all(c["value"] == c["token"] for c in checks if c["test"] == "argmax" and c["accepted"])
    else:
        ratios = [c for c in checks if c["test"] == "ratio"]
        assert ratios and all(c["accepted"] == (c["u"] is None and c["value"] >= 1 or c["u"] is not None and
                                                c["u"] < c["value"]) for c in ratios)
        assert any(c["u"] is not None for c in ratios)


def test_keeping_the_record_changes_nothing(embedded):
    target, draft, ngram, enc = embedded
    prompt = encode(enc, PROMPT)
    kw = RUNS["sampled"]
    kept = generate(target, prompt, N_NEW, "staged", draft, ngram, keep_trees=True, **kw)
    plain = generate(target, prompt, N_NEW, "staged", draft, ngram, **kw)
    assert kept.tokens == plain.tokens and kept.stats.source == plain.stats.source
    assert [s.draft_blocks for s in kept.stats.steps] == [s.draft_blocks for s in plain.stats.steps]
    assert all(s.trace is None for s in plain.stats.steps) and all(s.trace for s in kept.stats.steps)
    with pytest.raises(ValueError, match="keep_trees"):
        trace.record(plain, enc, prompt, "staged")


def test_page_is_self_contained(run):
    _, _, html = run
    page = Page(html)
    assert html.startswith("<!doctype html>") and page.contents("title")
    for tag, attrs in page.tags:
        assert tag not in ("link", "iframe", "img", "object", "embed", "base"), tag
        for name in ("src", "href", "action", "xlink:href"):
            assert name not in attrs or attrs[name].startswith("#"), (tag, name, attrs[name])
    styles = page.contents("style") + [a["style"] for _, a in page.tags if "style" in a]
    scripts = page.contents("script", type=None)
    assert styles and scripts
    for css in styles:
        assert "@import" not in css and "url(" not in css and "http" not in css
    for js in scripts:
        assert not any(word in js for word in ("fetch(", "XMLHttpRequest", "import(", "http:", "https:", ".src"))


def test_token_text_cannot_break_out_of_the_data():
    data = {"method": "x", "totals": {"tokens": 0}, "text": {"1": "</script><script>alert(1)</script><!--"}}
    html = trace.page(data)
    assert embedded_data(html) == data
    assert sum(tag == "script" for tag, _ in Page(html).tags) == 2


def test_cli_writes_the_page(tmp_path):
    out = tmp_path / "trace.html"
    env = dict(os.environ, NO_COLOR="1", OPENBLAS_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "specdec_np", "trace", "def add(a, b):", "--method", "staged",
                        "--plan", "default", "--max-new-tokens", "12", "--out", str(out)],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    data = embedded_data(out.read_text(encoding="utf-8"))
    assert data["totals"]["tokens"] == sum(len(s["tokens"]) for s in data["steps"]) == 12
    assert data["method"] == "staged" and "the constant plan" in data["about"]
    assert str(out) in r.stderr


@pytest.mark.parametrize("args, needle", [
    (["--out", "no/such/dir/trace.html"], "--out"),
    (["--out", "."], "--out"),
    (["--top-k", "0", "--temperature", "1"], "--top-k"),
    (["--method", "tree", "--copy-len", "3"], "--copy-len"),
])
def test_cli_errors_in_one_line(args, needle, capsys):
    assert main(["trace", "def add(a, b):", "--plan", "default", "--max-new-tokens", "4", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and needle in err[0]


@pytest.fixture(scope="module")
def shown(run, tmp_path_factory):
    return rendered(run[2], tmp_path_factory.mktemp("page"))


def svg_sizes(svg):
    """(width attribute, viewBox width, every font-size) of a rendered tree."""
    (tag, attrs), *_ = Page(svg).tags
    assert tag == "svg"
    return float(attrs["width"]), float(attrs["viewbox"].split()[2]), [float(a["font-size"]) for _, a in
                                                                      Page(svg).tags if "font-size" in a]


def test_the_tree_keeps_a_readable_size(run, shown):
    """A long chain makes the picture wider, to scroll, never smaller: no style scales the tree down
    to the column (a 16-token chain had 6 px text), every text is at least 12 px and each node's token
    16 px (issue 59: 10 px labels were too small to read at 1280 px), and a deeper tree is a wider picture."""
    _, data, html = run
    css = "".join(Page(html).contents("style"))
    assert "max-width: 100%" not in css and "svg.fit" not in css
    widths = {}
    for step, s in zip(data["steps"], shown):
        width, view, fonts = svg_sizes(s["tree"])
        assert width == view <= 1280 and min(fonts) >= 12
        assert fonts.count(16) == len(step["tree"]["tokens"]) + 1  # each node's token, and the target's
        depth = max(len(trace_path(step["tree"]["parents"], i)) for i in range(len(step["tree"]["parents"])))
        widths.setdefault(depth, width)
    assert len(widths) > 1
    deep, shallow = max(widths), min(widths)
    assert widths[deep] > widths[shallow]


def trace_path(parents, i):
    return [i] if i == 0 else trace_path(parents, parents[i]) + [i]


def cut_run(embedded, tmp_path, why):
    """A greedy run cut inside a step that would emit at least 3 tokens, before its last drafted
    token: by max_new_tokens, or by an end-of-text (calling one of its tokens, not emitted before,
    the end-of-text). Returns (the cut step's data, the uncut step, what the page shows of it, the
    tokens it emitted)."""
    target, draft, ngram, enc = embedded
    prompt = encode(enc, PROMPT)
    full = generate(target, prompt, N_NEW, "staged", draft, ngram, keep_trees=True)
    starts = np.cumsum([0] + [len(s.tokens) for s in full.stats.steps])
    k, j = next((k, j) for k, s in enumerate(full.stats.steps) for j in range(len(s.tokens) - 2)
                if why == "max_new_tokens" or s.tokens[j] not in full.tokens[:starts[k] + j])
    kw = dict(max_new_tokens=int(starts[k]) + j + 1, eos=None) if why == "max_new_tokens" else \
        dict(max_new_tokens=N_NEW, eos=full.stats.steps[k].tokens[j])
    res = generate(target, prompt, kw.pop("max_new_tokens"), "staged", draft, ngram, keep_trees=True, **kw)
    assert res.stop_reason == why and len(res.stats.steps) == k + 1
    html = trace.page(trace.record(res, enc, prompt, "staged"))
    return embedded_data(html)["steps"][k], full.stats.steps[k], rendered(html, tmp_path)[k], j + 1


@pytest.mark.parametrize("why, says", [("max_new_tokens", "--max-new-tokens"), ("eos", "end-of-text")])
def test_a_cut_step_says_what_was_cut_and_why(embedded, tmp_path, why, says):
    step, uncut, s, emitted = cut_run(embedded, tmp_path, why)
    made = len(uncut.tokens)
    assert step["cut"] == why and len(step["tokens"]) == emitted and step["path"] == uncut.trace.path
    assert f"+ 1 from the target = {made} tokens, of which {emitted} emitted: " in s["summary"]
    assert says in s["summary"] and f"last {made - emitted} tokens" in s["summary"]
    marks = [a["data-state"] for _, a in Page(s["tree"]).tags if "data-state" in a]
    # The path's nodes after the cut and the target's token are marked cut, not accepted.
    assert marks.count("cut") == made - emitted
    assert marks.count("yes") == emitted == len(uncut.trace.path) - 1 - (made - emitted - 1)
    assert s["checks"].count("cut \u2702") == made - emitted - 1 and says in s["checks"]


def test_after_a_rejection_the_residual_is_shown_as_the_rule_used_it(run, shown):
    """The residual tables hold the p' and q' the rule's checks compared (and the p' its final draw
    came from), and the checks after a rejection are labelled p' and q'."""
    res, data, _ = run
    tables = [(step, r, s) for step, s in zip(data["steps"], shown) for r in step["residuals"]]
    if res.stats.steps[0].trace.rule == "greedy":
        assert not tables  # greedy never rejects by a ratio: there is no residual
        return
    assert any(len(r["stages"]) > 2 for _, r, _ in tables), "the run should reject two siblings in a row"
    for step, r, s in tables:
        checks = {c["node"]: c for c in step["checks"] if c["test"] == "ratio"}
        for k, child in enumerate(r["tested"]):
            c, stage = checks[child], r["stages"][k]
            j = r["tokens"].index(c["token"])
            assert c["p"] == pytest.approx(stage["p"][j], abs=1e-12)
            if stage["q"] is not None and step["rule"] != "point_mass":
                assert c["q"] == pytest.approx(stage["q"][j], abs=1e-12)
            if k and step["rule"] != "point_mass":
                assert "p'/q'" in s["checks"] and "residual p'" in s["checks"]
        draw = step["checks"][-1]
        if draw["node"] == r["node"] and not draw["accepted"]:
            last = r["stages"][-1]["p"]
            assert draw["value"] == pytest.approx(last[r["tokens"].index(draw["token"])], abs=1e-9)
        for stage in r["stages"]:
            assert sum(stage["p"]) == pytest.approx(1.0, abs=1e-9)
        # The heading names the rejected nodes (issue 59: it named their parent as if it were rejected).
        rejected = [c for c in r["tested"] if not checks[c]["accepted"]]
        assert rejected == r["tested"][:len(r["stages"]) - 1] and rejected
        whose = f"nodes {' and '.join(f'#{c}' for c in rejected)}" if len(rejected) > 1 else f"node #{rejected[0]}"
        kin = "children" if len(rejected) > 1 else "a child"
        assert f"After the rejection of {whose} ({kin} of #{r['node']})" in s["residual"] and "p'" in s["residual"]
    assert all(not step["residuals"] or s["residual"] for step, s in zip(data["steps"], shown))


def test_first_step_names_the_prompts_prefill_and_copies_name_the_point_mass_rule(run, shown):
    _, data, _ = run
    assert "the prompt's prefill" in shown[0]["cache"] and "catch-up rows" not in shown[0]["cache"]
    assert all("prefill" not in s["cache"] for s in shown[1:])
    for step, s in zip(data["steps"], shown):
        if step["rule"] == "point_mass":
            assert ("copy of a repeat" in s["rule"]) == step["copied"]
            assert ("draft's top tokens" in s["rule"]) == (not step["copied"])


def test_readme_caption_matches_the_run_of_make_trace_png(tmp_path):
    """docs/trace.png is `make trace-png`: step PNG_STEP of a run of PNG_ARGS (both in the Makefile).
    Regenerating it needs Chromium, which CI lacks; this checks the README's caption (its step, the
    run's steps and tokens, how it ended) against a run of those same arguments. The README's
    sampled trace command is that run, and it shows the acceptance probability at work: a ratio
    test with 0 < min(1, p/q) < 1. The picture's step shows the draft's passes and the mask."""
    make = (ROOT / "Makefile").read_text(encoding="utf-8")
    args = re.search(r"^PNG_ARGS = (.+)$", make, re.M).group(1).split()
    shot = int(re.search(r"^PNG_STEP = (\d+)$", make, re.M).group(1))
    assert "make trace-png" in (ROOT / "README.md").read_text(encoding="utf-8")
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").replace("\\\n", " ").split())
    sampled = re.search(r'make trace TRACE_ARGS="([^"]+)"', readme)
    assert sampled and sampled[1].split() == args, "the README's sampled trace command is make trace-png's run"
    for pinned in ("--plan default", "--sampled without", "--widths 2,2,1", "--temperature 1", "--top-k 50",
                   "--seed 1"):
        assert f" {pinned} " in f" {sampled[1]} ", pinned
    m = re.search(r"Step (\d+) of (\d+) of a sampled staged run on the demo's prompt \((\d+) tokens, ended by "
                  r"(an end-of-text|--max-new-tokens)\), as `make trace-png` renders it", readme)
    assert m, "the README's caption of docs/trace.png"
    out = tmp_path / "trace.html"
    assert main(["trace", PROMPT, *args, "--out", str(out)]) == 0
    data = embedded_data(out.read_text(encoding="utf-8"))
    ended = {"eos": "an end-of-text", "max_new_tokens": "--max-new-tokens"}[data["stop"]]
    assert (int(m[1]), int(m[2]), int(m[3]), m[4]) == (shot, len(data["steps"]), data["totals"]["tokens"], ended)
    step = data["steps"][shot - 1]
    assert step["residuals"], "the picture's step should show a residual table"
    assert len(step["passes"]) > 1 and len(step["tree"]["tokens"]) > 4, "and the draft's passes and the mask"
    ratios = [c["value"] for s in data["steps"] for c in s["checks"] if c["test"] == "ratio"]
    assert any(0 < r < 1 for r in ratios), "the sampled run should show a test min(1, p/q) strictly between 0 and 1"


def test_the_page_says_which_draft_pass_built_each_node(run, shown):
    """A node is built by the draft pass that fed its parent. A parent the draft proposed was fed in a
    later pass than the one that built it; a parent stage 2 guessed was fed ahead, in the very pass
    that built it: its children cost no pass of their own. The page names the pass of every node."""
    _, data, _ = run
    drafted = [(step, s) for step, s in zip(data["steps"], shown) if step["draft_blocks"] and not step["copied"]]
    assert drafted
    for step, s in drafted:
        by, parents = step["built_by"], step["tree"]["parents"]
        assert by[0] is None and all(0 <= by[i] < len(step["draft_blocks"]) for i in range(1, len(by)))
        for i in range(1, len(by)):
            parent = parents[i]
            if parent == 0:
                continue
            if step["proposers"][parent] in (NGRAM, COPY):  # stage 2 guessed it: fed ahead of time
                assert by[i] == by[parent]
            else:
                assert by[i] > by[parent]
        assert "built by" in s["checks"] and f"draft pass {by[1] + 1}" in s["checks"]
        assert f"pass {by[1] + 1} built #1" in s["summary"]
    copies = [s for step, s in zip(data["steps"], shown) if step["copied"]]
    assert all("built #" not in s["summary"] for s in copies)


def test_the_page_files_ship_in_the_wheel(wheel):
    """The page's markup, styles and script are package data: the built wheel (the session's, built once
    offline from a copy of the sources) holds each of them, as `trace.page` reads them."""
    with zipfile.ZipFile(wheel) as z:
        for name in ("page.html", "page.css", "page.js"):
            shipped = z.read(f"specdec_np/tools/trace_page/{name}").decode("utf-8")
            assert shipped == trace.page_file(name) and shipped.strip()


def rows_of(html, tag="tr", cls=None):
    """Per matching <tr>, its attributes and the classes of its <td> cells, from rendered HTML."""
    page, out = Page(html), []
    for tag_, attrs in page.tags:
        if tag_ == "tr" and (cls is None or attrs.get("class") == cls):
            out.append((attrs, []))
        elif tag_ == "td" and out:
            out[-1][1].append(attrs.get("class"))
    return out


def test_the_timeline_shows_each_draft_pass_and_what_it_fed(run, shown):
    """Per step, one timeline row per draft pass with its rows, and in it every row the pass fed: the
    recorded passes add up to the step's draft blocks; each node of the tree that stage 2 guessed
    was fed as its guess (the trigram's, or a copy) and each node was built by one pass; a pass that
    built nothing says why."""
    _, data, _ = run
    guessed_nodes = 0
    for step, s in zip(data["steps"], shown):
        passes, tree = step["passes"], step["tree"]
        assert [p["rows"] for p in passes] == step["draft_blocks"]
        timeline = [attrs for attrs, _ in rows_of(s["passes"], cls="pass")]
        assert [int(a["data-rows"]) for a in timeline] == step["draft_blocks"]
        assert [int(a["data-fed"]) for a in timeline] == [len(p["fed"]) for p in passes]
        fed = [a["data-origin"] for t, a in Page(s["passes"]).tags if t == "span" and "data-origin" in a]
        rows = [(["catch-up"] if p["catch_up"] else []) + [r["origin"] for r in p["fed"]] for p in passes]
        assert fed == [origin for row in rows for origin in row]
        assert all(p["rows"] == p["catch_up"] + len(p["fed"]) for p in passes)
        if not passes:
            assert "No draft pass" in s["passes"]
            continue
        where = {r["node"]: r for p in passes for r in p["fed"] if r["node"] is not None}
        for node, r in where.items():
            assert r["token"] == tree["tokens"][node]
            proposer = step["proposers"][node]
            assert r["origin"] == {NGRAM: "guess", COPY: "copy"}.get(proposer, "root" if node == 0 else "node")
            guessed_nodes += proposer in (NGRAM, COPY)
        built = sorted(i for p in passes for i in p["built"])
        assert built == list(range(1, len(tree["tokens"])))  # every drafted node, by exactly one pass
        assert s["passes"].count("built nothing:") == sum(not p["built"] for p in passes)
    assert guessed_nodes > 0


def test_the_mask_is_the_trees_attention_mask(run, shown):
    """Per step, an n x n grid equal to tree.attention_mask of the step's tree, its columns labelled
    by the full node number (not j % 10)."""
    from specdec_np.tree import Tree, attention_mask

    _, data, _ = run
    for step, s in zip(data["steps"], shown):
        tree = Tree(step["tree"]["tokens"], step["tree"]["parents"], step["tree"]["q"])
        n = len(tree)
        (table,) = [a for t, a in Page(s["mask"]).tags if t == "table"]
        assert int(table["data-n"]) == n
        grid = [cells for _, cells in rows_of(s["mask"]) if cells]
        assert np.array_equal(np.array([[c == "on" for c in row] for row in grid]).reshape(n, n), attention_mask(tree))
        assert Page(s["mask"]).contents("th", **{"class": "col"}) == [str(j) for j in range(n)]


def test_the_deepest_tree_fits_in_1280_pixels(embedded, tmp_path):
    """A copied chain of 12 tokens (the deepest tree of a staged run) and the token the target adds
    are drawn within 1280 px, their text still at least 12 px."""
    target, draft, ngram, enc = embedded
    prompt = encode(enc, PROMPT)
    res = generate(target, prompt, 12, "lookup", plan=Plan(lookup_chains=(12, 12, 12)), keep_trees=True)
    html = trace.page(trace.record(res, enc, prompt, "lookup"))
    steps = embedded_data(html)["steps"]
    deep = [k for k, step in enumerate(steps) if len(step["tree"]["tokens"]) == 13]
    assert deep, "a step with a 12-token chain"
    shown = rendered(html, tmp_path)
    for k in deep:
        width, view, fonts = svg_sizes(shown[k]["tree"])
        assert width == view <= 1280 and min(fonts) >= 12


def test_each_step_shows_its_emitted_text_and_each_pass_its_cost(run, shown, tmp_path):
    """The summary quotes the step's emitted text as a string (JSON, whitespace escaped) and the target pass's
    cost; each draft pass shows its cost as a multiple of a one-token pass, and one that built nothing says it."""
    res, data, _ = run
    assert data["costs"]["target"]["1"] == data["costs"]["draft"]["1"] == 1.0
    for step, s in zip(data["steps"], shown):
        said = json.dumps("".join(data["text"][str(t)] for t in step["tokens"]), ensure_ascii=False)
        assert f"emitted: {said}." in s["summary"] or f"cut: {said}." in s["summary"], (said, s["summary"])
        ratio = data["costs"]["target"].get(str(step["target_block"]))  # none for a prefill of over MAX_COSTED rows
        assert (ratio is None) == (step["target_block"] > trace.MAX_COSTED) and "one-token draft" not in s["summary"]
        said = f"target pass: {step['target_block']} row{'s' * (step['target_block'] != 1)}"
        bent = " (from a bent curve: not a saving)" if data["costs"]["bent"]["target"] else ""
        cost = "" if ratio is None else f" (\u2248 {ratio:.1f}\u00d7 a one-token target pass{bent})"
        assert f"{said}{cost}." in s["summary"]
        for p in step["passes"]:
            if p["rows"] > trace.MAX_COSTED:
                continue
            paid = f"\u2248 {data['costs']['draft'][str(p['rows'])]:.1f}\u00d7 a one-token draft pass"
            assert paid in s["passes"]
            if not p["built"]:
                assert f"it cost {paid}" in s["passes"]
    if res.stats.steps[0].trace.rule == "greedy":  # its best-first trees leave some passes with nothing built
        assert any(not p["built"] for step in data["steps"] for p in step["passes"]), "a pass that built nothing"
    assert any(r != 1.0 for r in data["costs"]["target"].values())
    without = rendered(trace.page(dict(data, costs=None)), tmp_path)  # a page without costs (a lesson's) says none
    assert [s["summary"] for s in without] == [re.sub(r" \(\u2248 [0-9.]+\u00d7 a one-token target pass( \(from a bent "
                                                      r"curve: not a saving\))?\)", "", s["summary"]) for s in shown]
    assert not any("one-token" in s["passes"] for s in without)


def page_calls(run, tmp_path, expression: str):
    """The JSON value of a JavaScript `expression` evaluated by Node.js with the page's script of `run` loaded
    (its functions, e.g. `visible`), skipped without Node.js."""
    if NODE is None:
        pytest.skip("needs Node.js to run the page's script")
    script = next(s for s in Page(run[2]).contents("script", type=None) if s.strip())
    (tmp_path / "data.json").write_text(json.dumps(run[1]), encoding="utf-8")
    js = HARNESS.replace("__SCRIPT__", script).replace("console.log(JSON.stringify(shown));",
                                                       f"console.log(JSON.stringify({expression}));")
    (tmp_path / "run.js").write_text(js, encoding="utf-8")
    r = subprocess.run([NODE, str(tmp_path / "run.js"), str(tmp_path / "data.json")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_whitespace_tokens_can_be_told_apart(run, tmp_path):
    """Spaces, newlines and tabs show as visible marks, and runs of them with their length: the tokens of
    indented code do not all look alike."""
    words = ["   ", "    ", "        ", "\n", "\n\n", "\n    ", "\n        ", "\t", "\t\t\t", " x", "x  y"]
    marks = page_calls(run, tmp_path, f"{json.dumps(words)}.map(w => visible(w))")
    assert len(set(marks)) == len(words) and not any(c in " \n\t" for m in marks for c in m), marks
    assert marks[2] == "\u2423\u00d78" and marks[6] == "\u21b5\u2423\u00d78", marks


def test_controls_and_bidi_marks_show_as_code_points(run, tmp_path):
    """A NUL, a right-to-left override, a line separator or the byte-order mark in a token shows as its code
    point (a browser would drop or obey it), in the completion's text and in a token's marks; other text is
    unchanged."""
    words = ["a\x00b", "\u202eevil", "x\u2028y", "\u2029", "\ufeffz", "\x1b[31m", "plain é"]
    listed = json.dumps(words)
    revealed, marked = page_calls(run, tmp_path, f"[{listed}.map(w => reveal(w)), {listed}.map(w => visible(w))]")
    (null, rlo, ls, ps, bom, esc_, plain) = revealed
    assert null == "a\u27e8U+0000\u27e9b" and rlo == "\u27e8U+202E\u27e9evil" and ls == "x\u27e8U+2028\u27e9y"
    assert ps == "\u27e8U+2029\u27e9" and bom == "\u27e8U+FEFF\u27e9z" and esc_ == "\u27e8U+001B\u27e9[31m"
    assert plain == "plain é"
    assert marked[:6] == revealed[:6] and marked[6] == "plain\u2423é"  # a token's marks: the same code points


def test_make_trace_shows_the_sampled_rule_by_default():
    """`make trace` with no arguments is a sampled run (the rule's min(1, p/q) against u), as make trace-png's."""
    make = (ROOT / "Makefile").read_text(encoding="utf-8")
    default = re.search(r"^TRACE_ARGS \?= (.+)$", make, re.M).group(1)
    png = re.search(r"^PNG_ARGS = (.+)$", make, re.M).group(1)
    args = (png if default == "$(PNG_ARGS)" else default).split()
    assert "--temperature" in args and float(args[args.index("--temperature") + 1]) > 0


def test_each_pass_says_why_it_fed_its_rows(run, shown):
    """Issue 59: the counts under a pass's rows are labelled ("2 tree nodes", not "2 tree") and add up to
    its rows: catch-up rows, the root, tree nodes, stage 2's trigram and copied guesses."""
    _, data, _ = run
    words = {"catch-up": "catch-up", "root": "root", "roots": "root", "tree node": "node", "tree nodes": "node",
             "trigram guess": "guess", "trigram guesses": "guess", "copied guess": "copy", "copied guesses": "copy"}
    seen = set()
    for step, s in zip(data["steps"], shown):
        cells = re.findall(r'<td class="num rows">(\d+)<small>([^<]*)</small>', s["passes"])  # [(rows, counts)]
        assert len(cells) == len(step["passes"]) and (not cells or "fed, by why" in s["passes"])
        for p, (rows, cell) in zip(step["passes"], cells):
            assert int(rows) == p["rows"]
            counts = {}
            for part in cell.split(" + "):
                n, word = part.split(" ", 1)
                counts[words[word]] = int(n)  # a word not listed (an unlabelled count) fails here
            fed = {o: sum(r["origin"] == o for r in p["fed"]) for o in ("root", "node", "guess", "copy")}
            assert counts == {k: v for k, v in (fed | {"catch-up": p["catch_up"]}).items() if v}
            assert sum(counts.values()) == p["rows"]
            seen |= set(counts)
    assert {"root", "node", "guess"} <= seen


def test_the_page_marks_who_proposed_a_token_as_the_demo_and_readme_do():
    """One mark-up for who proposed a token: the page's text marks (its label and its styles) are the demo's
    (demo.MARKS, whose legend the README quotes)."""
    import html as html_lib

    from specdec_np.tools import demo

    names = ("copy", "ngram", "draft", "target")
    legend = " ".join(demo.marked(n, n, False) for n in names) + " (unmarked)"
    (label,) = re.findall(r'id="marks">([^<]*)<span id="marks-key">([^<]*)</span></label>',
                          trace.page_file("page.html"))
    label = "".join(label)
    assert html_lib.unescape(label).strip() == f"text marks: {legend}"
    assert legend in (ROOT / "README.md").read_text(encoding="utf-8").replace("  ", " ")
    css = trace.page_file("page.css")
    for n in (*names[:3], "head"):  # the head's {{tokens}} too (method eagle: test_eagles_page_names_the_head)
        start, end = demo.MARKS[n]
        assert f'body.marks .src-{n}::before {{ content: "{start}"; }}' in css
        assert f'body.marks .src-{n}::after {{ content: "{end}"; }}' in css


def test_the_totals_say_where_the_tokens_came_from(run, shown):
    """Issue 59: the page's totals give stage 2's guesses apart from its copies (record.PARTS), as bench and
    the demo do."""
    res, data, _ = run
    p = res.stats.parts
    assert p["ngram_guess"] + p["copy_guess"] + p["copied"] > 0  # the run shows stage 2 at work
    assert (f"Tokens from the draft: {p['draft']}; from stage 2's guesses the draft kept (each saving it a pass): "
            f"{p['ngram_guess']} the trigram's, {p['copy_guess']} a repeat's; copies sent to the target with no draft "
            f"pass: {p['copied']}; the target's token ending each step: {p['target']}.") in shown[0]["totals"]


def test_eagles_page_names_the_head_where_the_draft_would_be(embedded, tmp_path):
    """Issue 61: with method eagle the page shows the head's proposals as it shows the draft's (the same shapes and
    colours: a tree, its passes, its q), named "EAGLE head" and "head pass", its text marked {{head}} (demo.MARKS);
    a draft model's page (the control) says "draft" and nothing of a head."""
    from specdec_np.models import load_head
    from specdec_np.tools import demo

    target, draft, ngram, enc = embedded
    prompt = encode(enc, PROMPT)
    pages = {}
    for method, drafter in (("eagle", load_head(target=target)), ("tree", draft)):
        res = generate(target, prompt, 12, method, drafter, keep_trees=True)
        data = trace.record(res, enc, prompt, method)
        assert data["proposer"] == ("head" if method == "eagle" else "draft")
        pages[method] = rendered(trace.page(data), tmp_path), res
    (head, res), (control, _) = pages["eagle"], pages["tree"]
    last = head[-1]
    assert f"{res.stats.draft_passes} head passes" in last["totals"]
    assert "Tokens from the EAGLE head: " in last["totals"]
    assert "EAGLE head" in last["legend"] and 'class="tok src-head"' in last["legend"]
    assert "src-head" in last["text"] and "src-draft" not in last["text"]
    assert last["marks-key"] == "\u00abcopy\u00bb [ngram] {{head}} target (unmarked)"
    assert demo.marked("head", "head", False) == "{{head}}"  # the demo's mark-up, as the page's
    assert last["passes-head"].startswith("2. The EAGLE head's passes")
    drafted = [s for s in head if "proposed by EAGLE head" in s["tree"]]
    assert drafted and all("EAGLE head</td>" in s["checks"] and "head pass 1" in s["checks"] for s in drafted)
    assert any("Head passes: " in s["summary"] for s in head)
    assert not any("EAGLE head" in v or "src-head" in v for s in control for v in s.values())
    assert "draft passes" in control[-1]["totals"] and "proposed by draft" in "".join(s["tree"] for s in control)


def test_a_heads_passes_are_timed_as_the_head_runs_them(embedded, monkeypatch):
    """Issue 61: the page's (and the cost curves') price of an EAGLE head's pass times its own pass, the fusion
    and its block (`eagle.head_pass`) and the target's tied head (`eagle.head_logits`), not `gpt2.forward` on a
    one-block GPT-2; a draft model's passes (the control) are still `forward`'s."""
    from specdec_np import eagle
    from specdec_np.models import load_head
    from specdec_np.tools import costcurve

    target, draft, ngram, enc = embedded
    head, prompt = load_head(target=target), encode(enc, PROMPT)[:40]
    calls = {"head_pass": 0, "head_logits": 0, "forward": 0}

    def counted(name, fn):
        def call(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return call
    monkeypatch.setattr(eagle, "head_pass", counted("head_pass", eagle.head_pass))
    monkeypatch.setattr(eagle, "head_logits", counted("head_logits", eagle.head_logits))
    monkeypatch.setattr(costcurve, "forward", counted("forward", costcurve.forward))
    res = generate(target, prompt, 6, "eagle", head, keep_trees=True)
    before = dict(calls)
    costs = trace.pass_costs(None, head, res, prompt)
    timed = {k: calls[k] - before[k] for k in calls}
    assert costs["draft"] and timed["head_pass"] > 0 and timed["head_logits"] == timed["head_pass"]
    assert timed["forward"] == 0
    before = dict(calls)
    trace.pass_costs(None, draft, generate(target, prompt, 6, "tree", draft, keep_trees=True), prompt)
    assert calls["forward"] > before["forward"] and calls["head_pass"] == before["head_pass"]


def test_the_page_opens_on_the_first_step_with_a_random_draw(run, tmp_path):
    """Issue 69: the page opens on the first step whose rule drew a uniform u (not on one accepted without a draw);
    with none (greedy), on step 1; an address's #step=N still wins. The control: with that step's u taken away, the
    page opens on the next step that drew one."""
    _, data, html = run
    drew = [k for k, step in enumerate(data["steps"]) if any(c["u"] is not None for c in step["checks"])]
    opened, asked = page_calls(run, tmp_path, '[opened, (location.hash = "#step=2", start(), current)]')
    assert opened == (drew[0] if drew else 0) and asked == 1
    if drew:
        steps = json.loads(json.dumps(data["steps"]))
        for c in steps[drew[0]]["checks"]:
            c["u"] = None
        later = page_calls((None, dict(data, steps=steps), html), tmp_path, "opened")
        assert later == (drew[1] if len(drew) > 1 else 0) != opened


def named_rules(shown) -> list:
    """The rule each step's section 4 names in its heading."""
    return [s["rule-head"].removeprefix("4. The verification rule: ") for s in shown]


def test_eagles_steps_name_the_rule_their_proposal_ran(embedded, tmp_path):
    """Issue 69: each step of an EAGLE run drawn without replacement names the rule its proposal ran (the loop's
    record, record.Trace.rule); its first step, which drafts nothing (the head needs the prompt's features), tests
    nothing and names no rule but the run's, where it named point_mass with the draft's "top tokens". The control:
    a page whose steps all carry the first step's rule fails the same check."""
    from specdec_np.models import load_head

    target, draft, ngram, enc = embedded
    prompt = encode(enc, PROMPT)
    plan = Plan(shape="fixed", widths=(2, 2, 1), sampled="without")
    res = generate(target, prompt, 12, "eagle", load_head(target=target), keep_trees=True, temperature=1.0, top_k=50,
                   seed=1, plan=plan)
    ran = [s.trace.rule for s in res.stats.steps]
    data = trace.record(res, enc, prompt, "eagle")
    drafted = [len(s.trace.tree) > 1 for s in res.stats.steps]
    assert not drafted[0] and ran[0] == "point_mass" and set(r for r, d in zip(ran, drafted) if d) == {"recursive_wor"}

    def names_each_proposals_rule(shown):
        return all(name == (rule if d else "none (nothing drafted)")
                   for name, rule, d in zip(named_rules(shown), ran, drafted))
    shown = rendered(trace.page(data), tmp_path)
    assert names_each_proposals_rule(shown)
    assert "point_mass" not in shown[0]["rule"] and "top tokens" not in shown[0]["rule"]
    assert "The run's drafted steps are verified by recursive_wor." in shown[0]["rule"]
    wrong = dict(data, steps=[dict(step, rule=ran[0]) for step in data["steps"]])
    assert not names_each_proposals_rule(rendered(trace.page(wrong), tmp_path))


def test_a_bent_cost_curve_is_named_and_its_prices_are_no_savings(run, tmp_path):
    """Issue 69: a cost curve on which more rows were measured cheaper than fewer (costcurve.bends; the trace priced
    2- and 4-row draft passes at 0.2x a one-token pass) is said to be bent, with the likely cause, and each price from
    it says so; a monotone curve (the control) is priced plainly. The recorded bends are the measured ratios'."""
    from specdec_np.tools.costcurve import bends

    assert bends({1: 10.75, 2: 6.04, 4: 12.0}) == [(1, 2)] and bends({1: 1.0, 2: 0.99, 4: 1.5}) == []
    _, data, html = run
    for model in ("target", "draft"):
        assert data["costs"]["bent"][model] == [list(b) for b in bends({int(k): v for k, v in
                                                                         data["costs"][model].items()})]
    sizes = sorted({p["rows"] for step in data["steps"] for p in step["passes"]})
    for curve, bent in (({k: 0.2 if k > 1 else 1.0 for k in sizes}, [[1, sizes[1]]]), ({k: k for k in sizes}, [])):
        costs = dict(data["costs"], draft={str(k): v for k, v in curve.items()}, bent={"target": [], "draft": bent})
        shown = rendered(trace.page(dict(data, costs=costs)), tmp_path)
        prices = [s["passes"] for s in shown if "one-token draft pass" in s["passes"]]
        assert prices and all(("from a bent curve: not a saving" in p) == bool(bent) for p in prices)
        said = f"The draft's curve is bent: {sizes[1]} rows measured cheaper than 1 row"
        assert (said in shown[0]["totals"] and "Likely causes" in shown[0]["totals"]) == bool(bent)


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
MEASURE = """<script>
document.body.setAttribute("data-measured", JSON.stringify([...document.querySelectorAll("#residual .scroll")]
  .map(box => [box.scrollWidth, box.clientWidth])));
</script></body>"""


def residual_widths(html, tmp_path, step: int, css: str = "") -> list:
    """[(the table's width, its box's)] of each residual table of `step` as Chromium lays the page out at 1280 px."""
    page = tmp_path / "measured.html"
    page.write_text(html.replace("</style>", css + "</style>").replace("</body>", MEASURE), encoding="utf-8")
    r = subprocess.run([CHROMIUM, "--headless", "--disable-gpu", "--hide-scrollbars", "--window-size=1280,1500",
                        "--virtual-time-budget=2000", *(["--no-sandbox"] if os.geteuid() == 0 else []), "--dump-dom",
                        f"{page.as_uri()}#step={step}"], capture_output=True, text=True, timeout=120)
    m = re.search(r'data-measured="([^"]*)"', r.stdout)
    assert m, r.stderr[-2000:]
    return json.loads(m[1].replace("&quot;", '"'))


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium to lay the page out")
def test_the_residual_tables_fit_a_1280_pixel_window(run, tmp_path):
    """Issue 69: the residual tables (p, q and one p', q' per rejection) fit their column at 1280 px, as Chromium
    lays them out, where they were clipped; the control: a table forced wider is measured wider than its box."""
    res, data, html = run
    steps = sorted(((len(r["stages"]), k + 1) for k, step in enumerate(data["steps"]) for r in step["residuals"]),
                   reverse=True)[:2]  # the widest tables: the most rejections
    if res.stats.steps[0].trace.rule == "greedy":
        assert not steps
        return
    for _, k in steps:
        widths = residual_widths(html, tmp_path, k)
        assert widths and all(table <= box for table, box in widths), (k, widths)
    assert all(table > box for table, box in residual_widths(html, tmp_path, steps[0][1],
                                                             "#residual table { width: 700px; }"))
