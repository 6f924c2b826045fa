"""weights/recipe.py's CPU smoke run: the GPU recipe's code path end to end on tiny shapes (needs PyTorch, the
optional `train` extra; skipped without it). Its shards must load into specdec_np with the torch model's logits."""

import json
import lzma
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "weights"))


def tiny_corpus(tmp: Path) -> Path:
    """specdec_np's own source as the corpus (its last two files held out), the core tests as the packages' part,
    and three prompts (as calibration prompts and as HumanEval problems)."""
    from specdec_np.tokenizer import encode, get_encoding

    enc = get_encoding(8193)
    files = sorted((ROOT / "specdec_np").rglob("*.py"))
    tests = sorted((ROOT / "tests" / "core").glob("*.py"))
    split = {"stdlib_train": files[:-2], "stdlib_heldout": files[-2:], "packages_train": tests[:-1],
             "packages_heldout": tests[-1:]}
    corpus = tmp / "corpus"
    corpus.mkdir()
    for name, paths in split.items():
        toks = np.concatenate([np.array(encode(enc, p.read_text()) + [8192], dtype="<u2") for p in paths])
        with lzma.open(corpus / f"{name}.u16.xz", "wb") as f:
            f.write(toks.tobytes())
    prompts = [encode(enc, f"def f{i}(x):\n    return x +") for i in range(3)]
    humaneval = [{"prompt": p, "full": p + encode(enc, f" {i}\n")} for i, p in enumerate(prompts)]
    (corpus / "prompts.json").write_text(json.dumps({"calibration": prompts, "humaneval": humaneval}))
    return corpus


@pytest.fixture(scope="module")
def smoke_out(tmp_path_factory) -> Path:
    """The smoke run's output directory (one run for the module's tests)."""
    import recipe

    tmp = tmp_path_factory.mktemp("recipe")
    out = tmp / "out"
    assert recipe.main(["--smoke", "--device", "cpu", "--corpus", str(tiny_corpus(tmp)), "--out", str(out)]) == 0
    return out


def test_recipe_smoke_runs_end_to_end_and_its_shards_load(smoke_out):
    import recipe
    from specdec_np import ngram
    from specdec_np.gpt2 import GPT2, GPT2Config

    out = smoke_out
    report = json.loads((out / "report.json").read_text())
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= recipe.MAX_FILES and {"report.json", "log.txt", "trigram.npz"} <= set(files)
    assert report["target"]["steps"] >= 4 and report["draft"]["steps"] >= 4
    fig = report["figures"]
    # Trained a little on its own source, the target beats a uniform guess (ln 8193 = 9.01 nats) on held-out code.
    assert fig["target_heldout_nats"] < 8.8 and np.isfinite(fig["draft_heldout_nats"])
    assert 0 < fig["match_heldout"]["accept_topk"] <= 1 and 0 <= fig["loop_measure"]["average"] <= 1
    assert len(fig["loop_measure"]["per_prompt"]) == 3 and fig["loop_measure"]["prompts"] == "humaneval[:16]"
    assert fig["humaneval_nats"]["problems"] == 3 and np.isfinite(fig["target_packages_heldout_nats"])
    assert report["corpus"]["train"] > report["corpus"]["heldout"] > 0
    # The shards hold what the torch model computes (fp16 weights), read back by specdec_np.
    assert report["target"]["max_logit_diff_vs_torch"] < 2e-3 and report["draft"]["max_logit_diff_vs_torch"] < 2e-3
    params = recipe.from_shards(out, "target")
    cfg = report["target"]["config"]
    model = GPT2(GPT2Config(n_vocab=8193, n_ctx=cfg["n_ctx"], n_embd=cfg["n_embd"], n_layer=cfg["n_layer"],
                            n_head=cfg["n_head"]), params)
    assert model.n_params == sum(p.numel() for p in recipe.T.make_model(recipe.T.RunConfig(**cfg)).parameters())
    assert ngram.load(out / "trigram.npz").n_vocab == 8193


def test_export_from_the_recipe_writes_loadable_checkpoints(smoke_out, tmp_path, monkeypatch):
    import export_tiny
    from specdec_np import checkpoint, ngram

    out = smoke_out
    shipped = tmp_path / "weights"
    shipped.mkdir()
    monkeypatch.setattr(export_tiny, "HERE", shipped)  # never the real weights/ (eval.json)
    monkeypatch.setattr(export_tiny, "SHIPPED", shipped)  # nor the real specdec_np/weights/
    monkeypatch.setattr(export_tiny, "FIXTURE", tmp_path / "heldout_slice.txt")
    evals = export_tiny.export_from(out)
    report = json.loads((out / "report.json").read_text())
    for name in ("target", "draft"):
        model = checkpoint.load(shipped / f"tiny-{name}")
        assert model.config.n_layer == report[name]["config"]["n_layer"]
        assert 0 < evals[name]["heldout_slice_nats"] < 10
    assert json.loads((shipped / "eval.json").read_text()) == evals
    assert ngram.load(shipped / "tiny-trigram.npz").n_vocab == 8193


def test_the_recipes_head_exports_with_its_vocabulary(smoke_out, tmp_path, monkeypatch):
    """train_eagle.py export --from DIR: the recipe's head, bound to the run's target, drafting from the tokens most
    frequent in the run's corpus; a target of another shape (export_tiny.py not run first) is refused."""
    import recipe
    import train_eagle
    from specdec_np import eagle
    from specdec_np.gpt2 import GPT2, GPT2Config

    report = json.loads((smoke_out / "report.json").read_text())
    assert report["eagle"]["max_feature_diff_vs_torch"] < 1e-2 and report["eagle"]["steps"] == 6
    assert report["eagle"]["max_logit_diff_vs_torch"] < 5e-2  # q folded into out, against the torch head's
    assert 0 <= report["eagle"]["first_guess_heldout"]["head"]["accept_topk"] <= 1

    def model(name):
        cfg = report[name]["config"]
        return GPT2(GPT2Config(n_vocab=8193, n_ctx=cfg["n_ctx"], n_embd=cfg["n_embd"], n_layer=cfg["n_layer"],
                               n_head=cfg["n_head"]), recipe.from_shards(smoke_out, name))

    monkeypatch.setattr(train_eagle, "WORK", smoke_out.parent)  # tiny_corpus's corpus/, beside the run's out/
    monkeypatch.setitem(train_eagle.CFG, "vocab", 64)
    target = model("target")
    train_eagle.export_shards(smoke_out, tmp_path / "head", target)
    head = eagle.load_head(tmp_path / "head", target)
    counts = np.bincount(recipe.read_corpus(smoke_out.parent / "corpus")["train"], minlength=8193)
    ids = head.ids
    assert head.config.n_embd <= target.config.n_embd and ids.size == 64 and counts[ids].min() >= np.delete(counts, ids).max()  # the 64 most frequent tokens
    with pytest.raises(SystemExit, match="export_tiny.py --from"):
        train_eagle.export_shards(smoke_out, tmp_path / "wrong", model("draft"))
    assert not (tmp_path / "wrong").exists()
