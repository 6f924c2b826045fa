"use strict";
const D = JSON.parse(document.getElementById("trace-data").textContent);
const $ = id => document.getElementById(id);
// Who proposed a node: the draft, stage 2's n-gram guess (kept by the draft), a copy of a repeat
// (stage 2's, or prompt lookup's), or
// the target (the root, and the token the target adds). Each has a colour AND a shape.
const WHO = {
  draft: {label: "draft", color: "var(--draft)", bg: "var(--draft-bg)", shape: "circle"},
  guess: {label: "n-gram guess", color: "var(--ngram)", bg: "var(--ngram-bg)", shape: "diamond"},
  copy: {label: "copy of a repeat", color: "var(--copy)", bg: "var(--copy-bg)", shape: "square"},
  target: {label: "target", color: "var(--target)", bg: "var(--target-bg)", shape: "triangle"},
};
// EAGLE (method eagle): the target's own head drafts in the draft's place. Its nodes, passes and tokens are the
// draft's, named "head" and marked {{head}} in the text (the draft's are {draft}).
const DRAFTER = D.proposer === "head" ? "head" : "draft";
if (DRAFTER === "head") WHO.draft = Object.assign({}, WHO.draft, {label: "EAGLE head"});
function srcClass(src) { return src === "draft" ? DRAFTER : src; }  // the text's class: src-draft or src-head
const RULES = {
  greedy: "greedy (temperature 0): follow the child whose token is the target's argmax; at the first node with no such child, or after a leaf, the target adds its argmax.",
  point_mass: "point mass: try the children in order, accepting each with its share of the target's probability not yet tried; the same as drawing x ~ p and descending if x is a child. If none is accepted, the target draws from p without the tried children.",
  chain: "chain rejection sampling: accept the drafted x ~ q with probability min(1, p(x)/q(x)) against a uniform draw u; on a rejection the target draws from norm(max(p - q, 0)); after the whole chain, a bonus token from p.",
  recursive: "recursive rejection sampling (children drawn from q with replacement): test each child with min(1, p/q) against a uniform draw u; after a rejection p := norm(max(p - q, 0)) for the next sibling. If all are rejected, the target draws from what p still owes.",
  recursive_wor: "recursive rejection sampling without replacement: as with replacement, and a rejected token is also removed from q (renormalised) before the next sibling is tested.",
  block: "block verification (a chain drawn from q): each prefix x1..xi gets a weight a_i = min(1, a_(i-1) p(xi)/q(xi)), so a later token with p > q can make up for an earlier one with p < q. Testing from the end of the chain back, keep x1..xi with a probability computed from a_i against a uniform draw u; the target then draws from what it still owes there.",
  traversal: "traversal verification (a tree drawn from q): paths are tested from the leaves towards the root, each node only after all its children were rejected, with the weight of its whole path (as block verification does on a chain). A rejected child lowers its parent's weight and what the parent still owes; the first node kept ends the step, and the target draws from what it owes.",
};

// Point mass is the rule for children that were not drawn from a distribution: the draft's top
// tokens, or stage 2's copy of a repeat (which has no q at all).
// A step that drafted nothing (EAGLE's first: the head needs the prompt's features) tests nothing: every rule
// draws the target's token from p there, so the page names no rule for it but the ones the run's trees ran.
function drafted(step) { return step.tree.tokens.length > 1; }
function ruleName(step) { return drafted(step) ? step.rule : "none (nothing drafted)"; }
function ruleText(step) {
  if (!drafted(step)) {
    const run = [...new Set(D.steps.filter(drafted).map(s => s.rule))];
    return "Nothing was drafted this step" + (DRAFTER === "head" && step === D.steps[0] ?
      " (EAGLE's head drafts from the target's features, which this step's pass over the prompt computes)" : "") +
      ", so no rule tests anything: the target's token is " + (step.rule === "greedy" ? "its argmax" : "drawn from p") +
      ", as every rule does after a leaf." + (run.length ? ` The run's drafted steps are verified by ${run.join(", ")}.` : "");
  }
  const base = RULES[step.rule] || `rule ${step.rule}`;
  if (step.rule === "point_mass") return (step.copied
    ? "point mass (the children are stage 2's copy of a repeat, one token per node, not drawn from any distribution, so there is no q): "
    : `point mass (the children are the ${WHO.draft.label}'s top tokens, chosen, not drawn): `) + base.slice("point mass: ".length);
  return base + (step.rule === "greedy" ? " (At temperature 0 the target's p is 1 at its argmax, 0 elsewhere.)" : "");
}
// Why a step's path was cut (only the run's last step can be): the tokens after the cut are not emitted.
function cutWhy(step) {
  return step.cut === "eos" ? "the end-of-text token ends the run" :
    step.cut === "max_new_tokens" ? "the run reached --max-new-tokens" : "the context is full";
}
// Whether node i of the accepted path was emitted: the path's j-th node is the step's j-th token.
function emittedNode(step, i) { const j = step.path.indexOf(i); return j < 0 || j <= step.tokens.length; }

