"""weights/recipe.py's CPU smoke run: the GPU recipe's code path end to end on tiny shapes (needs PyTorch, the
optional `train` extra; skipped without it). Its shards must load into specdec_np with the torch model's logits."""

import json
import lzma
import sys
from types import SimpleNamespace
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


def test_the_recipe_exports_one_target_of_its_ablation(smoke_out):
    """The unlikelihood phase ran its smoke steps; both variants (before and after it) carry their held-out loss and
    loop measure, and the exported one is named, its figures the report's; the trigram is the corpus's."""
    report = json.loads((smoke_out / "report.json").read_text())
    assert report["unlikelihood"]["steps"] == 4
    ablation = report["ablation"]
    assert set(ablation["variants"]) == {"before", "after"} and ablation["exported"] in ablation["variants"]
    for v in ablation["variants"].values():
        assert np.isfinite(v["heldout_nats"]) and len(v["loops"]["per_prompt"]) == 3
    chosen = ablation["variants"][ablation["exported"]]
    assert report["figures"]["target_heldout_nats"] == chosen["heldout_nats"]
    assert report["figures"]["loop_measure"] == chosen["loops"]
    assert report["trigram"]["fitted_on"] == "stdlib_train"


def test_the_variant_chosen_is_the_one_that_holds_the_gates():
    import recipe

    def v(average, worst, nats):
        return {"heldout_nats": nats, "loops": {"average": average, "max": worst}}
    assert recipe.choose({"before": v(0.55, 0.84, 0.92), "after": v(0.35, 0.55, 0.94)}) == "after"
    assert recipe.choose({"before": v(0.55, 0.84, 0.92), "after": v(0.35, 0.55, 0.96)}) == "after"  # lower loops
    assert recipe.choose({"before": v(0.38, 0.58, 0.92), "after": v(0.30, 0.65, 0.93)}) == "before"  # a prompt > 0.60
    assert recipe.choose({"before": v(0.38, 0.58, 0.92), "after": v(0.30, 0.50, 0.97)}) == "before"  # quality lost
    assert recipe.choose({"before": v(0.50, 0.60, 0.92), "after": v(0.50, 0.60, 0.90)}) == "after"  # tie: loss


def test_repeat_mask_is_the_loop_measure_token_by_token():
    import recipe
    from specdec_np.tools.loops import repeat_share

    rng = np.random.default_rng(0)
    seqs = rng.integers(0, 3, size=(20, 40))  # 3 symbols: many repeated 4-grams, and rows with few
    mask = recipe.repeat_mask(seqs)
    assert [row.mean() for row in mask] == [repeat_share(row.tolist()) for row in seqs]
    assert 0 < mask.mean() < 1 and not mask[:, :3].any()


def test_unlikelihood_loss_pushes_down_only_the_tokens_that_repeat_a_4gram():
    """Sequence-level unlikelihood (Welleck et al. 2019) on a model that predicts 'the next token is this one + 1'
    almost surely: a continuation whose repeated 4-gram ends as the model predicts costs -log(1 - p) ~ 11.5 at that
    token (the mean over the 8 continuation tokens), one whose repeat ends otherwise costs ~0, one with no repeat
    exactly 0 although the model is sure of every token (the penalty is the repeats', not the confidence's); a wrong
    alignment of predictions and tokens would swap the first two. On a real model one step of the loss lowers p."""
    import torch.nn.functional as F

    import recipe

    def plus_one(x):  # [B, T] -> logits [B, T, 16]
        return 20.0 * F.one_hot((x + 1) % 16, 16).float()

    def ul(continuation):
        return recipe.unlikelihood_loss(plus_one, torch.tensor([[0, 1] + continuation]), prefix=2).item()
    assert ul([3, 4, 5, 6, 3, 4, 5, 6]) == pytest.approx(-np.log(1e-5) / 8, rel=1e-3)
    assert 0 <= ul([3, 4, 5, 7, 3, 4, 5, 7]) < 1e-6
    assert ul([3, 4, 5, 6, 7, 8, 9, 10]) == 0.0

    torch.manual_seed(0)
    cfg = recipe.T.RunConfig("t", n_layer=1, n_head=1, n_embd=32, n_ctx=64)
    model = recipe.T.make_model(cfg)
    seqs = torch.tensor([[7, 8, 100, 200, 300, 400, 100, 200, 300, 400]])  # the last token repeats a 4-gram

    def p_last():
        with torch.no_grad():
            return F.softmax(model(seqs[:, :-1])[0, -1].float(), -1)[400].item()
    before = p_last()
    loss = recipe.unlikelihood_loss(model, seqs, prefix=2)
    loss.backward()
    with torch.no_grad():
        for q in model.parameters():
            q -= 10.0 * q.grad
    assert loss.item() > 0 and p_last() < before


def test_head_only_trains_a_head_of_the_shipped_target_that_exports(tmp_path, monkeypatch):
    """recipe.py --head-only: the shipped target's shards and a head of it (6 steps under --smoke), which
    `train_eagle.py export --from` writes as a head the embedded target loads."""
    import recipe
    import train_eagle
    from specdec_np import models

    corpus, out = tiny_corpus(tmp_path), tmp_path / "out"
    assert recipe.main(["--head-only", "--smoke", "--corpus", str(corpus), "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    target = models.load_model("tiny-target")
    assert report["target"]["shipped"] and report["target"]["config"]["n_embd"] == target.config.n_embd
    assert report["eagle"]["steps"] == 6 and report["eagle"]["max_logit_diff_vs_torch"] < 5e-2
    assert np.array_equal(recipe.from_shards(out, "target")["wte"], target.params["wte"].astype(np.float16))
    monkeypatch.setattr(train_eagle, "WORK", tmp_path)  # tiny_corpus's corpus/
    train_eagle.export_shards(out, tmp_path / "head", target)
    assert models.load_head(tmp_path / "head", target).ids.size == train_eagle.CFG["vocab"]


def test_a_warm_start_reads_the_numpy_head_back_exactly():
    """train_eagle.load_numpy_head is numpy_head's inverse: the shipped head into a torch head and back, every weight
    equal; a torch head left at its random start is not (the control)."""
    import train_eagle
    from specdec_np import models
    from specdec_np.gpt2 import iter_params

    target = models.load_model("tiny-target")
    shipped = models.load_head(target=target)
    cfg = SimpleNamespace(n_embd=target.config.n_embd)
    head = train_eagle.make_head(cfg)
    before = train_eagle.numpy_head(head, target)
    train_eagle.load_numpy_head(head, shipped)
    after = train_eagle.numpy_head(head, target)
    parts = lambda h: iter_params([h.fc, h.block, h.out])  # noqa: E731
    assert all(np.array_equal(a, b) for a, b in zip(parts(after), parts(shipped), strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(parts(before), parts(shipped), strict=True))


def test_head_from_needs_head_only():
    import recipe

    with pytest.raises(SystemExit):
        recipe.main(["--head-from", "specdec_np/weights/tiny-eagle", "--smoke"])
