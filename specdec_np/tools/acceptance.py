"""The pair's acceptance profile: what each candidate plan does per emitted token, whatever the machine.

Sequoia (Chen et al. 2024, arXiv 2402.12374) separates what belongs to the models (how many tokens a tree shape
gets accepted) from what belongs to the hardware (what a pass of k tokens costs). This is the first: every candidate
(method, plan shape) decodes the calibration prompts greedily and at top-k 50 (T=1), and what it did past each
prefill is counted; the embedded pair's profile ships in `specdec_np/weights/`. `costmodel.py` prices it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import hashlib
import io
import json
import os
import stat
import zlib
from collections import Counter
from pathlib import Path

import numpy as np

from ..decode import generate
from ..files import PROMPT_MAX_BYTES, parse_json, read_json, read_regular, utf8, weights_file
from ..methods import METHODS
from ..plan import Plan
from ..tokenizer import encode
from ..values import whole
from .cache import write_json
from .costmodel import step_passes

FORMAT = "specdec_np.profile"
VERSION = 2
SETTINGS = {"greedy": {"temperature": 0.0}, "sampled": {"temperature": 1.0, "top_k": 50}}
PROFILE_FILE = weights_file("profile.json")
# The methods the profile holds (the n-gram's own trees are not profiled: the draft's beat them).
PROFILED = ("ar", "lookup", "speculative", "tree", "staged", "eagle")
COUNTS = ("tokens", "steps", "draft_dists", "ngram_queries")  # a count record's totals; plus per-model passes
MOST = 10**12  # more than any count a profile can hold: a larger one is not a count
PLAN_FIELDS = {f.name for f in dataclasses.fields(Plan)}
RECORD_KEYS = {"method", "shape", *COUNTS, "target", "draft"}
_SHIPPED: dict = {}  # (path, inode, mtime, size) of the regular file read last -> its profile
PROMPTS_MAX_BYTES = 1 << 28  # a prompts file, gzipped or not (HumanEval's 164 prompts: 0.2 MB)


def candidates(setting: str, quick: bool = False) -> list[tuple[str, dict]]:
    """(method, plan shape) pairs to profile in a setting (`quick`: fewer, for a pair profiled on first use)."""
    chains = (1, 2, 3, 4) if quick else (1, 2, 3, 4, 6)
    out = [("ar", {})] + [("lookup", {"chain": k}) for k in (3, 7, 15)]
    # Prompt lookup trusting a longer match with a longer chain, and a single token not at all.
    by_match = ((7, 3, 0), (15, 7, 0)) if quick else ((5, 2, 0), (7, 3, 0), (11, 5, 0), (15, 7, 0), (19, 7, 0),
                                                      (23, 7, 0))
    out += [("lookup", {"lookup_chains": c}) for c in by_match] + [("speculative", {"chain": k}) for k in chains]
    widths = ((1,), (2,), (1, 1), (2, 1), (1, 1, 1), (2, 1, 1))
    if setting == "greedy":
        trees = [{"shape": "fixed", "widths": w} for w in widths + (() if quick else ((1, 1, 1, 1), (2, 2, 1)))]
        trees += [] if quick else [{"budget": b, "depth": d} for b, d in ((5, 3), (8, 6))]
    else:
        trees = [{"sampled": "without", "widths": w} for w in (widths[:4] if quick else widths)]

    # The tree alone (drafted by the draft, by the EAGLE head), then staged with each (guess_len, guess_rows), copy_len.
    def with_staged(tree, stage2, copies):
        return [("tree", tree), ("eagle", tree)] + [("staged", dict(tree, guess_len=g, guess_rows=r, copy_len=c))
                                                    for g, r in stage2 for c in copies]
    stage2 = ((0, 0), (1, 2), (2, 4)) if quick else ((0, 0), (1, 2), (2, 4), (3, 4))
    for tree in trees:
        out += with_staged(tree, stage2, (0, 3, 7, 15))
    if setting != "greedy":  # the sequence-level rules on the same sampled drafts, with fewer stage-2 settings
        out += [("speculative", {"chain": k, "rule": "block"}) for k in chains]
        few_stage2, few_copies = (((0, 0),), (0, 15)) if quick else (((0, 0), (2, 4)), (0, 7, 15))
        for tree in trees:
            out += with_staged(dict(tree, rule="traversal"), few_stage2, few_copies)
    if not quick:  # the EAGLE head's guesses are accepted more often than the draft's: longer chains pay too
        kind, lengths = ({"shape": "fixed"}, (6, 8)) if setting == "greedy" else ({"sampled": "without"}, (4, 6))
        chains_of = [dict(kind, widths=(1,) * k) for k in lengths]
        # ... and chains that stop below a token the head doubts (Plan.min_q), cheaper where it guesses badly.
        chains_of += [dict(kind, widths=(1,) * k, min_q=m) for k in (3, *lengths) for m in (0.3, 0.5)]
        out += [("eagle", c) for c in chains_of]
        out += [] if setting == "greedy" else [("eagle", dict(c, rule="traversal")) for c in chains_of]
    return out


def runnable(has_draft: bool, has_ngram: bool, has_head: bool = False) -> set:
    """The profiled methods a pair (and an EAGLE head) can run: those whose drafter and n-gram it has."""
    return {name for name in PROFILED if (has_head if METHODS[name].drafts_with == "head" else
                                          has_draft or METHODS[name].drafts_with is None)
            and (has_ngram or not METHODS[name].needs_ngram)}


def models_for(method: str, draft, ngram, head=None) -> dict:
    """generate's draft (the EAGLE head for a method that drafts with one) and ngram, those `method` reads."""
    m = METHODS[method]
    return dict(draft=(head if m.drafts_with == "head" else draft) if m.drafts_with else None,
                ngram=ngram if m.needs_ngram else None)


