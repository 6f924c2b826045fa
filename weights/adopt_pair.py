"""Redo what rests on the embedded pair's weights, after a new pair replaced it (issue 60's "everything that rests on
the pair"): the mechanical steps in order, then a checklist of the edits a person makes.

    python weights/export_tiny.py --from DIR            # first: tiny-target/, tiny-draft/, tiny-trigram.npz, eval.json
    python weights/train_eagle.py export --from DIR     # and tiny-eagle/
    python weights/adopt_pair.py                        # every step below, in order (about an hour on 2 cores)
    python weights/adopt_pair.py --list                 # the steps, one line each
    python weights/adopt_pair.py --only pinned,trace    # only these;  --from STEP: that step and those after it

Each step says what it wrote. The expensive ones (profile: tens of minutes; lessons: a few; notebooks: a quiet
machine; tests: minutes) resume or can be rerun alone. The lessons step compares each lesson's printed lines with
its notebook's, so it runs before the notebooks step rewrites them: what changed, and where the prose quotes it,
goes into the checklist printed at the end.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PY = sys.executable
SHIPPED = ROOT / "specdec_np" / "weights"
PINNED_AT = "55d3cd9"  # the commit whose code records tests/fixtures/pinned_55d3cd9.jsonl
FOUND = []  # (file or file:line, where, what) the steps found for the checklist


def run(cmd, env=None, **kw) -> subprocess.CompletedProcess:
    """`cmd` from the repository root, this checkout's package first on the path; echoed first."""
    print("  $", " ".join(str(c) for c in cmd), flush=True)
    full = dict(os.environ, **(env or {}))
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), full.get("PYTHONPATH")]))
    return subprocess.run([str(c) for c in cmd], cwd=ROOT, env=full, check=kw.pop("check", True), **kw)


def changed_files(*paths) -> str:
    """git's word on `paths`: which differ from the last commit."""
    out = subprocess.run(["git", "status", "--short", "--", *map(str, paths)], cwd=ROOT, capture_output=True,
                         text=True).stdout.strip()
    return out or "  (unchanged)"


# ----------------------------------------------------------------------------- the steps

def pair():
    """The shipped pair loads, its files' sizes against the tests' budget, eval.json against specdec_np's losses."""
    import numpy as np
    import pair_figures  # weights/pair_figures.py: the loss of a sequence, as the model card's figures count it

    from specdec_np.models import load_embedded, load_head
    from specdec_np.tokenizer import encode

    target, draft, trigram, enc = load_embedded()
    head = load_head(target=target)
    for name, m, n in (("target", target, target.n_params), ("draft", draft, draft.n_params),
                       ("EAGLE head", head, head.n_params)):  # the head's own, not the target's it shares
        c = m.config
        print(f"  {name}: {c.n_layer}L/{c.n_embd}, {c.n_head} heads, n_ctx {c.n_ctx}, {n / 1e6:.2f}M parameters")
    files = [p for p in SHIPPED.rglob("*") if p.is_file() and p.suffix in {".safetensors", ".npz", ".bpe", ".json"}]
    total = sum(p.stat().st_size for p in files) / 2**20
    print(f"  shipped files: {total:.1f} MiB (tests/core/test_embedded.py::test_weights_budget's limit: 32 MiB)")
    if total > 32:
        FOUND.append(("tests/core/test_embedded.py", "test_weights_budget", f"raise the budget to fit {total:.1f} MiB"))
    for name, m in (("target", target), ("draft", draft)):
        if (was := committed_config(f"tiny-{name}")) is not None and was != m.config:
            for rel, i, said in quoted_shape(was, with_width=name == "target"):
                FOUND.append((f"{rel}:{i}", f"the old {name}'s shape", f"says {said}"))
    text = (ROOT / "tests" / "fixtures" / "heldout_slice.txt").read_text(encoding="utf-8")
    toks = np.array(encode(enc, text)[:512])
    recorded = json.loads((ROOT / "weights" / "eval.json").read_text())
    for name, m in (("target", target), ("draft", draft)):
        total, count = pair_figures.nll(m, toks)
        got = total / count
        want = recorded[name]["heldout_slice_nats"]
        ok = abs(got - want) <= 0.01 * abs(want)
        print(f"  {name}: held-out slice {got:.5f} nats, eval.json {want} ({'agrees' if ok else 'DIFFERS'})")
        if not ok:
            FOUND.append(("weights/eval.json", name, "rerun `python weights/export_tiny.py --from DIR`"))