function esc(s) { return String(s).replace(/[&<>"]/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"})[c]); }
function text(t) { return D.text[t] !== undefined ? D.text[t] : "#" + t; }
// Characters a browser would drop or act on (NUL and other controls, bidi overrides, line and paragraph
// separators, the byte-order mark): shown as their code point, so that the text on the page is the text decoded.
const HIDDEN = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029\ufeff]/g;
function reveal(s) {
  return String(s).replace(HIDDEN, c => "\u27e8U+" + c.codePointAt(0).toString(16).toUpperCase().padStart(4, "0") + "\u27e9");
}
function visible(s, max) {  // a token with its whitespace shown (a run of 3 or more as a count), shortened to max
  s = reveal(s).replace(/( |\n|\t)\1{2,}/g, m => m[0] + "\u00d7" + m.length)
    .replace(/ /g, "\u2423").replace(/\n/g, "\u21b5").replace(/\t/g, "\u21e5");
  return max && s.length > max ? s.slice(0, max - 1) + "\u2026" : s;
}
function tok(t) { return "\u2018" + visible(text(t)) + "\u2019"; }
function num(x) {  // 3 decimals; a tiny non-zero probability as 2e-5, not 0.000
  return x === null || x === undefined ? "" : x > 0 && x < 0.001 ? x.toExponential(0) : Number(x).toFixed(3);
}
function short(x) {  // 0.94 -> .94, in a node's box
  return x === 1 || x === 0 ? String(x) : x >= 0.995 ? ">.99" : x < 0.005 ? "<.01" : x.toFixed(2).slice(1);
}
function who(step, i) {
  if (i === 0) return "target";
  const src = D.sources[step.proposers[i]];
  if (src === "ngram") return "guess";
  if (src === "copy") return "copy";
  return src === "target" ? "target" : "draft";
}

function shape(kind, x, y, r, color) {  // a marker centred on (x, y)
  const s = `fill="${color}" stroke="#1a202c" stroke-width="1"`;
  if (kind === "circle") return `<circle cx="${x}" cy="${y}" r="${r}" ${s}/>`;
  if (kind === "square") return `<rect x="${x - r}" y="${y - r}" width="${2 * r}" height="${2 * r}" ${s}/>`;
  if (kind === "diamond") return `<polygon points="${x},${y - r - 1} ${x + r + 1},${y} ${x},${y + r + 1} ${x - r - 1},${y}" ${s}/>`;
  return `<polygon points="${x},${y - r} ${x + r},${y + r} ${x - r},${y + r}" ${s}/>`;
}
function marker(kind) {
  return `<svg width="16" height="16" viewBox="0 0 16 16">${shape(WHO[kind].shape, 8, 8, 6, WHO[kind].color)}</svg>`;
}

function legend() {
  const items = Object.keys(WHO).map(k => `<span>${marker(k)} ${WHO[k].label}</span>`);
  items.push('<span>#3: node 3 of the tree (the tables name nodes so)</span>',
             '<span><b>&#10003;</b> thick border: accepted</span>', '<span><b>&#10007;</b> dashed border: rejected</span>',
             '<span>faded, dotted: not examined</span>', '<span><b>&#9986;</b> faded, dotted: accepted but cut (the run ended)</span>');
  items.push('<span>text: <span class="tok src-copy">copy</span> <span class="tok src-ngram">ngram</span> ' +
             `<span class="tok src-${DRAFTER}">${DRAFTER}</span> ` +
             '<span class="tok src-target">target</span></span>');
  $("legend").innerHTML = items.join("");
}

// What the rule concluded about each node: the check on it (a node is tested at most once).
function verdicts(step) {
  const byNode = {};
  step.checks.forEach((c, i) => { if (c.test !== "draw") byNode[c.node] = Object.assign({first: i}, c); });
  return byNode;
}