def counts(*runs, skip_first: bool = True) -> dict:
    """What runs (their Stats) did past each one's prefill: the count record `costmodel.record_ms` prices."""
    steps = [s for stats in runs for s in (stats.steps[1:] if skip_first else stats.steps)]
    passes = {model: {"cold": Counter(), "warm": Counter()} for model in ("target", "draft")}
    for s in steps:
        for model, state, k in step_passes(s.draft_blocks, s.target_block):
            passes[model][state][k] += 1
    return {"tokens": sum(len(s.tokens) for s in steps), "steps": len(steps),
            "draft_dists": sum(s.draft_dists for s in steps), "ngram_queries": sum(s.ngram_queries for s in steps),
            **{model: {state: dict(c) for state, c in states.items()} for model, states in passes.items()}}


def measure(target, draft, ngram, prompts, max_new_tokens: int = 128, seeds: int = 2, progress=None, grid=None,
            count_all=None, head=None) -> dict:
    """The profile of a pair (and `head`, named by `head_key`) on calibration prompts (token ids): every candidate (or
    `grid`'s) the models run, `seeds` seeds per prompt when sampling. `count_all(job, todo)` yields each candidate's
    (setting, method, shape, counts) (default `count_each`; weights/make_profile.py counts in several processes)."""
    grid = grid or {s: candidates(s) for s in SETTINGS}
    usable = runnable(draft is not None, ngram is not None, head is not None)
    todo = [(s, method, shape) for s in grid for method, shape in grid[s] if method in usable]
    job = (target, draft, ngram, prompts, max_new_tokens, seeds, head)
    done, settings = {}, {}
    for n, (setting, method, shape, total) in enumerate((count_all or count_each)(job, todo)):
        done[candidate_key(setting, method, shape)] = total
        if progress:
            progress(n + 1, len(todo))
    for s, method, shape in todo:
        settings.setdefault(s, []).append({"method": method, "shape": shape, **done[candidate_key(s, method, shape)]})
    return {"format": FORMAT, "version": VERSION, "models": pair_key(target, draft, ngram),
            **({"head": head_key(head)} if head is not None else {}),
            "max_new_tokens": max_new_tokens, "prompts": len(prompts), "seeds": seeds, "settings": settings}


def candidate_key(setting, method, shape) -> tuple:
    return setting, method, json.dumps(shape, sort_keys=True)  # tuples as lists: as a journal reads back


