"""Command line: `python -m specdec_np {generate,trace,demo,bench,weights,ngram} ...` (see --help).

`generate` decodes with this machine's plan (`plan.plan_for`: the method and plan the cost model
predicts fastest here, measured in seconds on first use) unless `--plan default` asks for the
core's constant one; --method, --budget, --depth, --widths, --sampled, --rule and --copy-len change either.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from ..tree import SOURCES
from ..verify import RULES

if TYPE_CHECKING:
    from ..decode import Plan
    from ..gpt2 import GPT2

EXAMPLES = r'''examples:
  (the embedded models write Python: give them a signature and a docstring)
  python -m specdec_np generate $'def is_prime(n):\n    """Return True if n is prime."""\n' --stats
  python -m specdec_np generate --file prompt.py --temperature 1 --top-k 50 --seed 1
  python -m specdec_np generate --file prompt.py --method tree --budget 16 --depth 6 --plan default
  python -m specdec_np generate --file prompt.py --method staged --temperature 1 --top-k 50 --sampled without --widths 2,1,1
  cat prompt.py | python -m specdec_np generate - --method speculative --depth 3
  python -m specdec_np generate --file prompt.py --target gpt2-large --draft gpt2 --ngram my-trigram.npz   (after make weights)
  python -m specdec_np trace --file prompt.py --method staged --max-new-tokens 48 --out trace.html
  python -m specdec_np demo
  python -m specdec_np bench --limit 10
  python -m specdec_np weights gpt2 gpt2-large
  python -m specdec_np ngram fit my_code/*.py --out my-trigram.npz --n-vocab 50257
'''

TRACE_EXAMPLES = r'''examples:
  python -m specdec_np trace --file prompt.py --method staged --max-new-tokens 48 --plan default --out trace.html
  python -m specdec_np trace --file prompt.py --method staged --temperature 1 --top-k 50 --sampled without --widths 2,1,1
'''


def add_generate_args(p: argparse.ArgumentParser) -> None:
    from ..decode import METHODS

    p.add_argument("prompt", nargs="?", help="prompt text, or - to read standard input")
    p.add_argument("--file", help="read the prompt from this file")
    p.add_argument("--target", default="tiny-target", help="target model: tiny-target (embedded), a GPT-2 name after "
                   "`make weights`, or a checkpoint directory (default: %(default)s)")
    p.add_argument("--draft", default=None, help="draft model (default: the embedded draft for the embedded target; "
                   "gpt2 for gpt2-large and gpt2-xl; distilgpt2 for gpt2-medium and gpt2)")
    p.add_argument("--ngram", default=None, help="Katz trigram .npz for staged/ngram methods (default: the embedded "
                   "one, for the embedded vocabulary)")
    p.add_argument("--method", default=None, choices=METHODS, help="decoding method (default: the machine plan's "
                   "choice; staged with --plan default)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="tokens to generate at most (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: %(default)s)")
    p.add_argument("--top-k", type=int, default=None, help="sample from the k most likely tokens only (default: off)")
    p.add_argument("--top-p", type=float, default=None, help="sample from the smallest set of tokens whose "
                   "probability reaches p (nucleus; default: off)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling (default: %(default)s)")
    p.add_argument("--plan", default="machine", choices=("machine", "default"), help="machine: the method and plan "
                   "predicted fastest on this machine for this pair and setting; default: the core's constant plan, "
                   "the same on every machine (default: %(default)s)")
    p.add_argument("--recalibrate", action="store_true", help="measure this machine's costs again (they are cached "
                   "in the user's cache directory after the first run)")
    p.add_argument("--budget", type=int, default=None, help="a best-first tree of the draft's top tokens, this many "
                   "drafted tokens per target pass (instead of the plan's tree)")
    p.add_argument("--depth", type=int, default=None, help="the best-first tree's maximum depth (the chain's length "
                   "for speculative and lookup)")
    p.add_argument("--widths", default=None, help="a fixed-width tree instead: children per depth, e.g. 2,1,1")
    p.add_argument("--sampled", default=None, choices=("with", "without"),
                   help="draw tree children from the draft with/without replacement (a fixed-width tree; "
                   "default: the plan's choice)")
    p.add_argument("--rule", default=None, choices=tuple(RULES), help="the verification rule (default: greedy at "
                   "temperature 0, else the plan's, or the rejection rule the tree's drafting assumes); block needs a "
                   "chain and traversal a tree drawn from the draft (--sampled, or speculative at temperature > 0)")
    p.add_argument("--copy-len", type=int, default=None, help="staged: when the last three tokens occurred "
                   "earlier, verify the N tokens that followed them with no draft pass; 0 = always draft")
    p.add_argument("--stats", action="store_true", help="print the plan and decoding statistics to stderr")


def choose_plan(a, target, draft, ngram, enc, temperature):
    """(method, plan, where it came from, layout): the machine's choice or the constants, with the options'
    changes; `layout` is the machine's layout of the models' products (`plan.Choice.models`; {}: the models' own)."""
    from ..decode import CHAINS, Plan
    from .plan import check_size, describe, plan_for, progress_bar, resized

    if a.plan == "default" or a.method in ("ar", "ngram") or draft is None:
        # Plain decoding needs no plan; the n-gram drafting alone is not profiled; a target with no
        # draft has no pair to profile.
        method, plan, origin, layout = a.method or "staged", Plan(), "the constant plan", {}
    else:
        choice = plan_for(target, draft, ngram, enc, temperature, a.method, a.recalibrate,
                          progress_bar("measuring this machine (first run only)"))
        method, plan, origin, layout = choice.method, choice.plan, choice.origin, choice.layout
    shaping = [o for o, v in (("--budget", a.budget), ("--depth", a.depth), ("--widths", a.widths),
                              ("--sampled", a.sampled)) if v is not None]
    if method == "ar" and shaping:
        chosen = "--method ar" if a.method == "ar" else "this machine's plan (plain decoding)"
        raise ValueError(f"{shaping[0]}: {chosen} drafts no tree; choose a drafting method with --method")
    if a.budget is not None and method in CHAINS:
        raise ValueError(f"--budget: method {method} proposes a chain: its length is --depth")
    if (a.budget is not None or a.depth is not None and method not in CHAINS) \
            and (a.widths is not None or a.sampled is not None):
        raise ValueError(f"{shaping[0]} asks for a best-first tree, {shaping[-1]} for a fixed-width one: give one")
    change = {}
    if a.widths is not None:
        change.update(shape="fixed", widths=parse_widths(a.widths))
    if a.sampled is not None:
        change["sampled"] = a.sampled
    if a.copy_len is not None:
        change["copy_len"] = a.copy_len
    if a.rule is not None:
        change["rule"] = a.rule
    options = bool(shaping or change)
    plan = dataclasses.replace(resized(plan, method, a.budget, a.depth), **change)
    check_rule(plan, method, temperature)
    n_ctx = target.config.n_ctx
    check_size(plan, method, n_ctx)
    if method == "staged" and plan.copy_len > n_ctx:
        raise ValueError(f"--copy-len must be at most the target's context ({n_ctx} tokens), got {plan.copy_len}")
    return method, plan, f"{describe(plan, method)} ({origin}{', changed by options' if options else ''})", layout


def check_rule(plan, method: str, temperature: float) -> None:
    """decode.check_rule's error, naming --rule: the plan's rule must be lossless for the trees the method drafts."""
    from ..decode import check_rule as core_check

    try:
        core_check(plan, method, temperature)
    except ValueError as e:
        raise ValueError(f"--rule {plan.rule}: {e}") from None


def parse_widths(text):
    if text is None:
        return None
    try:
        widths = [int(w) for w in text.split(",")]
    except ValueError:
        widths = []
    if not widths or min(widths) < 1:
        raise ValueError(f"--widths {text!r}: give positive integers separated by commas, e.g. 2,1,1")
    return widths


def read_prompt(a) -> str:
    if a.file and a.prompt:
        raise ValueError("give the prompt either as an argument or with --file, not both")
    if a.file:
        try:
            with open(a.file, "rb") as f:
                return utf8(f.read(), f"--file {a.file}")
        except OSError as e:  # missing, a directory, unreadable: say which option and why, in one line
            raise ValueError(f"--file {a.file}: {e.strerror or e}") from None
    if a.prompt == "-" or a.prompt is None and not sys.stdin.isatty():
        return utf8(sys.stdin.buffer.read(), "standard input")
    if a.prompt is None:
        raise ValueError("no prompt: give it as an argument, with --file, or on standard input (-)")
    return a.prompt


def utf8(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"the prompt ({where}) is not UTF-8 text: byte {e.start} is {data[e.start:e.start + 1]!r}") \
            from None


# A target without a draft named on the command line gets the draft it was made for, or the
# smallest model of its family (the paper's draft was 15-20x smaller than its target).
DEFAULT_DRAFTS = {"gpt2-xl": "gpt2", "gpt2-large": "gpt2", "gpt2-medium": "distilgpt2", "gpt2": "distilgpt2"}


def default_draft(target_arg: str) -> str:
    from ..checkpoint import WEIGHTS_DIR, resolve

    embedded = WEIGHTS_DIR / "tiny-target"
    try:
        if target_arg == "tiny-target" or resolve(target_arg).resolve() == embedded.resolve():
            return "tiny-draft"
    except FileNotFoundError:
        pass
    name = Path(target_arg).name if Path(target_arg).parent == WEIGHTS_DIR else target_arg
    if name in DEFAULT_DRAFTS:
        return DEFAULT_DRAFTS[name]
    raise ValueError(f"no default draft model for --target {target_arg}: name one with --draft "
                     f"(defaults: tiny-target -> tiny-draft, " + ", ".join(f"{t} -> {d}" for t, d in DEFAULT_DRAFTS.items())
                     + ")")


def check_options(a) -> None:
    """One-line errors naming the option, before any model is loaded."""
    if a.max_new_tokens < 0:
        raise ValueError(f"--max-new-tokens must be >= 0, got {a.max_new_tokens}")
    if a.seed < 0:
        raise ValueError(f"--seed must be >= 0, got {a.seed}")
    if not a.temperature >= 0 or a.temperature == float("inf"):
        raise ValueError(f"--temperature must be a finite number >= 0 (0 = greedy), got {a.temperature}")
    if a.top_k is not None and a.top_k < 1:
        raise ValueError(f"--top-k must be >= 1, got {a.top_k}")
    if a.top_p is not None and not 0 < a.top_p <= 1:
        raise ValueError(f"--top-p must be in (0, 1], got {a.top_p}")
    for option, value, low in (("--budget", a.budget, 1), ("--depth", a.depth, 1), ("--copy-len", a.copy_len, 0)):
        if value is not None and value < low:
            raise ValueError(f"{option} must be >= {low}, got {value}")
    parse_widths(a.widths)
    if a.copy_len is not None and a.method not in (None, "staged"):
        raise ValueError("--copy-len is for --method staged")
    if a.rule is not None and a.temperature == 0 and a.rule != "greedy":
        raise ValueError(f"--rule {a.rule}: at temperature 0 verification is greedy (or pass --rule greedy)")


class Setup(NamedTuple):
    """What a decoding command decodes: the prompt's text, the models, the method and plan."""
    text: str
    target: GPT2
    draft: GPT2 | None
    ngram: object  # ngram.Trigram or None
    enc: object  # tiktoken.Encoding
    method: str
    plan: Plan
    about: str  # the plan in words, and where it came from


def setup(a) -> Setup:
    """Check the options of `generate` (and `trace`), read the prompt, load the models, choose the plan."""
    from ..decode import DRAFTED
    from ..models import load_model, load_ngram
    from ..tokenizer import get_encoding
    from .plan import apply_layout

    check_options(a)
    text = read_prompt(a)
    target = load_model(a.target)
    enc = get_encoding(target.config.n_vocab)
    draft = ngram = None
    if a.method is None or a.method in DRAFTED:
        draft = load_model(a.draft or default_draft(a.target))
    elif a.method == "lookup" and a.plan == "machine":  # the pair's profile holds lookup's chain lengths
        try:
            draft = load_model(a.draft or default_draft(a.target))
        except (ValueError, FileNotFoundError):
            draft = None
    # The machine's plan is chosen from the profile of the whole pair (target, draft, trigram).
    wants_ngram = a.method in ("staged", "ngram") or (draft is not None and a.plan == "machine")
    if a.method is None or wants_ngram:
        if a.ngram is None and target.config.n_vocab != 8193:
            if a.method in ("staged", "ngram"):
                raise ValueError("the embedded trigram is for the tiny vocabulary: fit one for this tokenizer with "
                                 "`python -m specdec_np ngram fit FILES --out FILE` and pass --ngram FILE")
        else:
            ngram = load_ngram(a.ngram)
            if ngram.n_vocab != target.config.n_vocab:
                raise ValueError(f"the trigram's vocabulary ({ngram.n_vocab}) is not the target's "
                                 f"({target.config.n_vocab})")
    method, plan, about, layout = choose_plan(a, target, draft, ngram, enc, a.temperature)
    target, draft = apply_layout(layout, target, draft)
    if a.copy_len is not None and method != "staged":
        raise ValueError("--copy-len is for --method staged")
    return Setup(text, target, draft, ngram, enc, method, plan, about)


def run(a, s: Setup, keep_trees=False):
    """(the prompt's tokens, generate's Result, seconds) for the options `a`."""
    from ..decode import generate
    from ..tokenizer import encode

    tokens = encode(s.enc, s.text)
    t0 = time.perf_counter()
    res = generate(s.target, tokens, a.max_new_tokens, method=s.method, draft=s.draft, ngram=s.ngram, plan=s.plan,
                   temperature=a.temperature, top_k=a.top_k, top_p=a.top_p, seed=a.seed, keep_trees=keep_trees)
    dt = time.perf_counter() - t0
    if res.stop_reason == "context":
        print(f"note: generation stopped after {len(res.tokens)} tokens at the end of the target's context "
              f"({s.target.config.n_ctx} tokens)", file=sys.stderr)
    if a.stats:
        print_stats(s, res, dt)
    return tokens, res, dt


def print_stats(s: Setup, res, dt: float) -> None:
    st = res.stats
    print(f"method {s.method}: {s.about}\n"
          f"{len(res.tokens)} tokens in {dt:.2f} s ({len(res.tokens) / dt:.1f} tokens/s), "
          f"stop: {res.stop_reason}\n"
          f"target passes {st.target_passes}, tokens per target pass {st.tokens_per_pass:.2f}, "
          f"draft passes {st.draft_passes}, n-gram queries {st.ngram_queries}\n"
          f"weight traffic {st.weight_traffic:.2f}"
          f" x autoregressive; time: draft {st.time_draft:.2f} s, target {st.time_target:.2f} s, "
          f"verify {st.time_verify:.2f} s\n"
          f"tokens by stage: " + ", ".join(f"{n} {st.source.count(i)}" for i, n in enumerate(SOURCES)),
          file=sys.stderr)


def cmd_generate(a) -> int:
    from ..tokenizer import decode

    s = setup(a)
    _, res, _ = run(a, s)
    sys.stdout.write(s.text + decode(s.enc, res.tokens) + "\n")
    return 0


def cmd_trace(a) -> int:
    """Decode as `generate` would, keeping every step's tree, and write the run as one HTML page."""
    from .trace import write

    out = file_to_write(Path(a.out), "trace.html")
    s = setup(a)
    tokens, res, _ = run(a, s, keep_trees=True)
    write(out, res, s.enc, tokens, s.method, f"{s.about}; {sampling_words(a)}")
    print(f"wrote {out}: {len(res.stats.steps)} steps, {len(res.tokens)} tokens; open it in a browser "
          "(arrow keys step through the run)", file=sys.stderr)
    return 0


def file_to_write(out: Path, example: str) -> Path:
    """--out checked before any work: a file in a directory that exists (a one-line error otherwise)."""
    if out.is_dir():
        raise ValueError(f"--out {out} is a directory: give the file to write, e.g. {out / example}")
    if not out.parent.is_dir():
        raise ValueError(f"--out {out}: the directory {out.parent} does not exist")
    return out


def sampling_words(a) -> str:
    """The sampling options in words: "greedy", or "temperature 1, top-k 50, seed 0"."""
    if a.temperature == 0:
        return "greedy"
    words = [f"temperature {a.temperature:g}"]
    if a.top_k is not None:
        words.append(f"top-k {a.top_k}")
    if a.top_p is not None:
        words.append(f"top-p {a.top_p:g}")
    return ", ".join(words + [f"seed {a.seed}"])


def cmd_ngram(argv) -> int:
    """`python -m specdec_np ngram fit FILES... --out PATH [--n-vocab 50257]`; argv starts after `ngram`."""
    import numpy as np

    from .. import ngram
    from ..tokenizer import encode, get_encoding

    ap = argparse.ArgumentParser(prog="python -m specdec_np ngram",
                                 description="Fit a Katz backoff trigram on GPT-2 BPE tokens of text files.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fit", help="tokenize FILES (joined by <|endoftext|>) and fit a trigram")
    f.add_argument("files", nargs="+", type=Path)
    f.add_argument("--out", required=True, type=Path, help="output .npz")
    f.add_argument("--n-vocab", type=int, default=50257, help="vocabulary size of the model it drafts for")
    f.add_argument("--min-count", type=int, default=1, help="drop trigrams seen fewer times (smaller file)")
    f.add_argument("--katz-k", type=int, default=5, help="counts above this are not discounted")
    args = ap.parse_args(argv)
    file_to_write(args.out, "trigram.npz")
    enc = get_encoding(args.n_vocab)
    tokens = []
    for i, name in enumerate(args.files):
        if not name.is_file():
            raise FileNotFoundError(f"text file {name} " + ("is a directory" if name.is_dir() else "does not exist"))
        if i:
            tokens.append(enc.eot_token)
        tokens.extend(encode(enc, name.read_text(encoding="utf-8")))
    model = ngram.fit(np.array(tokens, dtype=np.int64), args.n_vocab, katz_k=args.katz_k, min_count=args.min_count)
    ngram.save(model, args.out)
    print(f"fitted a trigram on {len(tokens)} tokens from {len(args.files)} files: "
          f"{len(model.bi_tok)} bigrams, {len(model.tri_tok)} trigrams -> {args.out} "
          f"({args.out.stat().st_size / 1e6:.1f} MB)")
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(prog="python -m specdec_np", description="Staged speculative decoding for GPT-2 in NumPy.",
                                 epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="{generate,trace,demo,bench,weights,ngram}")
    g = sub.add_parser("generate", help="generate a completion", epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_generate_args(g)
    t = sub.add_parser("trace", help="decode like generate and write every step as one HTML page",
                       epilog=TRACE_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_generate_args(t)
    t.add_argument("--out", default="trace.html", help="the HTML file to write (default: %(default)s)")
    sub.add_parser("demo", help="the offline demo on the embedded models", add_help=False)
    sub.add_parser("bench", help="benchmark: the paper's tables on this CPU", add_help=False)
    sub.add_parser("weights", help="download real GPT-2 checkpoints into weights/", add_help=False)
    sub.add_parser("ngram", help="fit a Katz trigram on text files", add_help=False)
    if argv and argv[0] in ("demo", "bench", "weights", "ngram"):  # these parse their own arguments
        cmd, rest = argv[0], argv[1:]
    else:
        a = ap.parse_args(argv)
        cmd, rest = a.cmd, None
    try:
        if cmd == "generate":
            return cmd_generate(a)
        if cmd == "trace":
            return cmd_trace(a)
        if cmd == "weights":
            from .download import main as weights_main
            return weights_main(rest)
        if cmd == "ngram":
            return cmd_ngram(rest)
        if cmd == "demo":
            from .demo import main as demo_main
            return demo_main(rest)
        from .bench import main as bench_main
        return bench_main(rest)
    except (ValueError, FileNotFoundError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