const TREE_WIDTH = 1220, MIN_W = 80;  // the tree's widest drawing in px (the page's width at 1280 px), its narrowest column
function treeSvg(step) {
  const t = step.tree, n = t.tokens.length, onPath = new Set(step.path), v = verdicts(step);
  const kids = Array.from({length: n}, () => []);
  for (let i = 1; i < n; i++) kids[t.parents[i]].push(i);
  const depth = [0], row = [];
  for (let i = 1; i < n; i++) depth[i] = depth[t.parents[i]] + 1;
  let next = 0;
  (function place(i) {  // leaves take rows in order; a parent sits level with its first child
    kids[i].forEach(place);
    row[i] = kids[i].length ? row[kids[i][0]] : next++;
  })(0);
  const last = step.path[step.path.length - 1], added = step.checks[step.checks.length - 1];
  const cols = Math.max(Math.max(...depth) + 1, depth[last] + 2);  // the added token sits right of the path
  // Columns narrow (down to MIN_W) so that the deepest tree, a copied chain of 12 tokens and the
  // target's token after it, fits in TREE_WIDTH: a 1280 px window shows it whole. The boxes'
  // labels shorten with them; their text never shrinks (tokens 16 px, the rest at least 12 px).
  const H = 70, BH = 48, X0 = 14, Y0 = 34, W = Math.max(MIN_W, Math.min(170, Math.floor((TREE_WIDTH - X0 - 10) / cols)));
  const BW = W - 20, chars = Math.floor((BW - 6) / 10), wide = BW >= 100;  // a 16 px monospace character: ~10 px
  const X = i => X0 + depth[i] * W, Y = i => Y0 + row[i] * H;
  const out = [];
  for (let d = 0; d < cols; d++)
    out.push(`<text x="${X0 + d * W}" y="15" font-size="13" fill="#4a5568">${d === 0 ? "root" : "depth " + d}</text>`);
  for (let i = 1; i < n; i++) {
    const p = t.parents[i], path = onPath.has(i);
    out.push(`<path d="M${X(p) + BW},${Y(p) + BH / 2} C${X(p) + BW + 12},${Y(p) + BH / 2} ${X(i) - 12},${Y(i) + BH / 2} ${X(i)},${Y(i) + BH / 2}"` +
             ` fill="none" stroke="${path ? "#1a202c" : "#a0aec0"}" stroke-width="${path ? 3 : 1.5}"/>`);
  }
  const box = (x, y, kind, label, sub, state, title, idx) => {
    const dash = state === "no" ? ' stroke-dasharray="5 3"' : state === "skip" || state === "cut" ? ' stroke-dasharray="2 2"' : "";
    const width = state === "yes" || state === "root" ? 3 : state === "no" ? 2 : 1;
    const mark = state === "yes" ? "\u2713" : state === "no" ? "\u2717" : state === "cut" ? "\u2702" : "";
    return `<g opacity="${state === "skip" || state === "cut" ? 0.7 : 1}" data-state="${state}"><title>${esc(title)}</title>` +
      `<rect x="${x}" y="${y}" width="${BW}" height="${BH}" rx="5" fill="${WHO[kind].bg}" stroke="#1a202c" stroke-width="${width}"${dash}/>` +
      shape(WHO[kind].shape, x + 1, y + 1, 7, WHO[kind].color) +
      `<text x="${x + 11}" y="${y - 4}" font-size="12" fill="#2d3748">${idx}</text>` +
      `<text x="${x + BW - 4}" y="${y - 4}" font-size="15" font-weight="700" text-anchor="end">${mark}</text>` +
      `<text x="${x + BW / 2}" y="${y + 21}" font-size="16" text-anchor="middle">${esc(visible(label, chars))}</text>` +
      `<text x="${x + BW / 2}" y="${y + 40}" font-size="12" text-anchor="middle" fill="#2d3748">${esc(sub)}</text></g>`;
  };
  for (let i = 0; i < n; i++) {
    // block and traversal test a path as a whole: its nodes above the one tested are kept with it
    const c = v[i], state = i === 0 ? "root" : !emittedNode(step, i) ? "cut" :
      c ? (c.accepted ? "yes" : "no") : onPath.has(i) ? "yes" : "skip";
    const sub = i === 0 ? (wide ? "last token" : "root") : wide ?
      (step.copied ? "" : `q ${short(t.q[i])} \u00b7 `) + `p ${short(step.p[i])}` :
      (step.copied ? "" : `q${short(t.q[i])} `) + `p${short(step.p[i])}`;  // a narrow box
    const title = i === 0 ? "node 0: the root, the last emitted token" :
      `node ${i}: ${tok(t.tokens[i])} proposed by ${WHO[who(step, i)].label}; q = ${num(t.q[i])}, p = ${num(step.p[i])}; ` +
      (c ? (c.accepted ? "accepted" : "rejected") : onPath.has(i) ? "accepted with the path below it" : "not examined") +
      (state === "cut" ? `, but cut: ${cutWhy(step)} before it` : "");
    out.push(box(X(i), Y(i), who(step, i), text(t.tokens[i]), sub, state, title, "#" + i));
  }
  // The token the target adds after the accepted path (a correction or a bonus draw).
  const emitted = step.tokens.length === step.path.length;
  const ax = X0 + (depth[last] + 1) * W, ay = kids[last].length ? Y0 + next * H : Y(last);  // below rejected children
  out.push(`<path d="M${X(last) + BW},${Y(last) + BH / 2} C${X(last) + BW + 12},${Y(last) + BH / 2} ${ax - 12},${ay + BH / 2} ${ax},${ay + BH / 2}"` +
           ` fill="none" stroke="var(--target)" stroke-width="2.5" stroke-dasharray="6 3"/>`);
  out.push(box(ax, ay, "target", text(added.token), emitted ? (wide ? "target adds" : "added") : (wide ? "cut: not emitted" : "cut"), emitted ? "yes" : "cut",
               `the target's token after node ${last}: ${tok(added.token)}` + (emitted ? "" : `, cut: ${cutWhy(step)} before it`), "+"));
  const height = Y0 + (next + (kids[last].length ? 1 : 0)) * H;
  const width = X0 + cols * W + 10;
  return `<svg width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" role="img" ` +
         `aria-label="token tree of step">${out.join("")}</svg>`;
}

