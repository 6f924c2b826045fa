"""Any locale (issue 70): what specdec_np writes is UTF-8 and what it reads as text is read as UTF-8 whatever the
locale; output a terminal's encoding cannot show degrades to '?', never fails; a byte-order mark at the start of a
text file is dropped by one rule (`files.utf8`), for generate's --file and bench's --prompts alike."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from specdec_np import files, ngram
from specdec_np.tokenizer import encode, get_encoding
from specdec_np.tools import acceptance
from specdec_np.tools.cli import main

ROOT = Path(__file__).resolve().parents[2]
TEXT = 'def f(x):\n    return "«é»"  # ½\n'
ASCII = {**{k: v for k, v in os.environ.items() if not k.startswith(("LC_", "PYTHONIOENCODING", "PYTHONUTF8"))},
         "LANG": "C", "LC_ALL": "C", "PYTHONUTF8": "0", "NO_COLOR": "1"}


def run_in_c_locale(*args, cwd):
    return subprocess.run([sys.executable, *args], capture_output=True, cwd=cwd, env=ASCII, timeout=300)


def test_the_c_locale_is_ascii_here(tmp_path):
    """The control the tests below rest on: under these variables Python's own text files are ASCII (open() with no
    encoding cannot write '«'), so a command that passes below does so by writing UTF-8 itself."""
    script = "import locale; print(locale.getpreferredencoding(False)); open('x', 'w').write(chr(171))"
    r = run_in_c_locale("-c", script, cwd=tmp_path)
    assert r.returncode == 1 and b"UnicodeEncodeError" in r.stderr, r.stderr
    assert r.stdout.decode().strip() in ("ANSI_X3.4-1968", "ascii", "US-ASCII"), r.stdout


def test_trace_generate_and_ngram_fit_work_under_the_c_locale(tmp_path):
    """Issue 70's reproduction: trace wrote its page (whose template holds '«') in the locale's encoding and exited 2;
    it is written as UTF-8. generate's non-ASCII prompt (an argument: bytes decoded with surrogateescape) comes out
    as '?' with one note; ngram fit reads a non-ASCII file (and writes a non-ASCII name)."""
    (tmp_path / "p.py").write_text(TEXT, encoding="utf-8")
    r = run_in_c_locale("-m", "specdec_np", "trace", "--file", "p.py", "--plan", "default", "--max-new-tokens", "8",
                        "--out", "t.html", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    page = (tmp_path / "t.html").read_text(encoding="utf-8")
    assert "«" in page and "«é»" in page  # the template's own character, and the prompt's text in the data

    r = run_in_c_locale("-m", "specdec_np", "generate", "s = '«é»'", "--plan", "default", "--max-new-tokens", "4",
                        cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(b"s = '???'")  # the prompt read right (3 characters), each shown as '?'
    assert r.stderr.decode().count("cannot show some characters") == 1, r.stderr

    r = run_in_c_locale("-m", "specdec_np", "ngram", "fit", "p.py", "--out", "«t».npz", "--n-vocab", "300",
                        cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    direct = ngram.fit(np.array(encode(get_encoding(300), TEXT)), 300)  # the file's text, read as UTF-8
    assert ngram.load(tmp_path / "«t».npz").counts["uni_count"].tolist() == direct.counts["uni_count"].tolist()


def test_bench_writes_its_results_as_utf8_under_the_c_locale(tmp_path):
    """bench's results pair and its --results section (through `files.atomic_files`), with a non-ASCII cell, under
    the C locale: written, and read back as UTF-8 (the section is replaced, the text around it kept)."""
    (tmp_path / "RESULTS.md").write_text("# Results\n\nà propos\n\n## this machine\n\nold\n", encoding="utf-8")
    script = ("import sys; from pathlib import Path; from specdec_np.tools import bench\n"  # ASCII: argv is decoded
              "out, cell = Path(sys.argv[1]), '\\xab\\xe9\\xbb'\n"
              "bench.write_results(out / 'b', {'cell': cell}, f'| {cell} |', '--out b')\n"
              "bench.update_results(out / 'RESULTS.md', 'this machine', f'| {cell}new |')\n")
    r = run_in_c_locale("-c", script, str(tmp_path), cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "b" / "results.json").read_text(encoding="utf-8")) == {"cell": "«é»"}
    assert (tmp_path / "b" / "results.md").read_text(encoding="utf-8") == "| «é» |\n"
    md = (tmp_path / "RESULTS.md").read_text(encoding="utf-8")
    assert "à propos" in md and "| «é»new |" in md and "old" not in md


BOM = b"\xef\xbb\xbf"


def test_a_byte_order_mark_at_the_start_is_dropped_by_one_rule(tmp_path, capsys):
    """A BOM at the start of --file (as some Windows editors save) is not the prompt's first character, and bench's
    --prompts reads such a file too: one rule (`files.utf8`). A BOM anywhere else is text, kept (the control)."""
    (tmp_path / "p.py").write_bytes(BOM + b"def f(x):\n")
    (tmp_path / "q.py").write_bytes(b"def f(x):\n" + BOM + b"#\n")
    assert main(["generate", "--file", str(tmp_path / "p.py"), "--plan", "default", "--max-new-tokens", "2"]) == 0
    assert capsys.readouterr().out.startswith("def f(x):\n")
    assert main(["generate", "--file", str(tmp_path / "q.py"), "--plan", "default", "--max-new-tokens", "2"]) == 0
    assert capsys.readouterr().out.startswith("def f(x):\n\ufeff#\n")

    (tmp_path / "p.jsonl").write_bytes(BOM + b'{"prompt": "def f(x):"}\n{"prompt": "\xef\xbb\xbfx"}\n')
    assert acceptance.read_prompts(tmp_path / "p.jsonl") == ["def f(x):", "\ufeffx"]
    (tmp_path / "q.jsonl").write_bytes(b'{"prompt": "a"}\n' + BOM + b'{"prompt": "b"}\n')
    with pytest.raises(ValueError, match="line 2: not JSON"):  # a line's own BOM is not the file's
        acceptance.read_prompts(tmp_path / "q.jsonl")
    with pytest.raises(ValueError, match=r"it is not UTF-8 text: byte 4 is b'\\xff'"):  # counted in the file's bytes
        files.utf8(BOM + b"x\xff", "it")
    # ngram fit reads its files by the same rule: with a BOM or without, the same counts.
    (tmp_path / "plain.py").write_bytes(b"def f(x):\n")
    for name in ("p.py", "plain.py"):
        assert main(["ngram", "fit", str(tmp_path / name), "--out", str(tmp_path / f"{name}.npz"), "--n-vocab",
                     "300"]) == 0
    with_bom, plain = (ngram.load(tmp_path / f"{name}.npz").counts for name in ("p.py", "plain.py"))
    assert all(np.array_equal(with_bom[k], plain[k]) for k in plain)