def committed_config(name: str):
    """The GPT2Config of specdec_np/weights/`name`/config.json as the last commit holds it (the old pair), or None."""
    from specdec_np.checkpoint import read_config

    got = subprocess.run(["git", "show", f"HEAD:specdec_np/weights/{name}/config.json"], cwd=ROOT, capture_output=True)
    if got.returncode:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_bytes(got.stdout)
        return read_config(Path(tmp) / "config.json")


SHAPE_PROSE = ["README.md", "docs/*.md", "tutorials/*.py", "tutorials/README.md"]  # the model card: a checklist item


def quoted_shape(c, with_width: bool) -> list[tuple[str, int, str]]:
    """(file, line, what) where the docs and lessons describe a model of config `c` (its size, layers, width)."""
    m = c.n_params / 1e6
    said = [rf"\b{m:.0f}M\b"] * (m >= 10) + [rf"\b{m:.1f}M\b", rf"\b{m:.2f}M\b", rf"\b{c.n_layer}L/{c.n_embd}\b",
            rf"\b{c.n_layer} layers\b", rf"\b{c.n_head} heads\b"] + [rf"\b{c.n_embd}\b"] * with_width
    pattern = re.compile("|".join(dict.fromkeys(said)))
    hits = []
    for path in sorted({p for glob in SHAPE_PROSE for p in ROOT.glob(glob)}):
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            hits += [(str(path.relative_to(ROOT)), i, x) for x in dict.fromkeys(pattern.findall(line))]
    return hits


def calibration():
    """Calibration prompts (weights/make_calibration.py): held-out stdlib code, the same for any pair trained on it."""
    run([PY, "weights/make_calibration.py"])
    print(changed_files(SHIPPED / "calibration.jsonl"))


def profile():
    """The acceptance profile, specdec_np/weights/profile.json (make_profile.py --jobs 2: tens of minutes, resumes)."""
    run([PY, "weights/make_profile.py", "--jobs", "2"])  # its journal resumes only this pair's and head's counts
    print(changed_files(SHIPPED / "profile.json"))