function explain(step, c, t) {
  if (c.test === "argmax") return c.accepted ? `${tok(c.token)} is the target's argmax` :
    `the target's argmax is ${tok(c.value)}, not ${tok(c.token)}`;
  if (c.test === "ratio") {
    // Siblings rejected before this one: p (and q, for the recursive rules) are then what is left.
    // They are p' and q' (the residual table shows them), not the columns' p and q.
    const before = step.checks.filter((o, i) => i < c.first && o.test === "ratio" && t.parents[o.node] === t.parents[c.node]);
    const ids = before.map(o => "#" + o.node).join(", ");
    const after = !before.length ? "" : step.rule === "point_mass" ? `after ${ids} missed: ` :
      `after ${ids} rejected, against the residual p' = norm(max(p - q, 0))` +
      (step.rule === "recursive_wor" ? ` and q' = q without the rejected token: ` : ` (q' = q: siblings drawn with replacement): `);
    const prob = step.rule === "point_mass" ? `p(x) / p(untried) = ${num(c.value)}`
      : before.length ? `min(1, p'/q') = min(1, ${num(c.p)}/${num(c.q)}) = ${num(c.value)}`
      : `min(1, p/q) = min(1, ${num(c.p)}/${num(c.q)}) = ${num(c.value)}`;
    const draw = c.u === null ? `, ${c.value >= 1 ? "accepted" : "rejected"} without a draw`
      : `; u = ${num(c.u)} ${c.accepted ? "<" : "\u2265"} ${num(c.value)}`;
    return after + prob + draw;
  }
  if (c.test === "draw") {
    if (step.rule === "greedy") return c.accepted ? `a leaf: the target adds its argmax ${tok(c.token)}` :
      `no child is the argmax: the target adds its argmax ${tok(c.token)}`;
    if (c.accepted) return `a leaf: the target draws a bonus token from p: ${tok(c.token)} (probability ${num(c.value)})`;
    const from = step.rule === "point_mass" ? "p without the tried children"
      : step.checks.some(o => o.test === "sequence") ? "what the target still owes there, norm(max(a p - q, 0)) for the path's weight a"
      : "the residual p' = norm(max(p - q, 0)), what p still owes (see the residual table)";
    return `every child rejected: the target draws ${tok(c.token)} from ${from} (probability ${num(c.value)})`;
  }
  if (c.test === "sequence") {
    const draw = c.u === null ? `, ${c.value >= 1 ? "kept" : "not kept"} without a draw`
      : `; u = ${num(c.u)} ${c.accepted ? "<" : "\u2265"} ${num(c.value)}`;
    return `no deeper node kept: keep the path to here with probability ${num(c.value)}` + draw;
  }
  return `${c.test}: value ${num(c.value)}` + (c.u === null ? "" : `, u = ${num(c.u)}`);
}

function checksTable(step) {
  const t = step.tree, v = verdicts(step), onPath = new Set(step.path);
  const rows = ['<tr><th>node</th><th>token</th><th>proposed by</th>' +
                '<th title="the draft\'s probability of the token">q</th>' +
                '<th title="the target\'s probability of the token after its parent">p</th>' +
                '<th title="the draft pass whose output proposed the node">built by</th>' +
                '<th>the check</th><th>verdict</th></tr>'];
  const order = step.checks.filter(c => c.test !== "draw").map(c => c.node);
  for (let i = 1; i < t.tokens.length; i++) if (!order.includes(i)) order.push(i);
  for (const i of order) {
    const c = v[i], parent = t.parents[i];
    const kept = !c && onPath.has(i);  // on the accepted path with no test of its own (block, traversal)
    const why = c ? explain(step, c, t) : kept ? "kept: the path through it to a deeper node was accepted as a whole"
      : onPath.has(parent) ? "not examined: an earlier sibling was accepted" : `not examined: node #${parent} was not accepted`;
    const cut = !emittedNode(step, i) ? `; cut, not emitted: ${cutWhy(step)} before it` : "";
    const verdict = (c ? (c.accepted ? "accepted \u2713" : "rejected \u2717") : kept ? "accepted \u2713" : "\u2014") +
      (cut ? ", cut \u2702" : "");
    rows.push(`<tr class="${cut ? "cut" : c ? (c.accepted ? "yes" : "no") : kept ? "yes" : "skip"}"><td class="node">#${i}<small> of #${parent}</small></td>` +
              `<td class="mono">${esc(visible(text(t.tokens[i])))}</td>` +
              `<td class="who">${marker(who(step, i))} ${WHO[who(step, i)].label}</td><td class="num">${step.copied ? "\u2014" : num(t.q[i])}</td>` +
              `<td class="num">${num(step.p[i])}</td><td>${esc(builtBy(step, i))}</td>` +
              `<td>${esc(why + cut)}</td><td class="verdict">${verdict}</td></tr>`);
  }
  const add = step.checks[step.checks.length - 1], last = step.path[step.path.length - 1];
  const cut = step.tokens.length < step.path.length ? ` (cut, not emitted: ${cutWhy(step)} before it)` : "";
  rows.push(`<tr class="${cut ? "cut" : "add"}"><td class="node">+<small> after #${last}</small></td><td class="mono">${esc(visible(text(add.token)))}</td>` +
            `<td class="who">${marker("target")} target</td><td></td><td></td><td>the target's pass</td>` +
            `<td>${esc(explain(step, add, t))}</td><td class="verdict">added${cut}</td></tr>`);
  return rows.join("");
}

