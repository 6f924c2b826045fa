"""Command line: `python -m specdec_np {generate,trace,demo,bench,weights,ngram} ...` (see --help). `generate` decodes
with this machine's plan (`choice.choose`) or, with `--plan default`, the constant one; options change either."""

from __future__ import annotations

import argparse
import contextlib
import errno
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import ngram as ngram_lib
from ..checkpoint import CONFIG_FILE, read_config, resolve
from ..checks import ContextFilled, check_cuts, check_prompt
from ..decode import generate
from ..eagle import Head
from ..files import PROMPT_MAX_BYTES, WEIGHTS_DIR, check_regular, read_regular, read_text, utf8
from ..gpt2 import GPT2
from ..methods import METHODS
from ..models import EMBEDDED_DRAFT, EMBEDDED_HEAD, EMBEDDED_TARGET, load_head, load_ngram
from ..plan import Plan
from ..tokenizer import GPT2_N_VOCAB, cut_at_stop, decode, encode, get_encoding
from ..values import FieldError
from ..verify import RULES
from . import acceptance, bench, demo, download, trace
from .choice import changed, choose, describe
from .costcurve import apply_layout
from .machine import load_model  # checkpoint.load, after a check of this machine's memory
from .options import (as_option, candidate_methods, changes, check_fits, check_options, check_rule, profiled, reads,
                      shown)
from .progress import Progress
from .stdlib_ngram import stdlib_trigram
from .writable import check_writable

EXAMPLES = r'''examples:
  (the embedded models write Python: give them a signature and a docstring)
  python -m specdec_np generate $'def is_prime(n):\n    """Return True if n is prime."""\n' --stats
  python -m specdec_np generate --file prompt.py --method staged --temperature 1 --top-k 50 --seed 1 \
      --sampled without --widths 2,1,1
  cat prompt.py | python -m specdec_np generate - --method tree --budget 16 --depth 6 --plan default
  python -m specdec_np generate --file prompt.py --target gpt2-large --draft gpt2   (after make weights)
  python -m specdec_np trace --file prompt.py --method staged --max-new-tokens 48 --plan default --out trace.html
  python -m specdec_np demo
  python -m specdec_np bench --limit 10
  python -m specdec_np weights gpt2 gpt2-large
  python -m specdec_np ngram fit my_code/*.py --out my-trigram.npz --n-vocab 50257
'''

FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)  # a full disk, the file-size limit (ulimit -f), a quota
EMBEDDED_N_VOCAB = 8193  # the embedded models' vocabulary, the embedded trigram's
# A target's draft without --draft: the one it was made for, or its family's smallest (the paper's was 15-20x smaller).
DEFAULT_DRAFTS = {"tiny-target": "tiny-draft", "gpt2-xl": "gpt2", "gpt2-large": "gpt2", "gpt2-medium": "distilgpt2",
                  "gpt2": "distilgpt2"}
TEXT_MAX_BYTES = 1 << 28  # a text file `ngram fit` reads (about 80 million tokens, minutes of tokenizing)


@dataclass(frozen=True)
class Setup:
    """What `generate` and `trace` decode: the prompt, the models laid out for this machine, the method and plan."""

    text: str  # the prompt as given
    prompt: list  # its token ids
    target: GPT2
    draft: GPT2 | Head | None  # what `method` drafts with: the draft model, the target's EAGLE head, or nothing
    ngram: ngram_lib.Trigram | None  # if `method` reads one
    enc: object  # the target vocabulary's tokenizer (tokenizer.get_encoding)
    method: str
    plan: Plan
    about: str  # the plan in words, and how it was chosen (--stats)
    stop: tuple  # --stop's strings