def run_seeds(prompt_index: int, temperature: float, n: int) -> range:
    """The seeds prompt i runs with in the profile and the bench: i, i + 1000, ... (n sampling, one greedy)."""
    return range(prompt_index, prompt_index + 1000 * (n if temperature > 0 else 1), 1000)


def counted(job, item) -> tuple:
    """(setting, method, shape, its counts summed over `job`'s prompts and seeds)."""
    setting, method, shape = item
    target, draft, ngram, prompts, max_new_tokens, seeds, head = job
    kw, models = SETTINGS[setting], models_for(method, draft, ngram, head)
    runs = [generate(target, prompt, max_new_tokens, method, models["draft"], models["ngram"], Plan(**shape),
                     seed=seed, **kw).stats
            for i, prompt in enumerate(prompts) for seed in run_seeds(i, kw["temperature"], seeds)]
    return setting, method, shape, counts(*runs)


def count_each(job, todo):
    """`counted` for each candidate of `todo` in turn."""
    for item in todo:
        yield counted(job, item)


def pair_key(target, draft, ngram) -> str:
    """A digest of the models' weights (and the n-gram's counts): what a profile belongs to."""
    h = hashlib.sha256()
    for model in (target, draft):
        if model is not None:
            h.update(repr(model.config).encode())
            h.update(np.ascontiguousarray(model.params["wte"][:256]).tobytes())
            h.update(np.ascontiguousarray(model.params["blocks"][-1]["mlp"]["c_proj"]["w"]).tobytes())
    if ngram is not None:
        h.update(np.ascontiguousarray(ngram.p1).tobytes())
    return h.hexdigest()[:16]


def head_key(head) -> str:
    """A digest of an EAGLE head's own weights (its fusion and block): the head a profile's eagle records are of."""
    h = hashlib.sha256(repr(head.config).encode())
    h.update(np.ascontiguousarray(head.fc["w"]).tobytes())
    h.update(np.ascontiguousarray(head.block["mlp"]["c_proj"]["w"]).tobytes())
    return h.hexdigest()[:16]


def from_json_record(r: dict) -> dict:
    """A count record read back, block sizes as ints again; a ValueError if it is not one."""
    if not isinstance(r, dict) or not all(whole(r.get(k), 0) and r[k] <= MOST for k in COUNTS):
        raise ValueError(f"a count record needs {', '.join(COUNTS)} (integers in 0..{MOST})")
    passes = {}
    for model in ("target", "draft"):
        states = r.get(model)
        if not isinstance(states, dict) or set(states) != {"cold", "warm"} or not all(
                isinstance(c, dict) and all(block_size(k) and whole(n, 0) and n <= MOST for k, n in c.items())
                for c in states.values()):
            raise ValueError(f"a count record's {model!r} needs passes by state (cold, warm): block size -> count")
        passes[model] = {state: {int(k): n for k, n in c.items()} for state, c in states.items()}
    return dict(r, **passes)


def block_size(k) -> bool:  # a block size as JSON writes it: "1" .. "65536"
    return str(k).isascii() and str(k).isdigit() and 1 <= int(k) <= 1 << 16


def from_json(data: dict) -> dict:
    """A profile read back (widths as tuples, block sizes as ints); a ValueError if not one of this version."""
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != VERSION:
        raise ValueError(f"not a specdec_np acceptance profile ('{FORMAT}', version {VERSION})")
    settings = data.get("settings")
    if not isinstance(settings, dict) or not settings or not all(
            s in SETTINGS and isinstance(records, list) and all(isinstance(r, dict) and r.get("method") in PROFILED
                                                                and isinstance(r.get("shape"), dict) for r in records)
            for s, records in settings.items()):
        raise ValueError(f"'settings' must hold, for {' or '.join(SETTINGS)} or both, a list of records: a method "
                         f"({', '.join(PROFILED)}), a plan shape and counts")
    if not isinstance(data.get("head", ""), str):
        raise ValueError("'head' must be the digest of the EAGLE head its eagle records are of")
    data["settings"] = {setting: [from_json_plan(setting, i, r) for i, r in enumerate(records, 1)]
                        for setting, records in settings.items()}
    for setting, records in data["settings"].items():
        if not any(r["method"] == "ar" and r["tokens"] for r in records):  # what every plan is priced against
            raise ValueError(f"the {setting} setting has no plain-decoding (ar) record")
    return data