// After a rejection, the distributions the rule went on with, on the few tokens that matter: the
// target's p, the draft's q, and after each rejected child the residual p' (and q').
function residualView(step) {
  const bar = (x, cls) => x === null ? "\u2014" : `${num(x)}<span class="bar ${cls}" style="width:${Math.round(36 * x)}px"></span>`;
  return step.residuals.map(r => {
    const tested = r.tested.map(i => step.tree.tokens[i]);
    const cols = [];  // [stage, "p" or "q", heading]
    r.stages.forEach((st, k) => {
      const mark = k === 0 ? "" : "'" + (r.stages.length > 2 ? `<sub>${k}</sub>` : ""), why = k === 0 ? "" : ` after #${r.tested[k - 1]}`;
      cols.push([k, "p", `p${mark}${why}`]);
      if (st.q !== null && (k === 0 || step.rule === "recursive_wor")) cols.push([k, "q", `q${mark}${why}`]);
    });
    const rows = r.tokens.concat([null]).map((x, j) => {
      const label = x === null ? "<i>every other token</i>" :
        esc(visible(text(x))) + (tested.includes(x) ? ` <small>(#${r.tested[tested.indexOf(x)]})</small>` : "");
      return `<tr><td class="mono">${label}</td>` +
        cols.map(([k, d]) => `<td class="num">${bar(r.stages[k][d][j], d)}</td>`).join("") + "</tr>";
    });
    const note = step.rule === "point_mass" ? "after a miss, p' is p without the tried child, renormalised"
      : "p' = norm(max(p - q, 0)): where the draft proposed too much (q > p) nothing is owed any more, and what " +
        "is left is where the target wants more than the draft gave" +
        (step.rule === "recursive_wor" ? "; q' = q without the rejected token, renormalised (siblings drawn without replacement)" : "");
    const rejected = r.tested.slice(0, r.stages.length - 1).map(i => "#" + i);  // each rejection made a stage
    const whose = rejected.length > 1 ? `of nodes ${rejected.join(" and ")}` : `of node ${rejected[0]}`;
    return `<h2>After the rejection ${whose} (${rejected.length > 1 ? "children" : "a child"} of #${r.node}): ` +
      `p, q and the residual</h2><p class="hint">${esc(note)}.</p>` +
      `<div class="scroll"><table><tr><th>token</th>${cols.map(c => `<th>${c[2]}</th>`).join("")}</tr>${rows.join("")}</table></div>`;
  }).join("");
}

function cell(cls, slot, body, note) {
  return `<div class="cell ${cls}"><small>${slot}</small>${esc(body)}${note ? `<small>${esc(note)}</small>` : ""}</div>`;
}

function cacheView(step, seq) {
  const [start, nc, after] = step.cache, t = step.tree, onPath = new Set(step.path);
  const prefix = start ? cell("prefix", `0\u2013${start - 1}`, `${start} rows`, "cached") : "";
  // At the first step (an empty cache) the rows before the tree are the prompt's prefill: every
  // prompt token but the last, which is the tree's root.
  const prefill = start === 0, what = prefill ? "prompt" : "catch-up";
  const catchUp = nc === 0 ? "" : nc > 6 ? cell("prefix", `${start}\u2013${start + nc - 1}`, `${nc} rows`, what)
    : seq.slice(start, start + nc).map((x, j) => cell("", start + j, visible(text(x), 8), what)).join("");
  const wrote = nc === 0 ? "" : prefill ? `the prompt's prefill (${plural(nc, "row")}: its tokens but the last, the tree's root) and `
    : `${nc} catch-up rows (committed tokens the cache lacked) and `;
  const before = t.tokens.map((x, i) => cell(onPath.has(i) ? "kept" : "dropped", start + nc + i, visible(text(x), 8),
                                             `#${i} ${onPath.has(i) ? "kept" : "dropped"}`)).join("");
  const kept = step.path.map((i, j) => cell("kept", start + nc + j, visible(text(t.tokens[i]), 8), `#${i}`)).join("");
  const total = start + nc + t.tokens.length;
  return `<div>Before compaction: ${total} rows. The pass wrote ${wrote}` +
         `the ${t.tokens.length} tree nodes at slots ${start + nc}\u2013${total - 1}, each computed at position prefix + depth.</div>` +
         `<div class="cache">${prefix}${catchUp}${before}</div>` +
         `<div>After compaction: ${after} rows. Only the accepted path (${step.path.map(i => "#" + i).join(", ")}) is kept, ` +
         `moved to contiguous slots: exactly what a plain pass over the accepted text would have written. ` +
         `The token the target added is fed at the next step.</div>` +
         `<div class="cache">${prefix}${catchUp}${kept}</div>`;
}

