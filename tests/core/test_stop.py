"""Stop strings (`generate(..., stop=[...])`): every method stops after the token that completes the first stop
string in the completion's text, losslessly. Greedy: the same tokens as the target's own greedy text cut by the
rule (float64 token equality); sampled: the same exact distribution as the target's samples cut by the rule (every
random branch enumerated). A stop applied wrongly (at the end of the step, or one token late) is rejected by the
same checks.

The small random models have no GPT-2 tokenizer: their token i reads as TEXT[i], one to three letters, so that a
stop string can begin or end inside a token."""

import numpy as np
import pytest

from helpers import TINY_PROMPT, ar_greedy, models_for
from specdec_np import decode, eagle
from specdec_np.decode import generate
from specdec_np.gpt2 import forward, new_cache
from specdec_np.plan import Plan
from specdec_np.proofs import exact
from specdec_np.sampling import process
from specdec_np.tokenizer import cut_at_stop

TEXT = [chr(97 + i % 26) * (1 + i % 3) for i in range(64)]  # "a", "bb", "ccc", "d", ... (ids past 25 repeat letters)


def text_of(tokens) -> str:
    return "".join(TEXT[t] for t in tokens)


def cut(tokens, stop) -> list:
    """The rule, on a finished sequence: its tokens through the first after which their text holds a stop string."""
    n = next((n for n in range(1, len(tokens) + 1) if any(s in text_of(tokens[:n]) for s in stop)), len(tokens))
    return list(tokens[:n])


# Every method, with plans that accept several tokens a step (so that stops fall inside steps and across them).
GREEDY = [("ar", {}), ("speculative", dict(chain=4)), ("tree", dict(budget=10, depth=4)),
          ("tree", dict(shape="fixed", widths=(3, 2, 1))), ("staged", dict(budget=10, depth=4)),
          ("ngram", dict(budget=6, depth=3)), ("lookup", dict(chain=4)), ("eagle", dict(budget=6, depth=3))]
IDS = [m + "-" + "-".join(map(str, f.values())) for m, f in GREEDY]


def run(models, method, fields, prompt, n, **kw):
    target, draft, trigram = models
    draft = eagle.random_head(target, seed=1) if method == "eagle" else draft
    return generate(target, prompt, n, method, plan=Plan(**fields), decode_fn=text_of,
                    **models_for(method, draft, trigram), **kw)


