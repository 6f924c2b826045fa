"""The embedded pair's acceptance profile, specdec_np/weights/profile.json (tens of minutes; the maintainers' tool).

    python weights/make_profile.py [--jobs 2] [--out out/profile] [--methods eagle]

Every candidate plan (`acceptance.candidates`) decodes the calibration prompts greedily and at top-k 50
(T=1), and what it did past each prefill is counted (specdec_np/tools/acceptance.py): counts depend only
on the models and prompts, so the profile ships and every machine's plan choice reads it. eagle's candidates
draft with the embedded target's EAGLE head (`models.load_head`), which the profile names. --methods eagle
counts only those methods' candidates and merges them into the shipped profile (it must be this pair's),
whose other records stay as they are, byte for byte: after retraining the head, only its plans are counted
again. Each finished
candidate is appended to a journal in --out, where an interrupted run resumes (a line another version of
the code wrote, or one of other models, head, prompts or sizes, or one cut short, is counted again); --jobs N counts candidates in N processes of one BLAS
thread each. The profile goes to the weights directory ($SPECDEC_NP_WEIGHTS, else specdec_np/weights/), named
before anything is measured.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import multiprocessing
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specdec_np.files import WEIGHTS_DIR, WEIGHTS_ENV, check_weights_dir, read_json  # noqa: E402
from specdec_np.methods import METHODS  # noqa: E402
from specdec_np.models import load_embedded, load_head  # noqa: E402
from specdec_np.tools import acceptance  # noqa: E402
from specdec_np.tools.cache import write_json  # noqa: E402
from specdec_np.tools.machine import use_threads  # noqa: E402
from specdec_np.tools.progress import Progress  # noqa: E402
from specdec_np.tools.writable import check_writable  # noqa: E402

_JOB = None  # in a worker process, the job it counts candidates of (`_init_worker`)


def job_key(job) -> str:
    """What a journal line's counts rest on besides the code: the models and head (their digests), the prompts, the
    tokens and seeds per prompt; so that a journal another pair or head left is never resumed as this one's."""
    target, draft, ngram, prompts, max_new_tokens, seeds, head = job
    head = None if head is None else acceptance.head_key(head)
    said = repr((acceptance.pair_key(target, draft, ngram), head, [list(p) for p in prompts], max_new_tokens, seeds))
    return hashlib.sha256(said.encode()).hexdigest()[:16]


def read_journal(path: Path, key: str) -> dict:
    """{candidate_key: counts} of a journal's lines of `key` (`job_key`); a line of another version or job, or cut
    short, is counted again."""
    done, bad = {}, 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
            record = acceptance.from_json_record(rec["record"])
            candidate = acceptance.candidate_key(rec["setting"], rec["method"], rec["shape"])
        except (ValueError, KeyError, TypeError):
            bad += 1
            continue
        if rec.get("version") == acceptance.VERSION and rec.get("job") == key:
            done[candidate] = record
    if bad:
        sys.stderr.write(f"note: {path}: {bad} lines are not journal records: their candidates are counted again\n")
    return done


def journalled(journal: Path, jobs: int = 1):
    """An `acceptance.measure` count_all: the candidates `journal` holds, then the others, each appended to it
    as it is counted, here or in `jobs` processes of one BLAS thread each (several processes' BLAS threads would
    wait on each other)."""
    def count_all(job, todo):
        this = job_key(job)
        done = read_journal(journal, this) if journal.is_file() else {}
        missing = []
        for item in todo:
            if (key := acceptance.candidate_key(*item)) in done:
                yield *item, done[key]
            else:
                missing.append(item)
        for setting, method, shape, total in counted_all(job, missing, jobs):
            with open(journal, "a") as f:
                f.write(json.dumps({"version": acceptance.VERSION, "job": this, "setting": setting,
                                    "method": method, "shape": shape, "record": total}) + "\n")
            yield setting, method, shape, total
    return count_all


def counted_all(job, missing, jobs: int):
    """`acceptance.counted` for each missing candidate, as each finishes: here, or in `jobs` processes."""
    if jobs <= 1 or len(missing) <= 1:
        yield from acceptance.count_each(job, missing)
        return
    with multiprocessing.get_context("spawn").Pool(jobs, initializer=_init_worker, initargs=(job,)) as pool:
        yield from pool.imap_unordered(_counted, missing)


