"""Regenerate tests/fixtures/golden/: a tiny random GPT-2 made and run by Hugging Face transformers.

An independent reference for specdec_np's loader and forward pass: transformers (PyTorch) builds
the random model, saves it with save_pretrained (safetensors, fp32) and computes the logits of a
fixed token sequence in float64, stored as logits.npy. Needs torch + transformers (optional
tooling, never needed at run time or by the tests):

    /work/trainenv/bin/python weights/make_golden.py      # or any python with torch + transformers
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "golden"
SEED = 1234
N_TOKENS = 20
SHAPE = dict(vocab_size=300, n_positions=32, n_embd=32, n_layer=2, n_head=4, layer_norm_epsilon=1e-4)


def main() -> int:
    try:
        import torch
        import transformers
    except ImportError as e:
        print(f"make_golden needs torch and transformers ({e})", file=sys.stderr)
        return 1
    torch.manual_seed(SEED)
    config = transformers.GPT2Config(**SHAPE, initializer_range=0.1, bos_token_id=SHAPE["vocab_size"] - 1,
                                     eos_token_id=SHAPE["vocab_size"] - 1, attn_implementation="eager")
    model = transformers.GPT2LMHeadModel(config).eval()
    # transformers initializes biases to 0 and LayerNorm to (1, 0): randomize them too, so the
    # reference also checks that every bias and LayerNorm parameter lands in the right place.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0.0, 0.1)
            elif ".ln_" in name:
                p.normal_(1.0, 0.2)
    tokens = torch.randint(0, SHAPE["vocab_size"], (1, N_TOKENS), generator=torch.Generator().manual_seed(SEED))

    tmp = OUT.with_name(OUT.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)  # model.safetensors (fp32) + config.json
    with torch.no_grad():
        logits = model.double()(tokens).logits[0].numpy()  # [1, n] -> [n, n_vocab], float64
    np.save(tmp / "tokens.npy", tokens[0].numpy().astype(np.int64))
    np.save(tmp / "logits.npy", logits)
    (tmp / "versions.json").write_text(json.dumps(
        {"torch": torch.__version__, "transformers": transformers.__version__, "seed": SEED}, indent=2) + "\n")
    (tmp / "generation_config.json").unlink(missing_ok=True)
    shutil.rmtree(OUT, ignore_errors=True)
    tmp.rename(OUT)
    total = sum(f.stat().st_size for f in OUT.iterdir())
    print(f"wrote {OUT} ({total / 1e3:.0f} kB): {', '.join(sorted(f.name for f in OUT.iterdir()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
