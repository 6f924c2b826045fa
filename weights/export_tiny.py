"""Export the trained tiny models through specdec_np's own saver (Hugging Face GPT-2 layout, fp16).

    python weights/export_tiny.py                   # needs PyTorch; writes specdec_np/weights/tiny-*/
    python weights/export_tiny.py draft_t1          # only the further-distilled draft, as tiny-draft/
    python weights/export_tiny.py --from DIR        # NumPy only: weights/recipe.py's output (the GPU run) ->
                                                    # specdec_np/weights/tiny-*, weights/eval.json

Checks, for each model, that specdec_np's forward pass on the exported file gives the logits of the
PyTorch model it came from *with its weights rounded to fp16*, and records held-out losses.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import train_tiny as T  # noqa: E402
from specdec_np import checkpoint  # noqa: E402
from specdec_np.files import SHIPPED_DIR as SHIPPED  # noqa: E402  (specdec_np/weights/: the package data)
from specdec_np.gpt2 import GPT2, GPT2Config, forward, new_cache  # noqa: E402


SHIPPED_AS = {"target": "target", "draft": "draft", "draft_t1": "draft"}  # run -> specdec_np/weights/tiny-NAME/


def export(name: str) -> dict:
    import torch

    model, cfg = T.load_run(name)
    with torch.no_grad():  # round the torch weights to fp16, exactly what the file will hold
        for p in model.parameters():
            p.copy_(p.half().float())
    config = GPT2Config(n_vocab=T.N_VOCAB, n_ctx=cfg.n_ctx, n_embd=cfg.n_embd, n_layer=cfg.n_layer, n_head=cfg.n_head)
    out_dir = SHIPPED / f"tiny-{SHIPPED_AS[name]}"
    checkpoint.save(GPT2(config, T.to_numpy_params(model, cfg)), out_dir, dtype=np.float16)
    ours = checkpoint.load(out_dir)

    held = np.load(T.WORK / "heldout.npy")
    window = held[1000:1000 + 256].astype(np.int64)
    with torch.no_grad():
        ref = model(torch.from_numpy(window)[None])[0].numpy()
    got = forward(ours, window, new_cache(ours))
    err = float(np.abs(got - ref).max())
    print(f"{name}: max |logit difference| specdec_np vs torch(fp16 weights) = {err:.2e}")
    assert err < 2e-3, f"{name}: exported model disagrees with torch ({err})"
    ck = torch.load(T.WORK / f"{name}_final.pt", weights_only=False)
    info = {"params": ours.n_params, "weight_bytes_fp32": ours.weight_bytes,
            "flops_per_token": 2 * (ours.n_params - cfg.n_ctx * cfg.n_embd),
            "train_tokens": int(ck["tokens"]), "train_minutes": round(ck["elapsed"] / 60, 1),
            "heldout_nats": round(T.evaluate(model, cfg, held), 4), "max_logit_diff_vs_torch": err}
    return info


FIXTURE = HERE.parent / "tests" / "fixtures" / "heldout_slice.txt"


def slice_text(n_chars: int = 6000) -> str:
    """A fixed slice of held-out stdlib code (the first held-out files, in path order)."""
    root, rel = T.stdlib_files()
    text = ""
    for r in rel:
        if T.is_heldout(r):
            try:
                text += (root / r).read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            if len(text) >= n_chars:
                break
    return text[:n_chars]


def slice_loss_torch(name: str, tokens: np.ndarray) -> float:
    """Mean next-token NLL of the fp16-rounded torch model on `tokens` (one window of <= n_ctx)."""
    import torch
    import torch.nn.functional as F

    model, cfg = T.load_run(name)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())
        x = torch.from_numpy(tokens.astype(np.int64))[None]
        logits = model(x[:, :-1])[0]
        return float(F.cross_entropy(logits, x[0, 1:]))


def export_from(out_dir: Path) -> dict:
    """weights/recipe.py's shards and trigram as the shipped files (fp16 via specdec_np's saver), and eval.json's
    held-out slice losses computed by specdec_np's forward pass (the figure tests/core/test_embedded.py checks)."""
    import shutil

    from recipe import from_shards
    from specdec_np.tokenizer import encode, get_encoding

    report = json.loads((out_dir / "report.json").read_text())
    text = slice_text()
    FIXTURE.write_text(text, encoding="utf-8")
    toks = np.array(encode(get_encoding(T.N_VOCAB), text)[:512])
    evals = {}
    for name in ("target", "draft"):
        cfg = report[name]["config"]
        config = GPT2Config(n_vocab=T.N_VOCAB, n_ctx=cfg["n_ctx"], n_embd=cfg["n_embd"], n_layer=cfg["n_layer"],
                            n_head=cfg["n_head"])
        checkpoint.save(GPT2(config, from_shards(out_dir, name)), SHIPPED / f"tiny-{name}", dtype=np.float16)
        model = checkpoint.load(SHIPPED / f"tiny-{name}")
        window = toks[:model.config.n_ctx]
        logits = forward(model, window[:-1], new_cache(model)).astype(np.float64)  # [n, V]
        logp = logits - logits.max(-1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
        evals[name] = {"heldout_slice_nats": round(float(-logp[np.arange(len(window) - 1), window[1:]].mean()), 5)}
    tmp = SHIPPED / "tiny-trigram.tmp.npz"
    shutil.copyfile(out_dir / "trigram.npz", tmp)
    os.replace(tmp, SHIPPED / "tiny-trigram.npz")
    (HERE / "eval.json").write_text(json.dumps(evals, indent=1) + "\n")
    return evals


if __name__ == "__main__":
    if sys.argv[1:2] == ["--from"]:
        print(json.dumps(export_from(Path(sys.argv[2])), indent=1))
        sys.exit(0)
    runs = sys.argv[1:] or ["target", "draft"]
    for r in runs:
        assert r in SHIPPED_AS, f"unknown run {r!r} (one of {sorted(SHIPPED_AS)})"
    report = {name: export(name) for name in runs}
    from specdec_np.tokenizer import encode, get_encoding

    text = slice_text()
    FIXTURE.write_text(text, encoding="utf-8")
    toks = np.array(encode(get_encoding(T.N_VOCAB), text)[:512])
    for name in runs:
        report[name]["heldout_slice_nats"] = round(slice_loss_torch(name, toks), 5)
    evals = json.loads((HERE / "eval.json").read_text()) if (HERE / "eval.json").exists() else {}
    evals.update({SHIPPED_AS[n]: {"heldout_slice_nats": report[n]["heldout_slice_nats"]} for n in runs})
    (HERE / "eval.json").write_text(json.dumps(evals, indent=1) + "\n")
    (HERE / "work" / "export.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