// Which draft pass proposed node i: the pass that fed its parent. A parent that stage 2 guessed was
// fed ahead of time, in the same pass as the guess's own parent: its children needed no pass of their own.
function builtBy(step, i) {
  const b = step.built_by ? step.built_by[i] : null;
  if (b === null || b === undefined) return "\u2014";
  const parent = step.tree.parents[i];
  const ahead = parent > 0 && ["ngram", "copy"].includes(D.sources[step.proposers[parent]]);
  return `${DRAFTER} pass ${b + 1}` + (ahead ? " (from a node the n-gram guessed, scored ahead of time)" : "");
}

function passNodes(step) {  // "pass 1 built #1, #2; pass 2 built #3", or "" where no draft model ran
  if (!step.built_by || step.copied) return "";
  const by = new Map();
  step.built_by.forEach((b, i) => { if (b !== null) by.set(b, (by.get(b) || []).concat([`#${i}`])); });
  const ahead = step.built_by.filter((b, i) => b !== null && step.tree.parents[i] > 0 &&
    ["ngram", "copy"].includes(D.sources[step.proposers[step.tree.parents[i]]])).length;
  const parts = [...by.keys()].sort((a, b) => a - b).map(b => `pass ${b + 1} built ${by.get(b).join(", ")}`);
  return parts.length ? ` (${parts.join("; ")}${ahead ? `; ${plural(ahead, "node")} from n-gram guesses scored ahead of time` : ""})` : "";
}

// Stage 2 at work: the draft's passes of the step in order, each with every row it fed: the tree's
// nodes the builder asked to expand, stage 2's guesses below them (the trigram's, or copied from a
// repeat) fed in the same pass, and catch-up rows. A pass builds the children of what it fed; a
// guess the tree used saved a pass, a guess it did not use cost a row.
const ORIGIN = {
  root: {who: "target", label: "the root"},
  node: {who: "draft", label: "a tree node, fed to get its children"},
  guess: {who: "guess", label: "stage 2's trigram guess"},
  copy: {who: "copy", label: "stage 2's guess copied from a repeat"},
};
// What a pass of `rows` rows cost, as a multiple of a one-token pass of the same model (measured when the page was
// written, on the machine D.costs names), or "" where the page holds no costs. A curve on which more rows cost less
// (bent(model)) is no price list: its figures are said to come from it, never shown as a saving.
function bent(model) { return (D.costs && D.costs.bent && D.costs.bent[model]) || []; }
function cost(model, rows) {
  const c = D.costs && D.costs[model] && D.costs[model][String(rows)];
  return c == null ? "" : `\u2248 ${c.toFixed(1)}\u00d7 a one-token ${model} pass` +
    (bent(model).length ? " (from a bent curve: not a saving)" : "");
}
function bentNote(model) {  // why a curve's prices are not savings, or ""
  const b = bent(model);
  return !b.length ? "" : ` The ${model === "draft" ? DRAFTER : model}'s curve is bent: ` +
    b.map(([few, more]) => `${plural(more, "row")} measured cheaper than ${plural(few, "row")}`).join("; ") +
    ", yet more rows are never less work. Likely causes: the BLAS's kernel for that row count (a 1-row product takes " +
    "the matrix-vector path), its threads, or a busy machine; its prices are this run's timings, not savings.";
}
function builtNothing(step, pass) {  // why a pass built no node of the tree, and what it cost
  const fed = pass.fed.filter(r => r.origin !== "root");
  const paid = cost("draft", pass.rows) ? `; it cost ${cost("draft", pass.rows)}` : "";
  if (!fed.some(r => r.node !== null))
    return "built nothing: the nodes it fed did not stay in the tree (the builder kept more probable paths found later)" + paid;
  return "built nothing: no child of the nodes it fed ranked among the paths the tree kept" + paid;
}
// A pass's rows by why each was fed, adding up to its rows: "1 catch-up + 2 tree nodes + 3 trigram guesses".
const FED = {root: ["root", "roots"], node: ["tree node", "tree nodes"], guess: ["trigram guess", "trigram guesses"],
             copy: ["copied guess", "copied guesses"]};