def constant():
    """Evidence for plan.constant: each method's fastest profiled plan, priced on this machine, beside today's."""
    from specdec_np.models import load_embedded, load_head
    from specdec_np.plan import Plan
    from specdec_np.plan import constant as constant_plan
    from specdec_np.tools import acceptance, choice
    from specdec_np.tools.calibration import Busy, calibration as costs_of

    target, draft, trigram, enc = load_embedded()
    shipped = acceptance.shipped()
    if shipped is None or shipped["models"] != acceptance.pair_key(target, draft, trigram):
        sys.exit("constant: specdec_np/weights/profile.json is not this pair's: run the profile step first")
    # What tests/tools/test_plan.py::test_the_constant_plan_is_greedys_and_a_profiled_sampled_shape checks.
    fields = {"speculative": ("chain",), "lookup": ("lookup_chains",), "tree": ("sampled", "widths"),
              "staged": ("sampled", "widths", "guess_len", "guess_rows", "copy_len")}
    sampled = constant_plan(1.0)
    shapes = [{"method": r["method"], "shape": r["shape"]} for r in shipped["settings"]["sampled"]]
    for method, names in fields.items():
        part = {f: getattr(sampled, f) for f in names}
        ok = {"method": method, "shape": part} in shapes
        print(f"  constant(T>0)'s {method} part {part}: {'a' if ok else 'NOT a'} candidate of the sampled profile")
        if not ok:
            FOUND.append(("specdec_np/plan.py", "constant", f"its {method} part is not a profiled candidate"))
    try:
        costs, how = costs_of(target, draft, trigram, acceptance.calibration_prompts(enc), head=load_head(target=target))
    except Busy as e:
        print(f"  cannot price the candidates now ({e}): rerun `--only constant` on a quiet machine")
        FOUND.append(("specdec_np/plan.py", "constant", "price the candidates: `adopt_pair.py --only constant`, quiet"))
        return
    print(f"  this machine's costs{': ' + how if how else ' (cached)'}")
    for temperature in (0.0, 1.0):
        base = constant_plan(temperature)
        print(f"  {choice.setting_name(temperature)}: each method's fastest profiled plan, and the constant plan's "
              "record; predicted speedups over plain decoding")
        for method, names in fields.items():
            def is_base(r, names=names + ("rule",)):  # a record of the constant plan (when sampling, of its part)
                plan = Plan(**r["shape"])
                return plan == base if temperature == 0 else all(getattr(plan, f) == getattr(base, f) for f in names)
            best = choice.fastest(shipped, costs, temperature, among=method)
            try:
                mine = choice.fastest(shipped, costs, temperature, among=method, keep=is_base)
                said = f"{mine.speedup:.2f}x"
            except ValueError:
                said = "not profiled"
            print(f"    {method:12s} fastest {best.speedup:.2f}x: {choice.describe(method, best.plan)}")
            print(f"    {'':12s} constant {said}: {choice.describe(method, base)}")
    print("  docs/reference.md, 'The constant plan', quotes these speedups and says on which machine they were priced")
    FOUND.append(("docs/reference.md", "The constant plan", "the sampled speedups and the machine (from this step)"))


