"""GPT-2's byte-pair encoding, built offline from the two files shipped in `weights/`.

The full encoding has 50257 tokens. The embedded tiny models use its first N ranks (ids 0..N-1 are GPT-2's,
`<|endoftext|>` becomes id N), so that the embedding table does not dominate a small model; a model's
vocabulary size says which: `n_vocab == 50257` is full GPT-2, otherwise `n_vocab - 1` ranks.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import tiktoken

from .files import WEIGHTS_DIR, check_weights_dir, read_regular
from .values import integral

# The digests tiktoken itself pins for these files. We check them on the bytes we read and build the ranks
# from those bytes (`bpe_ranks`): tiktoken's own loader would read a copy from its cache in $TMPDIR, unchecked.
BPE_FILES = {"vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
             "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"}
GPT2_N_VOCAB = 50257  # 50256 BPE ranks + <|endoftext|>
EOT = "<|endoftext|>"
# GPT-2's pre-tokenizer regex (as in tiktoken's "gpt2" encoding).
PAT_STR = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


@functools.lru_cache(maxsize=None)
def _gpt2_ranks(bpe_dir: str) -> dict[bytes, int]:
    data = {}
    for name, expected in BPE_FILES.items():
        path = Path(bpe_dir) / name
        try:
            data[name] = read_regular(path, f"tokenizer file {path}", limit=1 << 24)
        except FileNotFoundError as e:
            raise FileNotFoundError(f"tokenizer file {path} is missing ({e.strerror}; it ships with specdec_np in "
                                    "specdec_np/weights/)") from None
        except OSError as e:
            raise ValueError(f"tokenizer file {path}: {e.strerror or e}") from None
        got = hashlib.sha256(data[name]).hexdigest()
        if got != expected:
            raise ValueError(f"tokenizer file {path} has sha256 {got}, expected {expected}: "
                             "the file is corrupt or not GPT-2's")
    return bpe_ranks(data["vocab.bpe"])


def bpe_ranks(vocab_bpe: bytes) -> dict[bytes, int]:
    """{token bytes: rank} from GPT-2's merges (as tiktoken's `data_gym_to_mergeable_bpe_ranks`): the 256 bytes,
    then each merge's two parts joined, in order. vocab.bpe writes a byte as a printable character: the printable
    bytes but space as themselves, the other 68 as chr(256), chr(257), ... in byte order."""
    kept = [b for b in range(256) if chr(b).isprintable() and chr(b) != " "]
    moved = [b for b in range(256) if b not in kept]
    byte_of = {chr(b): b for b in kept} | {chr(256 + i): b for i, b in enumerate(moved)}
    ranks = {bytes([b]): r for r, b in enumerate(kept + moved)}
    for line in vocab_bpe.decode("utf-8").split("\n")[1:-1]:  # a version line first, a newline last
        first, second = line.split()
        ranks[bytes(byte_of[c] for c in first + second)] = len(ranks)
    return ranks


def get_encoding(n_vocab: int = GPT2_N_VOCAB, bpe_dir: str | Path = WEIGHTS_DIR) -> tiktoken.Encoding:
    """GPT-2 BPE for a model with `n_vocab` tokens: the first `n_vocab - 1` ranks (GPT-2's own ids) and
    `<|endoftext|>` as id `n_vocab - 1`."""
    if not 257 <= n_vocab <= GPT2_N_VOCAB:
        raise ValueError(f"n_vocab={n_vocab} has no GPT-2 BPE tokenizer: it needs 257 <= n_vocab <= {GPT2_N_VOCAB}")
    if Path(bpe_dir) == WEIGHTS_DIR:
        check_weights_dir(WEIGHTS_DIR)  # a bad SPECDEC_NP_WEIGHTS is named, not just the file it lacks
    return _encoding(n_vocab, str(Path(bpe_dir).resolve()))


@functools.lru_cache(maxsize=None)
def _encoding(n_vocab: int, bpe_dir: str) -> tiktoken.Encoding:
    ranks = _gpt2_ranks(bpe_dir)
    n_ranks = n_vocab - 1
    if n_ranks < len(ranks):
        # BPE merges only ever build a token from two lower-ranked ones, so the first N ranks are a
        # closed vocabulary: encoding with them equals GPT-2's BPE with its first N - 256 merges.
        ranks = {tok: r for tok, r in ranks.items() if r < n_ranks}
    name = "gpt2" if n_vocab == GPT2_N_VOCAB else f"gpt2_{n_ranks}"
    return tiktoken.Encoding(name, pat_str=PAT_STR, mergeable_ranks=ranks, special_tokens={EOT: n_ranks})


def encode(enc: tiktoken.Encoding, text: str) -> list[int]:
    """Token ids of `text`; the literal string `<|endoftext|>` in it becomes the EOT token."""
    return enc.encode(text, allowed_special={EOT})


def decode(enc: tiktoken.Encoding, tokens) -> str:
    """Text of `tokens` (integer ids); a TypeError for text or ids that are not integers (1.5 is not token 1), a
    ValueError naming the first id outside the vocabulary."""
    if isinstance(tokens, (str, bytes)):
        raise TypeError(f"tokens must be token ids, not text: got {type(tokens).__name__} {tokens!r:.60}")
    try:
        tokens = list(tokens)
    except TypeError:
        raise TypeError(f"tokens must be a list of token ids, got {type(tokens).__name__} {tokens!r:.60}") from None
    if bad := [t for t in tokens if not integral(t)]:
        raise TypeError(f"tokens must be integer token ids: {len(bad)} of {len(tokens)} are not, the first "
                        f"{bad[0]!r:.60}")
    tokens = [int(t) for t in tokens]
    if bad := [t for t in tokens if not 0 <= t < enc.n_vocab]:
        raise ValueError(f"token id {bad[0]} is outside the vocabulary (0..{enc.n_vocab - 1}) of {enc.name}")
    return enc.decode(tokens)


def cut_at_stop(text: str, stop) -> str:
    """`text` up to the first of the `stop` strings in it (all of it if none is): a completion's text when
    `decode.generate` stopped at one (its tokens end with the token that completes it)."""
    return text[:min((i for s in stop if (i := text.find(s)) >= 0), default=len(text))]
