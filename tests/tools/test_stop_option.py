"""--stop on the command line (generate, the demo; bench's: test_bench.py): its values (backslash escapes,
`humaneval`), the completion printed up to the first stop string, and the tools saying which they used."""

import types

import pytest

from specdec_np.tokenizer import cut_at_stop
from specdec_np.tools import demo
from specdec_np.tools.bench import HUMANEVAL_STOP, stop_strings
from specdec_np.tools.cli import main

PROMPT = 'def is_prime(n):\n    """Return True if n is prime."""\n'


@pytest.mark.parametrize("values, stops", [
    (None, ()), (["\\ndef"], ("\ndef",)), (["\\n#", "\\t"], ("\n#", "\t")), (["a\\\\b"], ("a\\b",)),
    (["humaneval"], HUMANEVAL_STOP), (["humaneval", "\\ndef", "x"], (*HUMANEVAL_STOP, "x")), (["none"], ()),
    (["é€\\u00e9"], ("é€é",)), (["\\x41\\101"], ("AA",)),
])
def test_stop_values_understand_backslash_escapes(values, stops):
    assert stop_strings(values) == stops


@pytest.mark.parametrize("values, message", [
    (["abc\\"], r"--stop 'abc\\\\': \\ at end of string \(a backslash starts an escape such as \\n"),
    (["\\x4"], r"--stop '\\\\x4': truncated \\xXX escape"),
    ([""], r"--stop is empty: give the text that ends the completion"),
])
def test_bad_stop_values_are_one_line_errors_naming_the_option(values, message):
    with pytest.raises(ValueError, match=f"^{message}") as e:
        stop_strings(values)
    assert "\n" not in str(e.value)


def run_generate(capsys, *args) -> tuple[int, str, str]:
    rc = main(["generate", PROMPT, "--plan", "default", "--max-new-tokens", "40", *args])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("method", ["ar", "staged"])
def test_generate_prints_the_completion_up_to_the_first_stop_string(capsys, method):
    rc, full, _ = run_generate(capsys, "--method", method)
    assert rc == 0 and "\ndef" in full[len(PROMPT):]  # the control: without --stop it goes on past the function
    rc, out, err = run_generate(capsys, "--method", method, "--stop", "humaneval", "--stats")
    assert rc == 0 and out == PROMPT + cut_at_stop(full[len(PROMPT):-1], HUMANEVAL_STOP) + "\n"
    assert "\ndef" not in out[len(PROMPT):] and len(out) < len(full)
    assert "stop: stop (--stop: HumanEval's stop sequences (\\ndef, \\nclass, \\nif, \\nprint, \\n#))" in err


def test_generate_refuses_a_bad_stop_before_any_work(capsys, monkeypatch):
    monkeypatch.setattr("specdec_np.tools.cli.load_model", lambda *a: pytest.fail("loaded before the check"))
    rc, _, err = run_generate(capsys, "--stop", "abc\\")
    assert rc == 2 and err.startswith("error: --stop 'abc\\\\': \\ at end of string") and err.count("\n") == 1


def test_the_demos_completion_is_cut_at_the_stop_string_inside_a_token():
    """colour_by_stage shows the text before the first stop string, cutting the token that holds its start."""
    from specdec_np.models import load_embedded
    from specdec_np.tokenizer import encode

    enc = load_embedded()[3]
    tokens = encode(enc, "    return x\n\n\ndef g():\n")
    result = types.SimpleNamespace(tokens=tokens, stats=types.SimpleNamespace(source=[0] * len(tokens)))
    assert demo.colour_by_stage(enc, result, False, ["\ndef"]) == demo.PROMPT + "    return x\n\n"
    assert demo.colour_by_stage(enc, result, False, ["x\n"]) == demo.PROMPT + "    return "
    assert demo.colour_by_stage(enc, result, False) == demo.PROMPT + "    return x\n\n\ndef g():\n"  # no stop
