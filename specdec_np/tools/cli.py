"""Command line: `python -m specdec_np {generate,demo,bench,weights,ngram} ...` (see --help).

`generate` decodes with this machine's plan (`plan.plan_for`) unless `--plan default` asks for the
core's constant one; --budget, --depth, --widths, --sampled and --copy-len change either.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from ..tree import SOURCES

EXAMPLES = """examples:
  python -m specdec_np generate "def fibonacci(n):" --method staged --stats
  echo "import os" | python -m specdec_np generate - --temperature 1 --top-k 50 --seed 1
  python -m specdec_np generate --file prompt.py --method tree --budget 16 --depth 6 --plan default
  python -m specdec_np generate "def f(x):" --method staged --temperature 1 --top-k 50 --sampled without --widths 2,1,1
  python -m specdec_np generate "Hello" --target gpt2-large --draft gpt2 --method tree   (after make weights)
  python -m specdec_np demo
  python -m specdec_np bench --limit 10
  python -m specdec_np weights gpt2 gpt2-large
  python -m specdec_np ngram fit my_code/*.py --out my-trigram.npz --n-vocab 50257
"""


def add_generate_args(p: argparse.ArgumentParser) -> None:
    from ..decode import METHODS

    p.add_argument("prompt", nargs="?", help="prompt text, or - to read standard input")
    p.add_argument("--file", help="read the prompt from this file")
    p.add_argument("--target", default="tiny-target", help="target model: tiny-target (embedded), a GPT-2 name after "
                   "`make weights`, or a checkpoint directory (default: %(default)s)")
    p.add_argument("--draft", default=None, help="draft model (default: tiny-draft with the embedded target, gpt2 otherwise)")
    p.add_argument("--ngram", default=None, help="Katz trigram .npz for staged/ngram methods (default: the embedded "
                   "one, for the embedded vocabulary)")
    p.add_argument("--method", default="staged", choices=METHODS, help="decoding method (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="tokens to generate at most (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: %(default)s)")
    p.add_argument("--top-k", type=int, default=None, help="sample from the k most likely tokens only (default: off)")
    p.add_argument("--top-p", type=float, default=None, help="sample from the smallest set of tokens whose "
                   "probability reaches p (nucleus; default: off)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling (default: %(default)s)")
    p.add_argument("--plan", default="machine", choices=("machine", "default"), help="machine: the plan stored for "
                   "this machine and model pair (else the constants); default: the core's constant plan, the same "
                   "on every machine (default: %(default)s)")
    p.add_argument("--budget", type=int, default=None, help="a best-first tree of this many drafted tokens per "
                   "target pass")
    p.add_argument("--depth", type=int, default=None, help="maximum tree depth (chain length for speculative and lookup)")
    p.add_argument("--widths", default=None, help="a fixed-width tree instead: children per depth, e.g. 2,1,1")
    p.add_argument("--sampled", default=None, choices=("with", "without"),
                   help="draw tree children from the draft with/without replacement (a fixed-width tree; "
                   "default: the draft's top tokens, or at temperature > 0 a sampled chain for speculative)")
    p.add_argument("--copy-len", type=int, default=None, help="staged: when the last three tokens occurred "
                   "earlier, verify the N tokens that followed them with no draft pass; 0 = always draft")
    p.add_argument("--stats", action="store_true", help="print the plan and decoding statistics to stderr")


def choose_plan(a, target, draft, temperature):
    """The plan `generate` runs: the machine's or the constant one, with the options' changes."""
    from ..decode import Plan
    from .plan import plan_for

    plan, origin = plan_for(target, draft, temperature) if a.plan == "machine" else (Plan(), "the constant plan")
    change = {}
    if a.budget is not None or (a.depth is not None and a.method not in ("speculative", "lookup")):
        change.update(shape="best_first", budget=a.budget if a.budget is not None else plan.budget,
                      depth=a.depth if a.depth is not None else plan.depth)
    if a.depth is not None and a.method in ("speculative", "lookup"):
        change["chain"] = a.depth
    if a.widths is not None:
        change.update(shape="fixed", widths=parse_widths(a.widths))
    if a.sampled is not None:
        change["sampled"] = a.sampled
    if a.copy_len is not None:
        change["copy_len"] = a.copy_len
    for option, value in (("--budget", a.budget), ("--depth", a.depth), ("--copy-len", a.copy_len)):
        if value is not None and value < (0 if option == "--copy-len" else 1):
            raise ValueError(f"{option} must be >= {0 if option == '--copy-len' else 1}, got {value}")
    return dataclasses.replace(plan, **change), origin + (" (changed by options)" if change else "")


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
        with open(a.file, encoding="utf-8") as f:
            return f.read()
    if a.prompt == "-" or a.prompt is None and not sys.stdin.isatty():
        return sys.stdin.read()
    if a.prompt is None:
        raise ValueError("no prompt: give it as an argument, with --file, or on standard input (-)")
    return a.prompt


def cmd_generate(a) -> int:
    from ..decode import DRAFTED, generate
    from ..models import load_model, load_ngram
    from ..tokenizer import decode, encode, get_encoding
    from .plan import describe

    text = read_prompt(a)
    target = load_model(a.target)
    enc = get_encoding(target.config.n_vocab)
    draft = ngram = None
    if a.method in DRAFTED:
        draft = load_model(a.draft or ("tiny-draft" if a.target == "tiny-target" else "gpt2"))
    if a.method in ("staged", "ngram"):
        if a.ngram is None and target.config.n_vocab != 8193:
            raise ValueError("the embedded trigram is for the tiny vocabulary: fit one for this tokenizer with "
                             "`python -m specdec_np ngram fit FILES --out FILE` and pass --ngram FILE")
        ngram = load_ngram(a.ngram)
        if ngram.n_vocab != target.config.n_vocab:
            raise ValueError(f"the trigram's vocabulary ({ngram.n_vocab}) is not the target's ({target.config.n_vocab})")
    if a.copy_len is not None and a.method != "staged":
        raise ValueError("--copy-len is for --method staged")
    plan, origin = choose_plan(a, target, draft, a.temperature)
    tokens = encode(enc, text)
    t0 = time.perf_counter()
    res = generate(target, tokens, a.max_new_tokens, method=a.method, draft=draft, ngram=ngram, plan=plan,
                   temperature=a.temperature, top_k=a.top_k, top_p=a.top_p, seed=a.seed)
    dt = time.perf_counter() - t0
    sys.stdout.write(text + decode(enc, res.tokens) + "\n")
    if a.stats:
        s = res.stats
        print(f"plan ({origin}): {describe(plan, a.method)}\n"
              f"method {a.method}: {len(res.tokens)} tokens in {dt:.2f} s ({len(res.tokens) / dt:.1f} tokens/s), "
              f"stop: {res.stop_reason}\n"
              f"target passes {s.target_passes}, tokens per target pass {s.tokens_per_pass:.2f}, "
              f"draft passes {s.draft_passes}, n-gram queries {s.ngram_queries}\n"
              f"weight traffic {s.weight_traffic:.2f}"
              f" x autoregressive; time: draft {s.time_draft:.2f} s, target {s.time_target:.2f} s, "
              f"verify {s.time_verify:.2f} s\n"
              f"tokens by stage: " + ", ".join(f"{n} {s.source.count(i)}" for i, n in enumerate(SOURCES)),
              file=sys.stderr)
    return 0


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

    enc = get_encoding(args.n_vocab)
    tokens = []
    for i, name in enumerate(args.files):
        if not name.is_file():
            raise FileNotFoundError(f"text file {name} does not exist")
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
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="{generate,demo,bench,weights,ngram}")
    g = sub.add_parser("generate", help="generate a completion", epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_generate_args(g)
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
