"""Behaviour unchanged: every method, greedy and sampled, emits the tokens (and the per-step record)
it emitted before the decoding loop became method objects.

The reference, tests/fixtures/unchanged.json, was written by this file's `record()` from the code
before that refactor (`python tests/test_unchanged.py`). Each case decodes the shipped tiny models
from two prompts (one that repeats itself, so prompt lookup and stage 2's copies happen) with a
fixed seed and plan; the record holds the tokens, who proposed each, and the step-by-step sizes of
the target's and the draft's passes and the n-gram's queries. Rewriting the fixture from the
current code would make this test vacuous: rewrite it only for a deliberate change of behaviour.
"""

import json
from pathlib import Path

import pytest

from specdec_np.decode import Plan, generate

FIXTURE = Path(__file__).parent / "fixtures" / "unchanged.json"
N_NEW = 24
PROMPTS = {
    "fresh": "def mean(values):\n    \"\"\"Return the arithmetic mean of a non-empty list of numbers.\"\"\"\n",
    "repeat": "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n",
}
SETTINGS = {"greedy": dict(temperature=0.0), "sampled": dict(temperature=1.0, top_k=50)}
# (name, method, plan fields): every method, and the plans whose trees each sampled rule verifies.
CASES = [
    ("ar", "ar", {}),
    ("speculative", "speculative", {}),
    ("tree", "tree", {}),
    ("tree-fixed", "tree", dict(shape="fixed", widths=(2, 2, 1))),
    ("staged", "staged", {}),
    ("staged-fixed", "staged", dict(shape="fixed", widths=(2, 1, 1))),
    ("ngram", "ngram", {}),
    ("lookup", "lookup", {}),
    ("lookup-by-match", "lookup", dict(lookup_chains=(7, 3, 0))),
]
SAMPLED_ONLY = [  # rules and tree kinds that only sampling tells apart
    ("tree-with", "tree", dict(widths=(2, 2, 1), sampled="with")),
    ("tree-without", "tree", dict(widths=(2, 2, 1), sampled="without")),
    ("staged-without", "staged", dict(widths=(2, 1, 1), sampled="without")),
    ("tree-traversal", "tree", dict(widths=(2, 1, 1), sampled="with", rule="traversal")),
    ("speculative-block", "speculative", dict(rule="block")),
    ("speculative-without", "speculative", dict(sampled="without")),
]


def cases():
    for setting in SETTINGS:
        for name, method, fields in CASES + (SAMPLED_ONLY if setting == "sampled" else []):
            for prompt in PROMPTS:
                yield f"{name}/{setting}/{prompt}", method, fields, setting, prompt


def run(models, method, fields, setting, prompt):
    """What one case records: a JSON-ready dict."""
    target, draft, trigram, enc = models
    from specdec_np.tokenizer import encode
    res = generate(target, encode(enc, PROMPTS[prompt]), N_NEW, method, draft, trigram, Plan(**fields),
                   seed=7, **SETTINGS[setting])
    s = res.stats
    return dict(tokens=res.tokens, stop=res.stop_reason, source=s.source, accepted=s.accepted,
                target_blocks=s.target_blocks, draft_blocks=s.draft_blocks, draft_dists=s.draft_dists,
                ngram_queries=s.ngram_queries)


def record():
    from specdec_np.models import load_embedded
    models = load_embedded()
    out = {key: run(models, *args) for key, *args in cases()}
    FIXTURE.write_text(json.dumps(out, indent=0, sort_keys=True) + "\n")
    print(f"wrote {len(out)} cases to {FIXTURE}")


REFERENCE = json.loads(FIXTURE.read_text()) if FIXTURE.exists() else {}


@pytest.mark.parametrize("key,method,fields,setting,prompt", [pytest.param(*case, id=case[0]) for case in cases()])
def test_same_tokens_and_steps_as_before(embedded, key, method, fields, setting, prompt):
    assert key in REFERENCE, f"{FIXTURE.name} lacks {key}: record it from the code before the refactor"
    assert run(embedded, method, fields, setting, prompt) == REFERENCE[key]


def test_the_reference_is_not_trivial():
    """The fixture exercises what it claims: multi-token steps, draft passes, copies and n-gram credit."""
    assert len(REFERENCE) == len(list(cases()))
    assert any(max(r["accepted"]) > 2 for r in REFERENCE.values())
    assert any(2 in r["source"] for k, r in REFERENCE.items() if k.startswith("staged"))
    assert len({tuple(r["tokens"]) for k, r in REFERENCE.items() if "/sampled/fresh" in k}) > 1  # seeds matter


if __name__ == "__main__":
    record()