def add_generate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompt", nargs="?", help="prompt text, or - to read standard input")
    p.add_argument("--file", help="read the prompt from this file")
    p.add_argument("--target", default="tiny-target", help="target model: tiny-target (embedded), a GPT-2 name after "
                   "`make weights`, or a checkpoint directory (default: %(default)s)")
    p.add_argument("--draft", help="draft model (default: the embedded draft for the embedded target; gpt2 for "
                   "gpt2-large and gpt2-xl; distilgpt2 for gpt2-medium and gpt2); with --method eagle, the target's "
                   f"EAGLE head (default: {EMBEDDED_HEAD}, the embedded target's)")
    p.add_argument("--ngram", help="Katz trigram .npz for staged/ngram methods (default: the embedded one; for GPT-2's "
                   "vocabulary, one fitted on Python's standard library on first use, cached)")
    p.add_argument("--method", choices=METHODS, help="decoding method (default: the machine plan's choice; staged "
                   "with --plan default)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="tokens to generate at most (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: %(default)s)")
    p.add_argument("--top-k", type=int, help="sample from the k most likely tokens only (default: off)")
    p.add_argument("--top-p", type=float, help="sample from the smallest set of tokens whose probability reaches p "
                   "(nucleus; default: off)")
    p.add_argument("--seed", type=int, help="seed of the sampling (default: 0); the same seed gives the same text only "
                   "with the same plan (this machine's plan may differ elsewhere: --plan default for text that is the "
                   "same on every machine)")
    p.add_argument("--plan", default="machine", choices=("machine", "default"), help="machine: the method and plan "
                   "predicted fastest here for this pair and setting; default: the core's constant plan, the same on "
                   "every machine (default: %(default)s)")
    p.add_argument("--recalibrate", action="store_true", help="measure this machine's costs again (they are cached)")
    p.add_argument("--budget", type=int, help="a best-first tree of the draft's top tokens, this many drafted tokens "
                   "per target pass (instead of the plan's tree)")
    p.add_argument("--depth", type=int, help="the best-first tree's maximum depth (the chain's length for "
                   "speculative and lookup)")
    p.add_argument("--widths", help="a fixed-width tree instead: children per depth, e.g. 2,1,1")
    p.add_argument("--sampled", choices=("with", "without"), help="draw tree children from the draft with/without "
                   "replacement (a fixed-width tree; default: the plan's choice)")
    p.add_argument("--rule", choices=tuple(RULES), help="the verification rule (default: greedy at temperature 0, "
                   "else the plan's, or the rejection rule the tree's drafting assumes); block needs a chain and "
                   "traversal a tree drawn from the draft (--sampled, or speculative at temperature > 0)")
    p.add_argument("--min-q", type=float, help="a fixed-width tree (--widths, --sampled) or a chain (--method "
                   "speculative) stops below a drafted token whose q is under this, from 0 to 1 (default: the plan's; "
                   "0 = never)")
    p.add_argument("--copy-len", type=int, help="staged: when the last three tokens occurred earlier, verify the N "
                   "tokens that followed them with no draft pass; 0 = always draft")
    p.add_argument("--stop", action="append", metavar="TEXT", help="end the completion before this text (repeatable: "
                   "at the first of them; backslash escapes understood, e.g. '\\ndef'; humaneval: HumanEval's stop "
                   "sequences, " + ", ".join(repr(s)[1:-1] for s in bench.HUMANEVAL_STOP) + ")")
    p.add_argument("--stats", action="store_true", help="print the plan and decoding statistics to stderr")


def choose_plan(a, target, draft, ngram, enc, head=None):
    """(method, plan, the plan and why in words, the models' layout ({}: their own)): `choice.choose` of the fastest of
    the methods the options allow (a head's with `head`, the target's EAGLE head), changed."""
    methods, changed_by = candidate_methods(a), changes(a)
    for method in methods or ("staged",):  # the options' tree against the target's context, whatever runs
        check_fits(changed(Plan(copy_len=0), method, changed_by), method, target.config.n_ctx)
    machine = a.plan == "machine" and draft is not None and a.method is None  # with a draft, setup loaded the n-gram
    asked = tuple(m for m in methods if profiled(m)) or None if machine else a.method
    c = choose(target, draft, ngram, enc, a.temperature, (asked,), a.plan, changed_by, a.recalibrate, head=head)[asked]
    check_rule(c.plan, c.method, a.temperature)
    return c.method, c.plan, f"{describe(c.method, c.plan)} ({c.reason()})", c.layout


def read_prompt(a) -> str:
    """The prompt: the argument, else --file's or standard input's bytes (at most PROMPT_MAX_BYTES) as UTF-8."""
    if a.file is not None and a.prompt is not None:
        raise ValueError("give the prompt either as an argument or with --file, not both")
    if a.prompt not in (None, "-"):  # undecodable bytes of the argument arrive as lone surrogates (PEP 383)
        return a.prompt if a.prompt.isascii() else utf8(os.fsencode(a.prompt), "the prompt (the argument)")
    if a.file is not None:
        where = f"--file {shown(a.file)}"
        with naming("--file", a.file):  # missing, a directory, unreadable: the system's reason, in one line
            data = read_regular(a.file, where, PROMPT_MAX_BYTES,
                                "give a file, or pipe the prompt into - (standard input)")
    elif sys.stdin is None:  # started with standard input closed (`<&-`)
        raise ValueError("no prompt: standard input is closed: give the prompt as an argument or with --file")
    elif a.prompt is None and sys.stdin.isatty():
        raise ValueError("no prompt: give it as an argument, with --file, or on standard input (-)")
    else:
        where, data = "standard input", sys.stdin.buffer.read(PROMPT_MAX_BYTES + 1)
    if len(data) > PROMPT_MAX_BYTES:
        raise ValueError(f"{where}: the prompt is over {PROMPT_MAX_BYTES >> 20} MB, more than specdec_np reads (a "
                         "1024-token context holds at most 128 kB)")
    return utf8(data, f"the prompt ({where})")


@contextlib.contextmanager
def naming(option: str, value: str | Path | None, writing: Path | None = None):
    """An OSError of the system (a name too long, a full disk `writing` there) as one line naming the option."""
    try:
        yield
    except OSError as e:
        if writing is not None and e.errno in FULL:
            raise ValueError(f"{option} {value}: {e.strerror or e}: not written (a file already there is kept)") \
                from None
        if writing is not None:
            raise ValueError(f"{option} {value}: cannot write in {writing}: {e.strerror or e}") from None
        if e.errno is None or value is None:  # the loaders' own messages name the file
            raise
        where = f" ({e.filename})" if e.filename and str(e.filename) != value and len(str(e.filename)) < 200 else ""
        raise ValueError(f"{option} {shown(value)}: {e.strerror or e}{where}") from None


def default_draft(target_arg: str) -> str:
    name = Path(target_arg).name if Path(target_arg).parent == WEIGHTS_DIR else target_arg
    with contextlib.suppress(FileNotFoundError):  # the embedded target, by any path
        if resolve(target_arg).resolve() == (WEIGHTS_DIR / "tiny-target").resolve():
            name = "tiny-target"
    if name in DEFAULT_DRAFTS:
        return DEFAULT_DRAFTS[name]
    defaults = ", ".join(f"{t} -> {d}" for t, d in DEFAULT_DRAFTS.items())
    raise ValueError(f"no default draft model for --target {target_arg}: name one with --draft (defaults: {defaults})")


def setup(a) -> Setup:
    """Check the options of `generate` (and `trace`), read the prompt, load the models, choose the plan."""
    check_options(a)
    stop, text = bench.stop_strings(a.stop), read_prompt(a)
    if getattr(a, "out", None) is not None:  # trace's page: checked after the options' own checks, before any work
        a.page = check_writable(a.out, f"--out {a.out}", example="trace.html")
    with naming("--target", a.target):
        target = load_model(a.target)
    try:
        check_cuts(a.top_k, None, target.config.n_vocab)  # a top-k that keeps every token changes nothing
    except FieldError as e:
        raise as_option(e) from None
    enc = get_encoding(target.config.n_vocab)
    draft = ngram = eagle_head = None
    runs_draft = a.method is None or METHODS[a.method].drafts_with  # with --method, or maybe the machine's choice
    head = a.method is not None and METHODS[a.method].drafts_with == "head"  # its draft is the target's EAGLE head
    if reads("draft", a.method, a.plan):
        try:
            draft_name = a.draft or (EMBEDDED_HEAD if head else default_draft(a.target))
            with naming("--draft" if a.draft else "--target", a.draft or a.target):
                draft = load_head(draft_name, target) if head else load_model(draft_name)
        except (ValueError, FileNotFoundError):
            if a.draft is not None or runs_draft:
                raise  # else only the pair's profile would have read it: the constant plan
        if draft is not None and draft.config.n_vocab != target.config.n_vocab:
            raise ValueError(f"--draft {shown(draft_name)}: its vocabulary ({draft.config.n_vocab} tokens) is not "
                             f"the target's ({target.config.n_vocab}, --target {shown(a.target)}): the two must "
                             "share a tokenizer")
        if head and a.plan == "machine":  # its plan is priced on the pair's profile: with the default draft model
            eagle_head, draft = draft, None
            with contextlib.suppress(ValueError, FileNotFoundError):  # none to load: the constant plan, said
                draft = load_model(default_draft(a.target))
        elif a.method is None and a.plan == "machine":  # the target's EAGLE head too, where it has one
            with contextlib.suppress(ValueError, FileNotFoundError):  # whose plans its profile counts (`head_missing`)
                eagle_head = load_head(EMBEDDED_HEAD, target)
    if a.method is not None and METHODS[a.method].needs_ngram or draft is not None and reads("ngram", a.method, a.plan):
        if a.ngram is None and target.config.n_vocab != EMBEDDED_N_VOCAB:  # none ships for real GPT-2's vocabulary
            ngram = stdlib_trigram(target.config.n_vocab, Progress("building the trigram (first run only)"))
        else:
            with naming("--ngram", a.ngram):
                ngram = load_ngram(a.ngram)
            if ngram.n_vocab != target.config.n_vocab:
                raise ValueError(f"--ngram {a.ngram}: the trigram's vocabulary ({ngram.n_vocab}) is not the target's "
                                 f"({target.config.n_vocab})")
    size, longest = len(text.encode()), max(len(t) for t in [*enc.token_byte_values(), *enc.special_tokens_set])
    if size >= target.config.n_ctx * longest:  # so at least n_ctx tokens: said before tokenizing them all
        raise ValueError(f"--target {shown(a.target)}: the prompt has {size} bytes, so at least "
                         f"{math.ceil(size / longest)} tokens (a token is at most {longest} bytes): the target's "
                         f"context (n_ctx={target.config.n_ctx}) must hold more; shorten it")
    try:  # the draft model's context too when it may decode (an EAGLE head's is the target's)
        prompt = check_prompt(encode(enc, text), target, draft if runs_draft and not head else None, METHODS)
    except ContextFilled as e:  # named by the option that chose the model
        raise ValueError(f"--{e.model} {a.target if e.model == 'target' else draft_name}: {e}") from None
    method, plan, about, layout = choose_plan(a, target, draft, ngram, enc, eagle_head)
    target, draft, eagle_head = apply_layout(layout, target, draft, eagle_head)  # --plan default's head: draft
    return Setup(text, prompt, target, enc=enc, method=method, plan=plan, about=about, stop=stop,
                 **acceptance.models_for(method, draft, ngram, eagle_head or draft))


def run(a, keep_trees=False) -> tuple:
    """(Setup, generate's Result) for the options `a`; --stats printed to stderr."""
    s, t0 = setup(a), time.perf_counter()
    res = generate(s.target, s.prompt, a.max_new_tokens, method=s.method, draft=s.draft, ngram=s.ngram, plan=s.plan,
                   temperature=a.temperature, top_k=a.top_k, top_p=a.top_p, seed=a.seed or 0, keep_trees=keep_trees,
                   stop=s.stop)
    dt = time.perf_counter() - t0
    if res.stop_reason == "context":
        print(f"note: generation stopped after {len(res.tokens)} tokens at the end of the target's context "
              f"({s.target.config.n_ctx} tokens)", file=sys.stderr)
    st = res.stats
    if a.stats:
        about = s.about + (f"; seed {a.seed or 0}" if a.temperature else "")  # a seed repeats with its plan only
        print(f"method {s.method}: {about}\n{len(res.tokens)} tokens in {dt:.2f} s ({len(res.tokens) / dt:.1f} "
              f"tokens/s), stop: {res.stop_reason}{f' (--stop: {bench.stops_said(s.stop)})' * bool(s.stop)}"
              f"\ntarget passes {st.target_passes}, tokens per target pass {st.tokens_per_pass:.2f}, draft passes "
              f"{st.draft_passes}, n-gram queries {st.ngram_queries}\n"
              f"weight traffic {st.weight_traffic:.2f} x autoregressive; time: draft {st.time_draft:.2f} s, target "
              f"{st.time_target:.2f} s, verify {st.time_verify:.2f} s\ntokens by stage: "
              + ", ".join(f"{n} {count}" for n, count in st.tally.items()), file=sys.stderr)
    return s, res


def cmd_generate(a) -> int:
    s, res = run(a)
    # The end-of-text token ends the text, and a stop string: neither is part of it (--stats says "stop: eos").
    tokens = res.tokens[:-1] if res.stop_reason == "eos" else res.tokens
    sys.stdout.write(s.text + cut_at_stop(decode(s.enc, tokens), s.stop) + "\n")
    return 0


def cmd_trace(a) -> int:
    """Decode as `generate` would, keeping every step's tree, and write the run as one HTML page."""
    s, res = run(a, keep_trees=True)
    words = [f"temperature {a.temperature:g}", a.top_k and f"top-k {a.top_k}", a.top_p and f"top-p {a.top_p:g}",
             f"seed {a.seed or 0}"]
    sampling = ", ".join(w for w in words if w) if a.temperature else "greedy"
    costs = trace.pass_costs(s.target, s.draft, res, s.prompt)  # each pass as multiples of a one-token pass
    with naming("--out", a.out, Path(a.out).parent):
        trace.write(a.page, res, s.enc, s.prompt, s.method, f"{s.about}; {sampling}", costs)
    print(f"wrote {a.out}: {len(res.stats.steps)} steps, {len(res.tokens)} tokens; open it in a browser "
          "(arrow keys step through the run)", file=sys.stderr)
    return 0


def cmd_ngram(argv) -> int:
    """`python -m specdec_np ngram fit FILES... --out PATH [--n-vocab N | --vocab-from CHECKPOINT]`."""
    ap = argparse.ArgumentParser(prog="python -m specdec_np ngram",
                                 description="Fit a Katz backoff trigram on GPT-2 BPE tokens of text files.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fit", help="tokenize FILES (joined by <|endoftext|>) and fit a trigram")
    f.add_argument("files", nargs="+", type=Path)
    f.add_argument("--out", required=True, type=Path, help="output .npz (not one of FILES)")
    vocab = f.add_mutually_exclusive_group()
    vocab.add_argument("--n-vocab", type=int, default=GPT2_N_VOCAB, help="vocabulary size of the models it drafts "
                       f"for: {GPT2_N_VOCAB} for GPT-2 (the default), {EMBEDDED_N_VOCAB} for the embedded tiny models")
    vocab.add_argument("--vocab-from", metavar="CHECKPOINT", help="take the vocabulary size from this checkpoint (a "
                       "directory or a model's name, e.g. tiny-target)")
    f.add_argument("--min-count", type=int, default=1, help="drop trigrams seen fewer times (smaller file)")
    f.add_argument("--katz-k", type=int, default=ngram_lib.KATZ_K, help="counts above this are not discounted "
                   "(default: %(default)s)")
    args = ap.parse_args(argv)
    if args.min_count < 1:
        raise ValueError(f"--min-count must be >= 1 (1 keeps every trigram), got {args.min_count}")
    if not 257 <= args.n_vocab <= GPT2_N_VOCAB:
        raise ValueError(f"--n-vocab must be in 257..{GPT2_N_VOCAB} (the 256 bytes and <|endoftext|>, up to GPT-2's "
                         f"vocabulary), got {args.n_vocab}")
    out = check_writable(args.out, f"--out {args.out}", example="trigram.npz")
    n_vocab = read_config(resolve(args.vocab_from) / CONFIG_FILE).n_vocab if args.vocab_from else args.n_vocab
    enc, tokens = get_encoding(n_vocab), []
    for i, name in enumerate(args.files):
        with naming("text file", str(name)):  # missing, a directory, a name too long: the system's reason
            check_regular(name, f"text file {name}")
            if out.exists() and os.path.samefile(name, out):  # the same file, also through a link: never replace it
                raise ValueError(f"--out {args.out} is the input {name}: fitting would replace it; write elsewhere")
            text = read_text(name, f"text file {name}", TEXT_MAX_BYTES)
        if i:  # the files joined by <|endoftext|>
            tokens.append(enc.eot_token)
        tokens.extend(encode(enc, text))
    # No n-gram is seen more often than the stream is long: a larger --katz-k changes nothing.
    if not 1 <= args.katz_k <= ngram_lib.max_katz_k(len(tokens)):
        raise ValueError(f"--katz-k must be in 1..{ngram_lib.max_katz_k(len(tokens))} (no n-gram of the files' "
                         f"{len(tokens)} tokens is seen more often), got {args.katz_k}")
    model = ngram_lib.fit(np.array(tokens, dtype=np.int64), n_vocab, katz_k=args.katz_k, min_count=args.min_count)
    with naming("--out", args.out, args.out.parent):
        ngram_lib.save(model, out)
    print(f"fitted a trigram on {len(tokens)} tokens from {len(args.files)} files: {len(model.bi_tok)} bigrams, "
          f"{len(model.tri_tok)} trigrams -> {args.out} ({args.out.stat().st_size / 1e6:.1f} MB)")
    return 0


def out_of_memory(cmd: str, args) -> str:
    """A MemoryError of `cmd` in words: the models it runs, each one's float32 weights and KV cache of n_ctx tokens."""
    if cmd in ("generate", "trace"):
        models = [("--target", args.target)]
        if args.draft is not None or args.method is None or METHODS[args.method].drafts_with:
            with contextlib.suppress(ValueError):
                models.append(("--draft" if args.draft else "its draft", args.draft or default_draft(args.target)))
    elif cmd in ("demo", "bench"):
        models = [("the embedded target", EMBEDDED_TARGET), ("the embedded draft", EMBEDDED_DRAFT)]
    else:  # ngram fit, weights: no model in memory
        return f"out of memory in {cmd}"
    needs = []
    for option, name in models:
        try:
            config = read_config(resolve(name) / CONFIG_FILE)
        except (ValueError, OSError, MemoryError):
            needs.append(f"{option} {shown(name)}")
            continue
        cache = 2 * config.n_layer * config.n_ctx * config.n_embd  # K and V
        needs.append(f"{option} {shown(name)} needs {4 * config.n_params / 1e6:,.1f} MB of float32 weights and "
                     f"{4 * cache / 1e6:,.1f} MB of KV cache")
    return f"out of memory in {cmd}: {'; '.join(needs)} (free some memory, or use smaller models)"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(prog="python -m specdec_np",
                                 description="Staged speculative decoding for GPT-2 in NumPy.", epilog=EXAMPLES,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, text in (("generate", "generate a completion"),
                       ("trace", "decode like generate and write every step as one HTML page")):
        add_generate_args(sub.add_parser(name, help=text, epilog=EXAMPLES,
                                         formatter_class=argparse.RawDescriptionHelpFormatter))
    sub.choices["trace"].add_argument("--out", default="trace.html", help="the page to write (default: %(default)s)")
    own = {"demo": "the offline demo on the embedded models", "bench": "benchmark: the paper's tables on this CPU",
           "weights": "download real GPT-2 checkpoints into specdec_np/weights/",
           "ngram": "fit a Katz trigram on text files"}
    for name, text in own.items():
        sub.add_parser(name, help=text, add_help=False)
    args = argv[1:] if argv and argv[0] in own else ap.parse_args(argv)  # those parse their own
    cmd = argv[0] if argv and argv[0] in own else args.cmd
    if sys.stderr is None:  # started with standard error closed (`2>&-`): print(file=None) would write to stdout
        sys.stderr = open(os.devnull, "w")
    if sys.stdout is None and cmd in ("generate", "demo"):  # `>&-`: said before any work, not a traceback after it
        print(f"error: standard output is closed: the {'completion' if cmd == 'generate' else 'demo'} has nowhere to "
              "go (redirect it, e.g. > out.txt)", file=sys.stderr)
        return 2
    real, sys.stdout = sys.stdout, sys.stdout and Stdout(sys.stdout)
    try:
        code = {"generate": cmd_generate, "trace": cmd_trace, "weights": download.main, "ngram": cmd_ngram,
                "demo": demo.main, "bench": bench.main}[cmd](args)
        if sys.stdout is not None:
            sys.stdout.flush()  # a full disk is said here, in one line, not by Python as it exits
        return code
    except (ValueError, OSError, MemoryError) as e:
        print(f"error: {out_of_memory(cmd, args) if isinstance(e, MemoryError) else e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        if sys.stdout is not None and sys.stdout.replaced:
            print(f"note: standard output's encoding ({real.encoding}) cannot show some characters: they are written "
                  "as '?' (PYTHONIOENCODING=utf-8 shows them)", file=sys.stderr)
        sys.stdout = real


class Stdout:
    """Standard output for a command: characters it cannot encode written as '?' (said once); a failed write: error."""

    def __init__(self, stream):
        self.stream, self.replaced = stream, False

    def __getattr__(self, name):  # isatty(), encoding, ...
        return getattr(self.stream, name)

    def write(self, text: str) -> int:
        encoding = getattr(self.stream, "encoding", None) or "utf-8"
        fits = text.encode(encoding, "replace").decode(encoding)
        self.replaced |= fits != text
        return self.written(self.stream.write, fits)

    def flush(self) -> None:
        self.written(self.stream.flush)

    def written(self, write, *args):
        try:
            return write(*args)
        except OSError as e:
            with contextlib.suppress(OSError, ValueError):  # what could not be written is dropped, not tried at exit
                fd = self.stream.fileno()
                os.dup2(os.open(os.devnull, os.O_WRONLY), fd)
            raise ValueError(f"cannot write to standard output: {e.strerror or e}") from None


if __name__ == "__main__":
    sys.exit(main())
