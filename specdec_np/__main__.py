"""Command line: `python -m specdec_np {generate,demo,bench,weights,ngram} ...` (see --help)."""

from __future__ import annotations

import argparse
import sys
import time

EXAMPLES = """examples:
  python -m specdec_np generate "def fibonacci(n):" --method staged --stats
  echo "import os" | python -m specdec_np generate - --temperature 1 --top-k 50 --seed 1
  python -m specdec_np generate --file prompt.py --method tree --budget 16 --depth 6
  python -m specdec_np generate "def f(x):" --method staged --temperature 1 --top-k 50 --sampled without --widths 2,1,1
  python -m specdec_np generate "Hello" --target gpt2-large --draft gpt2 --method tree   (after make weights)
  python -m specdec_np demo
  python -m specdec_np bench --limit 10
  python -m specdec_np weights gpt2 gpt2-large
  python -m specdec_np ngram fit my_code/*.py --out my-trigram.npz --n-vocab 50257
"""


def add_generate_args(p: argparse.ArgumentParser) -> None:
    from .decode import METHODS

    p.add_argument("prompt", nargs="?", help="prompt text, or - to read standard input")
    p.add_argument("--file", help="read the prompt from this file")
    p.add_argument("--target", default="tiny-target", help="target model: tiny-target (embedded), a GPT-2 name after `make weights`, or a checkpoint directory (default: %(default)s)")
    p.add_argument("--draft", default=None, help="draft model (default: tiny-draft with the embedded target, gpt2 otherwise)")
    p.add_argument("--ngram", default=None, help="Katz trigram .npz for staged/ngram methods (default: the embedded one, for the embedded vocabulary)")
    p.add_argument("--method", default="staged", choices=METHODS, help="decoding method (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="(default: %(default)s)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: %(default)s)")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget", type=int, default=None, help="drafted tokens per target pass of a best-first tree "
                   "(default: measured choice or documented constant)")
    p.add_argument("--depth", type=int, default=None, help="maximum tree depth / chain length")
    p.add_argument("--widths", default=None, help="a fixed-width tree instead: children per depth, e.g. 2,1,1")
    p.add_argument("--sampled", default=None, choices=("with", "without"),
                   help="draw tree children from the draft with/without replacement (a fixed-width tree; "
                   "default: the draft's top tokens, or at temperature > 0 a sampled chain for speculative)")
    p.add_argument("--lookup-depth", type=int, default=None, help="staged: when the last three tokens occurred "
                   "earlier, verify the N tokens that followed them (round the loop if the match is recent) with no "
                   "draft pass; 0 = always draft "
                   "(default: measured choice or documented constant)")
    p.add_argument("--stats", action="store_true", help="print decoding statistics to stderr")


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
    from .decode import generate
    from .models import load_model, load_ngram
    from .tokenizer import decode, encode, get_encoding

    text = read_prompt(a)
    target = load_model(a.target)
    enc = get_encoding(target.config.n_vocab)
    draft = ngram = None
    if a.method in ("speculative", "tree", "staged"):
        draft = load_model(a.draft or ("tiny-draft" if a.target == "tiny-target" else "gpt2"))
    if a.method in ("staged", "ngram"):
        if a.ngram is None and target.config.n_vocab != 8193:
            raise ValueError("the embedded trigram is for the tiny vocabulary: fit one for this tokenizer with "
                             "`python -m specdec_np ngram fit FILES --out FILE` and pass --ngram FILE")
        ngram = load_ngram(a.ngram)
        if ngram.n_vocab != target.config.n_vocab:
            raise ValueError(f"the trigram's vocabulary ({ngram.n_vocab}) is not the target's ({target.config.n_vocab})")
    if a.lookup_depth is not None and a.method != "staged":
        raise ValueError("--lookup-depth is for --method staged")
    tokens = encode(enc, text)
    t0 = time.perf_counter()
    res = generate(target, tokens, a.max_new_tokens, method=a.method, draft=draft, ngram=ngram,
                   temperature=a.temperature, top_k=a.top_k, top_p=a.top_p, seed=a.seed,
                   budget=a.budget, depth=a.depth, widths=parse_widths(a.widths), sampled=a.sampled,
                   lookup_depth=a.lookup_depth)
    dt = time.perf_counter() - t0
    sys.stdout.write(text + decode(enc, res.tokens) + "\n")
    if a.stats:
        s = res.stats
        print(f"method {a.method}: {len(res.tokens)} tokens in {dt:.2f} s ({len(res.tokens) / dt:.1f} tokens/s), "
              f"stop: {res.stop_reason}\n"
              f"target passes {s.target_passes}, tokens per target pass {s.tokens_per_pass:.2f}, "
              f"draft passes {s.draft_passes}, n-gram queries {s.ngram_queries}\n"
              f"weight traffic {s.weight_traffic:.2f}"
              f" x autoregressive; time: draft {s.time_draft:.2f} s, target {s.time_target:.2f} s, verify {s.time_verify:.2f} s\n"
              f"tokens by stage: " + ", ".join(f"{n} {s.source.count(i)}" for i, n in enumerate(("target", "draft", "n-gram"))),
              file=sys.stderr)
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
            from .ngram import main as ngram_main
            return ngram_main(rest)
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