function passCounts(pass) {
  const counts = pass.catch_up ? [`${pass.catch_up} catch-up`] : [];
  for (const o of Object.keys(FED)) {
    const n = pass.fed.filter(r => r.origin === o).length;
    if (n) counts.push(`${n} ${FED[o][n === 1 ? 0 : 1]}`);
  }
  return counts.join(" + ");
}
function passesView(step) {
  if (step.copied) return `<p>No draft pass: stage 2 copied a repeat of the last three tokens, and the target verifies the copy directly.</p>`;
  if (!step.passes.length) return step.tree.tokens.length === 1 ? "<p>No draft pass: nothing was drafted this step.</p>"
    : `<p>No draft pass: no draft model runs in this method (the ${WHO[who(step, 1)].label} proposed the tree).</p>`;
  const rows = step.passes.map((pass, j) => {
    const chips = pass.fed.map(r => {
      const o = ORIGIN[r.origin], w = WHO[o.who], kept = r.node !== null;
      const title = `${tok(r.token)} at depth ${r.depth}: ${o.label}; ` + (kept ? `in the tree as node #${r.node}` : "not in the tree");
      return `<span class="fed ${kept ? "kept" : "unused"}" data-origin="${r.origin}" title="${esc(title)}" ` +
             `style="background:${w.bg}">${marker(o.who)}${esc(visible(text(r.token), 8))}` +
             `<small>${kept ? "#" + r.node : "\u2014"}</small></span>`;
    });
    if (pass.catch_up) chips.unshift(`<span class="fed catch" data-origin="catch-up">${plural(pass.catch_up, "catch-up row")}</span>`);
    const built = pass.built.length ? "built " + pass.built.map(i => "#" + i).join(", ") : builtNothing(step, pass);
    const counts = passCounts(pass);
    return `<tr class="pass" data-rows="${pass.rows}" data-fed="${pass.fed.length}"><td class="num">${j + 1}</td>` +
           `<td class="num rows">${pass.rows}<small>${counts}</small></td><td><div class="fedrow">${chips.join("")}</div></td>` +
           `<td class="${pass.built.length ? "" : "nothing"}">${esc(built)}</td>` +
           (D.costs ? `<td class="num">${esc(cost("draft", pass.rows) || "\u2014")}</td>` : "") + "</tr>";
  });
  return `<table class="timeline"><tr><th>pass</th><th>rows<small>fed, by why</small></th>` +
         `<th>what it fed (solid: ended in the tree as the node shown)</th><th>what it built</th>` +
         (D.costs ? `<th title="measured on ${esc(D.costs.machine)} when the page was written">cost</th>` : "") +
         `</tr>${rows.join("")}</table>`;
}

// The target's pass over the tree: node i attends to node j when j is i or one of its ancestors,
// so each path is computed as if it were the only text (every node also sees the whole cached prefix
// and the catch-up rows). Siblings sit at the same position, prefix + depth.
function maskView(step) {
  const t = step.tree, n = t.tokens.length, onPath = new Set(step.path);
  const depth = [0];
  for (let i = 1; i < n; i++) depth[i] = depth[t.parents[i]] + 1;
  const sees = Array.from({length: n}, () => new Array(n).fill(false));
  for (let i = 0; i < n; i++) {
    if (i) sees[i] = sees[t.parents[i]].slice();
    sees[i][i] = true;
  }
  const pos0 = step.cache[0] + step.cache[1];  // the root's position: the committed prefix's length
  const head = `<tr><th class="corner">node \\ sees</th>${t.tokens.map((_, j) => `<th class="col">${j}</th>`).join("")}</tr>`;
  const rows = sees.map((row, i) => `<tr class="${onPath.has(i) ? "onpath" : ""}"><th title="${esc(tok(t.tokens[i]))}">` +
    `#${i} <small>pos ${pos0 + depth[i]}</small></th>` +
    row.map((on, j) => `<td class="${on ? "on" : "off"}" title="#${i} ${on ? "sees" : "does not see"} #${j}"></td>`).join("") + "</tr>");
  return `<p class="hint">Row i: what node i attends to in the target's pass (filled: j is i or its ancestor). ` +
         `Every node also sees the ${pos0} committed tokens before the root; siblings share a position (prefix + depth). ` +
         `Rows of the accepted path are marked.</p><table class="mask" data-n="${n}">${head}${rows.join("")}</table>`;
}

function plural(n, word) { return `${n} ${word}${n === 1 ? "" : "s"}`; }

function summary(step, k) {
  const t = step.tree, drafted = t.tokens.length - 1, accepted = step.path.length - 1;
  const chain = t.parents.every((p, i) => p === i - 1);
  const what = step.copied ? `stage 2 copied a repeat: a chain of ${plural(drafted, "token")}, no draft pass`
    : drafted === 0 ? "nothing drafted: the target decodes one token"
    : chain ? `a chain of ${plural(drafted, "drafted token")}` : `a tree of ${plural(drafted, "drafted node")}`;
  const passes = step.draft_blocks.length;
  const n = step.tokens.length, made = accepted + 1;
  const emitted = n === made ? `${made} emitted` : `${made} tokens, of which ${n} emitted: ${cutWhy(step)}, so the ` +
    `last ${plural(made - n, "token")} (marked \u2702) ${made - n === 1 ? "is" : "are"} cut`;
  const target = cost("target", step.target_block);
  return `Step ${k + 1} of ${D.steps.length}: ${what}. ${plural(accepted, step.copied ? "copied token" : "drafted token")} accepted` +
    ` + 1 from the target = ${emitted}: ${JSON.stringify(step.tokens.map(text).join(""))}. ` +
    `${DRAFTER === "head" ? "Head" : "Draft"} passes: ${passes}${passes ? " (rows " + step.draft_blocks.join(", ") + ")" : ""}` +
    `${passNodes(step)}; ` +
    `n-gram queries (stage 2's searches for a repeat and trigram look-ups): ${step.ngram_queries}; target pass: ${plural(step.target_block, "row")}${target ? ` (${target})` : ""}.`;
}