def from_json_plan(setting: str, i: int, r: dict) -> dict:
    """Record `i` of `setting`: counts (`from_json_record`) and a plan shape that makes a Plan (widths as tuples)."""
    try:
        if unknown := sorted(set(r) - RECORD_KEYS) or sorted(set(r["shape"]) - PLAN_FIELDS):
            raise ValueError(f"unknown key {unknown[0]!r}")
        r = dict(from_json_record(r), shape={k: tuple(v) if isinstance(v, list) else v for k, v in r["shape"].items()})
        Plan(**r["shape"])
    except (ValueError, TypeError) as e:
        raise ValueError(f"{setting} record {i}: {e}") from None
    return r


def save(profile: dict, path) -> None:
    write_json(Path(path), profile)  # JSON writes tuples as lists and block sizes as strings: `from_json` reads them


def load(path) -> dict:
    """The profile in `path`; a ValueError naming the file if it is not one (or not a regular file)."""
    try:
        return from_json(read_json(path, "the profile"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a valid acceptance profile: {getattr(e, 'strerror', None) or e}") from None


def shipped() -> dict | None:
    """The shipped profile (PROFILE_FILE), None where there is none, read once per process while unchanged; a file
    there that cannot be read (a device, a loop, not a profile) is an error naming it, not a reason to profile again."""
    if not os.path.lexists(PROFILE_FILE):
        return None
    with contextlib.suppress(OSError):
        if stat.S_ISREG((st := os.stat(PROFILE_FILE)).st_mode):
            key = (str(PROFILE_FILE), st.st_ino, st.st_mtime_ns, st.st_size)
            if key not in _SHIPPED:
                _SHIPPED.clear()
                _SHIPPED[key] = load(PROFILE_FILE)
            return _SHIPPED[key]
    return load(PROFILE_FILE)  # an error naming the file and why


def read_prompts(path) -> list[str]:
    """The prompts of a JSONL file, one {"prompt": "..."} object a line (gzipped if it ends in .gz), UTF-8, at most
    PROMPTS_MAX_BYTES; a ValueError naming the file (and line) if it is not one or a prompt is empty."""
    path, form = Path(path), 'give a JSONL file, one {"prompt": "..."} object per line'
    try:
        data = read_regular(path, str(path), PROMPTS_MAX_BYTES, form)
        if gzipped := path.suffix == ".gz":
            with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
                data = f.read(PROMPTS_MAX_BYTES + 1)
            if len(data) > PROMPTS_MAX_BYTES:
                raise ValueError(f"{path} is over {PROMPTS_MAX_BYTES >> 20} MB gunzipped, more than specdec_np reads")
        text = utf8(data, f"{path}: the {'gunzipped ' * gzipped}file")
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:  # zlib.error: corrupt deflate data
        raise ValueError(f"{path}: not gzipped UTF-8 text ({e}): {form}") from None
    except OSError as e:  # missing, a directory, unreadable
        raise ValueError(f"{path}: {e.strerror or e}") from None
    prompts = []
    for i, line in enumerate(text.split("\n"), 1):  # not splitlines(): JSON strings may hold U+2028 as it is
        if not line.strip():
            continue
        if len(line) > PROMPT_MAX_BYTES:  # as generate's: tokenizing it would take GBs to keep 1024 tokens
            raise ValueError(f"{path}: line {i}: the prompt is over {PROMPT_MAX_BYTES >> 20} MB, more than "
                             "specdec_np reads")
        try:
            rec = parse_json(line, f"line {i}")
        except ValueError as e:
            raise ValueError(f"{path}: {e}: {form}") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("prompt"), str) or not rec["prompt"]:
            raise ValueError(f"{path}: line {i} needs a non-empty \"prompt\" field: {form}")
        prompts.append(rec["prompt"])
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts


def calibration_prompts(enc, path=weights_file("calibration.jsonl")) -> list[list[int]]:
    """The calibration prompts (code held out from the embedded models' training) as token ids."""
    return [encode(enc, text) for text in read_prompts(path)]