def pinned():
    """tests/fixtures/pinned_55d3cd9.jsonl recorded again: 55d3cd9's code (git archive) decoding with the new pair."""
    fixture = ROOT / "tests" / "fixtures" / "pinned_55d3cd9.jsonl"
    archive = subprocess.run(["git", "archive", PINNED_AT, "specdec_np"], cwd=ROOT, capture_output=True, check=True)
    with tempfile.TemporaryDirectory(prefix="specdec_np-55d3cd9-") as base:
        with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
            tar.extractall(base, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        # 55d3cd9's code reads its models from SPECDEC_NP_WEIGHTS: this checkout's (new) pair, not its own old one.
        tmp = fixture.with_suffix(".tmp")
        run([PY, "tests/fixtures/record_pinned_55d3cd9.py", base, tmp], env={"SPECDEC_NP_WEIGHTS": str(SHIPPED)})
        os.replace(tmp, fixture)
    print(f"  wrote {fixture.relative_to(ROOT)}")
    print(changed_files(fixture))


TRACE_TEST = ROOT / "tests" / "tools" / "test_trace.py"
# Its sampled run (the `run` fixture's RUNS["sampled"]): N_NEW tokens of the demo's prompt, staged, this plan.
SAMPLED_RUN = re.compile(r'^N_NEW = (\d+)$.*"sampled": dict\(temperature=1\.0, top_k=50, seed=(\d+), '
                         r'plan=Plan\(shape="fixed", widths=\(2, 2, 1\), sampled="without"\)\)', re.M | re.S)


def rejecting_seeds(tries: int = 12) -> None:
    """test_trace.py's sampled run must reject two siblings in a row (its residual test): whether its seed still
    does with this pair, else which seeds do."""
    from specdec_np.decode import generate
    from specdec_np.models import load_embedded
    from specdec_np.plan import Plan
    from specdec_np.tokenizer import encode
    from specdec_np.tools.demo import PROMPT
    from specdec_np.tools.trace import residuals

    n_new, seed = map(int, SAMPLED_RUN.search(TRACE_TEST.read_text(encoding="utf-8")).groups())
    target, draft, ngram, enc = load_embedded()
    plan = Plan(shape="fixed", widths=(2, 2, 1), sampled="without")

    def rejects_two(s):
        res = generate(target, encode(enc, PROMPT), n_new, "staged", draft, ngram, plan, temperature=1.0, top_k=50,
                       seed=s, keep_trees=True)
        return any(len(r["stages"]) > 2 for step in res.stats.steps for r in residuals(step.trace))
    if rejects_two(seed):
        print(f"  test_trace.py's sampled run (seed {seed}) rejects two siblings in a row, as its test needs")
        return
    good = [s for s in range(1, tries + 1) if s != seed and rejects_two(s)]
    print(f"  test_trace.py's sampled run (seed {seed}) no longer rejects two siblings in a row; seeds that do: {good}")
    FOUND.append(("tests/tools/test_trace.py", "RUNS['sampled'] seed", f"seed {seed} rejects no two siblings in a "
                                                                       f"row now: one of {good}"))


# The README's caption of docs/trace.png (tests/tools/test_trace.py checks its numbers against the run), any line breaks.
CAPTION = re.compile(r"(Step\s+)\d+(\s+of\s+)\d+(\s+of\s+a\s+sampled\s+staged\s+run\s+on\s+the\s+demo's\s+prompt\s+\()"
                     r"\d+(\s+tokens,\s+ended\s+by\s+)(?:an end-of-text|--max-new-tokens)\)")

ALT = re.compile(r"(!\[The trace page at step )\d+(?= of a sampled staged run\]\(docs/trace\.png\))")


def trace():
    """The README's caption of docs/trace.png from a run of the Makefile's PNG_ARGS; docs/trace.png where Chromium is."""
    make = (ROOT / "Makefile").read_text(encoding="utf-8")
    args = re.search(r"^PNG_ARGS = (.+)$", make, re.M).group(1).split()
    shot = int(re.search(r"^PNG_STEP = (\d+)$", make, re.M).group(1))
    from specdec_np.tools.demo import PROMPT

    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "trace.html"
        run([PY, "-m", "specdec_np", "trace", "-", *args, "--out", page], input=PROMPT, text=True, capture_output=True)
        html = page.read_text(encoding="utf-8")
    data = json.loads(re.search(r'<script[^>]*id="trace-data"[^>]*>(.*?)</script>', html, re.S).group(1))
    steps, tokens = len(data["steps"]), data["totals"]["tokens"]
    ended = {"eos": "an end-of-text", "max_new_tokens": "--max-new-tokens"}[data["stop"]]

    def shows_all(s):  # what test_trace.py's caption test asks of the pictured step
        return bool(s["residuals"]) and len(s["passes"]) > 1 and len(s["tree"]["tokens"]) > 4
    good = [i + 1 for i, s in enumerate(data["steps"]) if shows_all(s)]
    print(f"  the run: {steps} steps, {tokens} tokens, ended by {ended}; steps showing a residual, the draft's passes "
          f"and the mask: {good}")
    if shot not in good:
        FOUND.append(("Makefile", "PNG_STEP", f"step {shot} no longer shows a residual table: pick one of {good}"))
    rejecting_seeds()
    readme = ROOT / "README.md"
    text = readme.read_text(encoding="utf-8")
    m = CAPTION.search(text)
    if not m:
        sys.exit("trace: README.md has no caption 'Step N of M of a sampled staged run on the demo's prompt (...)'")
    new = f"{m[1]}{shot}{m[2]}{steps}{m[3]}{tokens}{m[4]}{ended})"
    text = ALT.sub(rf"\g<1>{shot}", text[:m.start()] + new + text[m.end():])  # and the picture's alt text
    readme.write_text(text, encoding="utf-8")
    print(f"  README.md's caption: {' '.join(new.split())}")
    if shutil.which(os.environ.get("CHROMIUM", "chromium")):
        run(["make", "trace-png", f"PY={PY}", "STAMP="])  # the Makefile's run and screenshot, without its venv
    else:
        FOUND.append(("docs/trace.png", "make trace-png", "needs Chromium"))
    print(changed_files(readme, ROOT / "docs" / "trace.png"))


def lesson_printed(path: Path) -> list[str]:
    """The lines a lesson prints when run with the new pair, as tests/docs/test_tutorials.py runs it (no colour, one
    BLAS thread, each timed figure measured once); a failed run goes into the checklist."""
    with tempfile.TemporaryDirectory() as work:
        env = dict(os.environ, NO_COLOR="1", OPENBLAS_NUM_THREADS="1", LESSON_QUICK_TIMING="1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        proc = subprocess.run([PY, str(path)], cwd=work, env=env, capture_output=True, text=True)
    if proc.returncode:
        FOUND.append((str(path.relative_to(ROOT)), "fails", (proc.stderr.strip().splitlines() or ["?"])[-1][:200]))
    return proc.stdout.splitlines()


NUMBER = re.compile(r"(?<![\w.-])\d+(?:\.\d+)?%?(?![\w])")
PROSE = ["README.md", "tutorials/README.md"]  # beside the lesson itself: where a lesson's printed figures are quoted


def quoted(numbers: set, lesson: Path) -> list[tuple[str, int, str]]:
    """(file, line, number) where the lesson's prose (its comments and markdown cells) quotes one of `numbers`, or
    the READMEs quote one with a decimal point or a %: an integer alone there is too common to mean the lesson."""
    hits = []
    for rel in [str(lesson.relative_to(ROOT))] + PROSE:
        for i, line in enumerate((ROOT / rel).read_text(encoding="utf-8").splitlines(), 1):
            if rel.endswith(".py") and not line.lstrip().startswith("#"):
                continue  # the lesson's code
            for n in set(NUMBER.findall(line)) & numbers:
                if rel.endswith(".py") or "." in n or "%" in n:
                    hits.append((rel, i, n))
    return hits


def lessons():
    """Each lesson run with the new pair against its notebook's lines: what changed, and where the prose quotes it."""
    if str(ROOT / "tutorials") not in sys.path:
        sys.path.insert(0, str(ROOT / "tutorials"))
    from lesson import deterministic, notebook_lines  # what a run and its notebook both print, as the tests compare

    for path in sorted((ROOT / "tutorials").glob("[0-9][0-9]*_*.py")):
        nb = json.loads((ROOT / "tutorials" / "notebooks" / f"{path.stem}.ipynb").read_text(encoding="utf-8"))
        new, old = deterministic(lesson_printed(path)), notebook_lines(nb)  # old: the notebook's run, with the old pair
        gone = [line[2:] for line in difflib.ndiff(old, new) if line.startswith("- ")]
        print(f"  {path.name}: {len(gone)} of {len(old)} printed lines changed", flush=True)
        for line in gone[:8]:
            print(f"      was: {line[:110]}")
        if gone:
            FOUND.append((str(path.relative_to(ROOT)), f"{len(gone)} printed lines changed",
                          "read its prose against the new run (the lessons step's 'was:' lines, then its notebook)"))
        # The figures the old run printed and the new one does not (beyond 0-9): what prose may still quote.
        numbers = {n for line in gone for n in NUMBER.findall(line) if len(n.rstrip("%")) > 1}
        numbers -= {n for line in new for n in NUMBER.findall(line)}
        for rel, i, n in quoted(numbers, path):
            FOUND.append((f"{rel}:{i}", path.name, f"quotes {n}, which its old run printed and the new one does not"))


def notebooks():
    """tutorials/notebooks/ rebuilt from the lessons (make_notebooks.py, OpenBLAS's own kernel; refuses when busy)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    print("  $ env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE", PY, "tutorials/make_notebooks.py", flush=True)
    subprocess.run([PY, "tutorials/make_notebooks.py"], cwd=ROOT, env=env, check=True)
    print(changed_files(ROOT / "tutorials" / "notebooks"))


def tests():
    """The whole suite (a few minutes on 2 quiet cores)."""
    run([PY, "-m", "pytest", "-q", "-p", "no:randomly"])


STEPS = [pair, calibration, profile, constant, pinned, trace, lessons, notebooks, tests]

# What no step can write: the words and figures a person measures or chooses (issue 60's list).
CHECKLIST = [
    ("weights/README.md", "the model card: recipe, corpus, shapes and why, training time and hardware, every gate's "
                          "figure (report.json; `recipe.py`'s log), the greedy completion, the EAGLE head's table"),
    ("README.md", "'It runs offline on...': the pair's sizes; the demo's table and the paragraphs under it "
                  "(`make demo`, quiet; tests/tools/test_cli.py::test_the_readmes_demo_table_counts_are_a_runs reruns "
                  "its rows' plans, named in that test, and checks every count and the prose's: update both), the "
                  "coloured completion (`--plan default`); the results paragraph and its figures (docs/results.md)"),
    ("docs/results.md", "this machine's section from `make bench ARGS=\"--limit 16\"` (quiet); the other machines' "
                        "sections marked as measured with the old pair"),
    ("docs/reference.md", "'The constant plan' (speedups, machine: the constant step); the embedded target's "
                          "description (10M parameters, trained for an hour)"),
    ("specdec_np/plan.py", "constant(): re-chosen from the constant step's table where it differs, and its docstring"),
    ("tutorials/*.py", "every lesson the lessons step flagged; then the notebooks step on a quiet machine"),
    ("tests/core/test_embedded.py", "test_weights_budget: 32 MiB -> 64 MiB (issue 60); the n_vocab 8193 check if the "
                                    "vocabulary changed"),
]


def main(argv=None) -> int:
    names = [s.__name__ for s in STEPS]
    ap = argparse.ArgumentParser(description="Redo what rests on the embedded pair's weights, step by step.")
    ap.add_argument("--list", action="store_true", help="print the steps and exit")
    ap.add_argument("--only", help=f"comma-separated steps to run ({', '.join(names)})")
    ap.add_argument("--from", dest="start", metavar="STEP", help="run this step and every later one")
    a = ap.parse_args(argv)
    if a.list:
        for s in STEPS:
            print(f"{s.__name__:12s} {s.__doc__}")
        return 0
    if a.only and a.start:
        ap.error("--only and --from: give one")
    chosen = a.only.split(",") if a.only else names[names.index(a.start):] if a.start in names else names
    if a.start and a.start not in names or (bad := [n for n in chosen if n not in names]):
        ap.error(f"no step {a.start if a.start and a.start not in names else bad[0]!r}: one of {', '.join(names)}")
    for s in STEPS:
        if s.__name__ in chosen:
            print(f"== {s.__name__}: {s.__doc__}", flush=True)
            try:
                s()
            except subprocess.CalledProcessError as e:
                sys.stderr.write(e.stderr if isinstance(e.stderr, str) else "")  # a captured command's own words
                sys.exit(f"adopt_pair: step {s.__name__}: {e.cmd[1] if len(e.cmd) > 1 else e.cmd[0]} exited with "
                         f"status {e.returncode}; fix it, then `--from {s.__name__}`")
            except KeyboardInterrupt:
                print(f"\nadopt_pair: interrupted in step {s.__name__}; `--from {s.__name__}` resumes", file=sys.stderr)
                return 130
    print("\n== checklist: by hand")
    for file, where, what in FOUND:
        print(f"  {file} ({where}): {what}")
    for file, what in CHECKLIST:
        print(f"  {file}: {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
