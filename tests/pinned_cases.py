"""The cases tests/core/test_pinned_55d3cd9.py decodes (shared with the script that recorded its fixture)."""

N_NEW = 24
SEED = 7
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
# (key, method, plan fields, setting, prompt) for every case
CASES_ALL = [(f"{name}/{setting}/{prompt}", method, fields, setting, prompt)
             for setting in SETTINGS for name, method, fields in CASES + (SAMPLED_ONLY if setting == "sampled" else [])
             for prompt in PROMPTS]
