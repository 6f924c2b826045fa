"""weights/adopt_pair.py, the steps that redo what rests on the embedded pair: its command line, and that what its
steps read (scripts, the README's caption, the docs' description of the pair) is still where it looks."""

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "weights"))
import adopt_pair  # noqa: E402


def test_list_names_every_step_in_order(capsys):
    assert adopt_pair.main(["--list"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == [s.__name__ for s in adopt_pair.STEPS]
    assert listed.index("lessons") < listed.index("notebooks")  # it reads the notebooks the other rewrites
    assert listed.index("profile") < listed.index("constant") and listed[-1] == "tests"


@pytest.mark.parametrize("args, said", [(["--only", "pinned,nope"], "no step 'nope'"), (["--from", "nope"], "no step"),
                                        (["--only", "pinned", "--from", "trace"], "give one")])
def test_a_bad_step_is_a_one_line_error(args, said, capsys):
    with pytest.raises(SystemExit) as e:
        adopt_pair.main(args)
    assert e.value.code == 2 and said in capsys.readouterr().err


def test_every_script_and_file_it_names_exists():
    """The scripts and files its steps run or write, named in its source, are in the repository (a rename fails)."""
    source = (ROOT / "weights" / "adopt_pair.py").read_text(encoding="utf-8")
    named = set(re.findall(r"\b((?:weights|tests|tutorials|specdec_np|docs)/[\w./-]+\.(?:py|jsonl|json|png|md))\b",
                           source))
    assert {"weights/make_profile.py", "tests/fixtures/record_pinned_55d3cd9.py", "tutorials/make_notebooks.py"} <= named
    missing = [n for n in named if not (ROOT / n).is_file()]
    assert not missing, missing


def test_the_trace_tests_sampled_run_is_found():
    assert adopt_pair.SAMPLED_RUN.search(adopt_pair.TRACE_TEST.read_text(encoding="utf-8"))


def test_the_readmes_trace_caption_is_found():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert adopt_pair.CAPTION.search(readme) and adopt_pair.ALT.search(readme)
    assert not adopt_pair.CAPTION.search(readme.replace("sampled staged run", "staged run"))  # the control


def test_the_docs_describing_a_shape_are_found():
    """After a pair of other shapes, the step lists where the docs describe the old one: here, the shipped target."""
    from specdec_np.checkpoint import read_config

    config = read_config(ROOT / "specdec_np" / "weights" / "tiny-target" / "config.json")
    hits = adopt_pair.quoted_shape(config, with_width=True)
    assert ("README.md", f"{config.n_params / 1e6:.0f}M") in {(f, said) for f, _, said in hits}
    bigger = type(config)(**{**vars(config), "n_embd": 704, "n_layer": 13, "n_head": 11})  # a shape no doc names
    assert not [h for h in adopt_pair.quoted_shape(bigger, with_width=True) if h[0] == "README.md"]