def _init_worker(job):
    global _JOB
    _JOB = job
    use_threads(1)


def _counted(item):
    return acceptance.counted(_JOB, item)


def merged(old: dict, new: dict, methods) -> dict:
    """The profile `old` (as its file reads, JSON's lists and strings) with `methods`' records replaced by `new`'s,
    appended to each setting's; its other records and fields kept as they are (the head `new` names, where
    `methods` holds eagle)."""
    out = copy.deepcopy(old)
    for setting, records in new["settings"].items():
        out["settings"][setting] = [r for r in out["settings"].get(setting, []) if r["method"] not in methods] + [
            json.loads(json.dumps(r)) for r in records]
    if "head" in new and any(METHODS[m].drafts_with == "head" for m in methods):  # its eagle records: that head's
        out["head"] = new["head"]
    return out


def existing_profile(dest: Path, pair: str, prompts: int) -> dict:
    """The profile at `dest`, as its file reads, to merge into: this pair's, of the same prompts (a ValueError
    saying why not)."""
    if not dest.is_file():
        raise ValueError(f"--methods merges into the profile at {dest}, and there is none: run without --methods")
    raw = read_json(dest, "the profile")
    acceptance.from_json(copy.deepcopy(raw))  # a ValueError if not a profile of this version
    if raw["models"] != pair or raw["prompts"] != prompts:
        raise ValueError(f"--methods: {dest} is the profile of other models or prompts: run without --methods")
    return raw


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=1, help="count candidates in this many processes (default: 1)")
    ap.add_argument("--out", default="out/profile", help="directory for the journal an interrupted run resumes from")
    ap.add_argument("--methods", help="comma-separated: count only these methods' candidates and merge them into the "
                    f"shipped profile, keeping its other records ({', '.join(acceptance.PROFILED)})")
    a = ap.parse_args(argv)
    if a.jobs < 1:
        ap.error(f"--jobs must be >= 1, got {a.jobs}")
    methods = None if a.methods is None else a.methods.split(",")
    if methods is not None and (bad := [m for m in methods if m not in acceptance.PROFILED]):
        ap.error(f"--methods {a.methods}: {bad[0]!r} is not a profiled method: choose from "
                 f"{', '.join(acceptance.PROFILED)}")
    journal = Path(a.out) / "profile.journal.jsonl"
    try:
        check_writable(journal, f"--out {a.out}", made=True)
        dest = check_weights_dir(WEIGHTS_DIR) / acceptance.PROFILE_FILE.name
        check_writable(dest, f"the profile goes to {dest} (the weights directory, ${WEIGHTS_ENV})", made=True)
    except (ValueError, FileNotFoundError) as e:
        ap.error(str(e))
    which = f" ({', '.join(methods)} only, merged into it)" if methods else ""
    print(f"profiling the embedded pair of {WEIGHTS_DIR} (tens of minutes){which}; the profile goes to {dest}")
    target, draft, ngram, enc = load_embedded()
    head = load_head(target=target)  # eagle's draft: the embedded target's EAGLE head
    prompts, size = acceptance.calibration_prompts(enc), {}
    old = None
    if methods is not None:
        try:
            old = existing_profile(dest, acceptance.pair_key(target, draft, ngram), len(prompts))
        except ValueError as e:
            ap.error(str(e))
        size = {"max_new_tokens": old["max_new_tokens"], "seeds": old["seeds"]}  # counted as the others were
    grid = {s: [c for c in acceptance.candidates(s) if methods is None or c[0] in methods] for s in acceptance.SETTINGS}
    journal.parent.mkdir(parents=True, exist_ok=True)
    profile = acceptance.measure(target, draft, ngram, prompts, progress=Progress("profiling"), grid=grid,
                                 count_all=journalled(journal, a.jobs), head=head, **size)
    if old is None:
        acceptance.save(profile, dest)
    else:
        write_json(dest, merged(old, profile, methods))
    journal.unlink()
    print(f"wrote {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