def stops_along(ref, every=3) -> list:
    """Stop strings taken from the reference text: from the middle of one token into a later one, whole tokens,
    and one that never occurs (the control: no stop)."""
    text = text_of(ref)
    starts = np.cumsum([0] + [len(TEXT[t]) for t in ref])
    stops = [[text[starts[k] + len(TEXT[ref[k]]) // 2: starts[k + 2] + 1]] for k in range(0, len(ref) - 3, every)]
    return stops + [[text_of(ref[k:k + 2])] for k in range(1, len(ref) - 2, every)] + [["zzzzzzzz"]]


@pytest.mark.parametrize("method, fields", GREEDY, ids=IDS)
def test_greedy_with_stops_is_the_targets_text_cut_at_them(small, method, fields):
    prompt = [3, 1, 4, 1, 5]
    ref = ar_greedy(small.target, prompt, 30)
    for stop in stops_along(ref):
        res = run(small, method, fields, prompt, 30, stop=stop, eos=None)
        assert res.tokens == cut(ref, stop), stop
        assert res.stop_reason == ("stop" if any(s in text_of(ref) for s in stop) else "max_new_tokens")
        assert sum(res.stats.accepted) == len(res.tokens)  # statistics count what was emitted
        assert res.target_cache.length == len(prompt) + len(res.tokens) - 1  # the caches hold no cut token
        if res.draft_cache is not None:
            assert res.draft_cache.length <= len(prompt) + len(res.tokens) - 1
        assert cut_at_stop(text_of(res.tokens), stop) == cut_at_stop(text_of(ref), stop)  # the text before it


def test_the_greedy_stops_fall_inside_steps(small):
    """The check above is not vacuous: some stop completes inside a step's accepted path, so the step is cut."""
    prompt = [3, 1, 4, 1, 5]
    ref = ar_greedy(small.target, prompt, 30)
    inside = 0
    for stop in stops_along(ref):
        res = run(small, "tree", dict(budget=10, depth=4), prompt, 30, stop=stop, eos=None, keep_trees=True)
        last = res.stats.steps[-1].trace
        inside += res.stop_reason == "stop" and len(last.path) > len(res.stats.steps[-1].tokens)
    assert inside >= 2


def test_caches_after_a_stop_equal_a_fresh_prefill(small):
    """A stop cuts the step's path as max_new_tokens does: the target's cache holds exactly the emitted sequence
    but its last token, each row as a fresh prefill computes it (and the draft's, what it holds)."""
    prompt = [3, 1, 4, 1, 5]
    ref = ar_greedy(small.target, prompt, 30)
    stop = [text_of(ref[9:11])]
    for method in ("tree", "staged", "speculative"):
        res = run(small, method, dict(budget=10, depth=4, chain=4), prompt, 30, stop=stop, eos=None)
        assert res.stop_reason == "stop"
        seq = prompt + res.tokens
        for model, kv in ((small.target, res.target_cache), (small.draft, res.draft_cache)):
            fresh = new_cache(model)
            forward(model, seq[:kv.length], fresh)
            np.testing.assert_allclose(kv.k[:, :, :kv.length], fresh.k[:, :, :kv.length], rtol=0, atol=1e-12)
            np.testing.assert_allclose(kv.v[:, :, :kv.length], fresh.v[:, :, :kv.length], rtol=0, atol=1e-12)


def late(how):
    """A stop applied wrongly, for the negative controls: at the end of the step ("step"), or a token late."""
    real = decode.stop_finder

    def finder(stop, decode_fn, seq, n_prompt):
        ends = real(stop, decode_fn, seq, n_prompt)

        def wrong(tokens):
            n = ends(tokens)
            return n if n is None else len(tokens) if how == "step" else min(n + 1, len(tokens))
        return wrong
    return finder


@pytest.mark.parametrize("how", ["step", "token"])
def test_greedy_negative_control_a_stop_applied_late_is_caught(small, monkeypatch, how):
    monkeypatch.setattr(decode, "stop_finder", late(how))
    prompt = [3, 1, 4, 1, 5]
    ref = ar_greedy(small.target, prompt, 30)
    wrong = [stop for stop in stops_along(ref)
             if run(small, "tree", dict(budget=10, depth=4), prompt, 30, stop=stop, eos=None).tokens != cut(ref, stop)]
    assert len(wrong) >= 2


def test_an_end_of_text_or_a_stop_whichever_comes_first(small):
    prompt = [3, 1, 4, 1, 5]
    ref = ar_greedy(small.target, prompt, 30)
    early, later = [text_of(ref[3:5])], [text_of(ref[20:22])]
    eos = next(t for t in ref[8:] if t not in ref[:8])
    res = run(small, "tree", dict(budget=10, depth=4), prompt, 30, stop=later, eos=eos)
    assert res.stop_reason == "eos" and res.tokens == ref[:ref.index(eos) + 1]
    res = run(small, "tree", dict(budget=10, depth=4), prompt, 30, stop=early, eos=eos)
    assert res.stop_reason == "stop" and res.tokens == cut(ref, early)


# ----------------------------------------------------------------------------- sampled, exactly

COPY_PROMPT = [0, 1, 2, 3, 0, 1, 2]  # "0 1 2" recurs: staged copies and lookup proposes
TINY_TEXT = ["a", "bc", "b", "cab"]  # the tiny models' 4 tokens: stops begin and end inside tokens
SAMPLED = [("ar", {}, {}), ("speculative", dict(chain=2), dict(top_k=2)),
           ("tree", dict(widths=(2, 1), sampled="with"), dict(top_k=2)),
           ("tree", dict(budget=3, depth=2), {}),
           ("staged", dict(widths=(2, 1), sampled="without", copy_len=2, guess_len=1), dict(top_k=2)),
           ("ngram", dict(budget=3, depth=2), {}), ("lookup", dict(lookup_chains=(2, 1, 0)), {}),
           ("eagle", dict(widths=(2, 1), sampled="without"), dict(top_k=2))]
STOP = ["ca"]  # in "bc"+"a", "cab", "bc"+"ab"...: often mid-step, often inside a token


def tiny_text(tokens) -> str:
    return "".join(TINY_TEXT[t] for t in tokens)


def exact_with_stop(tiny, method, fields, settings, prompt, n=3) -> dict:
    """{tokens: exact probability} of `generate` with the stop, every random branch enumerated."""
    draft = eagle.random_head(tiny.target, seed=5, scale=0.3) if method == "eagle" else tiny.draft

    def fn(rand):
        return tuple(generate(tiny.target, prompt, n, method, plan=Plan(**fields), temperature=1.0, rand=rand,
                              eos=None, stop=STOP, decode_fn=tiny_text, **models_for(method, draft, tiny.trigram),
                              **settings).tokens)
    return exact.outcomes(fn)


def target_with_stop(tiny, prompt, n=3, top_k=None) -> dict:
    """The target's own n-token samples, each cut by the rule: {cut tokens: probability}."""
    def next_dist(context):
        return process(forward(tiny.target, list(context), new_cache(tiny.target))[-1], 1.0, top_k)

    def rule(tokens):
        k = next((k for k in range(1, len(tokens) + 1) if any(s in tiny_text(tokens[:k]) for s in STOP)), len(tokens))
        return tokens[:k]
    return exact.marginal(exact.sequence_distribution(next_dist, tuple(prompt), n), rule)


@pytest.mark.parametrize("prompt", [TINY_PROMPT, COPY_PROMPT], ids=["fresh", "repeat"])
@pytest.mark.parametrize("method, fields, settings", SAMPLED, ids=[f"{m}-{i}" for i, (m, _, _) in enumerate(SAMPLED)])
def test_sampling_with_stops_is_exactly_the_targets_cut_at_them(tiny, method, fields, settings, prompt):
    got = exact_with_stop(tiny, method, fields, settings, prompt)
    want = target_with_stop(tiny, prompt, top_k=settings.get("top_k"))
    assert any(len(k) < 3 for k in want)  # the stop really cuts some samples
    assert exact.total_variation(got, want) < 1e-12


@pytest.mark.parametrize("how", ["step", "token"])
def test_sampled_negative_control_a_stop_applied_late_is_caught(tiny, monkeypatch, how):
    monkeypatch.setattr(decode, "stop_finder", late(how))
    got = exact_with_stop(tiny, "tree", dict(budget=3, depth=2), {}, TINY_PROMPT)
    assert exact.total_variation(got, target_with_stop(tiny, TINY_PROMPT)) > 1e-3


# ----------------------------------------------------------------------------- the arguments

def test_bad_stop_arguments_are_one_line_errors_naming_them(small):
    target = small.target
    for stop in ([""], [1], "", {"a": 1}, ["a", None]):
        with pytest.raises(TypeError, match=r"^stop must be a list of non-empty strings"):
            generate(target, [1, 2], 4, stop=stop, decode_fn=text_of)
    with pytest.raises(TypeError, match="^decode_fn must be a function of token ids"):
        generate(target, [1, 2], 4, stop=["a"], decode_fn="abc")
    with pytest.raises(ValueError, match=r"^stop: the target's 40 tokens have no GPT-2 tokenizer to decode them "
                                         r"with: give decode_fn"):
        generate(target, [1, 2], 4, stop=["a"])
    # The valid neighbours: one string is one stop string; no stop needs no decode_fn.
    ref = ar_greedy(target, [1, 2], 12)
    one = text_of(ref[4:6])
    assert generate(target, [1, 2], 12, stop=one, decode_fn=text_of, eos=None).tokens == cut(ref, [one])
    assert generate(target, [1, 2], 12, stop=[], eos=None).tokens == ref


def test_the_default_decode_fn_is_the_targets_gpt2_tokenizer(embedded):
    """A real vocabulary needs no decode_fn: the stop is found in GPT-2's BPE text (here the embedded models')."""
    from specdec_np.tokenizer import decode as text, encode

    target, draft, trigram, enc = embedded
    prompt = encode(enc, 'def is_prime(n):\n    """Return True if n is prime."""\n')
    full = generate(target, prompt, 24, "ar")
    res = generate(target, prompt, 24, "staged", draft, trigram, stop=["\ndef", "\nclass"])
    assert res.stop_reason == "stop" and res.tokens == full.tokens[:len(res.tokens)] and len(res.tokens) < 24
    assert "\ndef" in text(enc, res.tokens) and "\ndef" not in text(enc, res.tokens[:-1])
    assert cut_at_stop(text(enc, res.tokens), ["\ndef"]) == cut_at_stop(text(enc, full.tokens), ["\ndef"])