function completion(k) {  // the prompt, then every emitted token by who proposed it; this step's framed
  const parts = [`<span class="prompt">${esc(reveal(D.prompt_text))}</span>`];
  for (let j = 0; j <= k; j++) {
    const s = D.steps[j], toks = s.tokens.map((x, i) => {
      const src = D.sources[s.source[i]];
      return `<span class="tok src-${srcClass(src)}" title="step ${j + 1}: ${srcClass(src)}">${esc(reveal(text(x)))}</span>`;
    }).join("");
    parts.push(j === k ? `<span class="now">${toks}</span>` : toks);
  }
  return parts.join("");
}

// The step the page opens on (unless the address names one, #step=N): the first whose rule drew a uniform u, the
// draw the page exists to show; the first step where none did (greedy, or every test certain).
function firstDraw() { return Math.max(0, D.steps.findIndex(s => s.checks.some(c => c.u !== null))); }

let current = 0;
function show(k) {
  current = Math.max(0, Math.min(D.steps.length - 1, k));
  const step = D.steps[current];
  let seq = D.prompt.slice();
  for (let j = 0; j < current; j++) seq = seq.concat(D.steps[j].tokens);
  $("where").textContent = `Step ${current + 1} of ${D.steps.length}`;
  $("slider").value = current + 1;
  $("prev").disabled = current === 0;
  $("next").disabled = current === D.steps.length - 1;
  $("summary").textContent = summary(step, current);
  $("tree").innerHTML = treeSvg(step);
  $("passes").innerHTML = passesView(step);
  $("mask").innerHTML = maskView(step);
  $("rule-head").textContent = `4. The verification rule: ${ruleName(step)}`;
  $("rule").textContent = ruleText(step);
  $("checks").innerHTML = checksTable(step);
  $("residual").innerHTML = residualView(step);
  $("cache").innerHTML = cacheView(step, seq);
  $("text").innerHTML = completion(current);
  const box = $("text"), now = box.querySelector(".now");  // scroll the text box, never the page
  if (now) box.scrollTop = Math.max(0, now.offsetTop - box.clientHeight / 2);
  try { history.replaceState(null, "", "#step=" + (current + 1)); } catch (e) { /* a browser may refuse on file: pages */ }
}

// Where the run's tokens came from (record.PARTS): stage 2's guesses for the draft apart from its copies sent to
// the target, the two parts of its speedup.
function parts(P) {
  if (!P) return "";
  return `Tokens from the ${WHO.draft.label}: ${P.draft}; from stage 2's guesses the draft kept (each saving it a pass): ` +
    `${P.ngram_guess} the trigram's, ${P.copy_guess} a repeat's; copies sent to the target with no draft pass: ` +
    `${P.copied}; the target's token ending each step: ${P.target}.`;
}

function start() {
  const T = D.totals;
  $("head").textContent = `${D.staged ? "Staged speculative" : "Speculative"} decoding, step by step`;
  $("about").textContent = `Method ${D.method}${D.about ? ": " + D.about : ""}.`;
  $("totals").textContent = `${T.tokens} tokens in ${T.target_passes} target passes (${T.tokens_per_pass.toFixed(2)} tokens per pass), ` +
    `${T.draft_passes} ${DRAFTER} passes, ${T.ngram_queries} n-gram queries; stopped at ${D.stop}. ` + parts(T.parts) +
    (D.costs ? ` Pass costs (\u2248 N\u00d7 a one-token pass of the same model) measured on ${D.costs.machine} when ` +
               `the page was written${D.costs.busy ? ` (busy: ${D.costs.busy})` : ""}.` +
               bentNote("target") + bentNote("draft") : "");
  if (DRAFTER === "head") {  // the head's passes and q where the draft's would be
    $("marks-key").textContent = "\u00abcopy\u00bb [ngram] {{head}} target (unmarked)";
    $("passes-head").textContent = "2. The EAGLE head's passes: what each fed, what it built";
    $("qp").textContent = $("qp").textContent.replace("the draft's", "the EAGLE head's");
  }
  legend();
  if (!D.steps.length) { $("summary").textContent = "The run has no steps (no tokens were asked for)."; return; }
  $("slider").max = D.steps.length;
  $("prev").onclick = () => show(current - 1);
  $("next").onclick = () => show(current + 1);
  $("slider").oninput = e => show(Number(e.target.value) - 1);
  $("marks").onchange = e => document.body.classList.toggle("marks", e.target.checked);
  document.addEventListener("keydown", e => {
    if (e.target.tagName === "INPUT" && e.target.type === "range") return;  // the slider moves itself
    const go = {ArrowLeft: current - 1, ArrowRight: current + 1, Home: 0, End: D.steps.length - 1}[e.key];
    if (go !== undefined) { e.preventDefault(); show(go); }
  });
  const m = /step=(\d+)/.exec(location.hash);
  show(m ? Number(m[1]) - 1 : firstDraw());
}
start();
