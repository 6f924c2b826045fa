# The README's two commands are the contract: `make demo` and `make test` set everything up themselves.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test bench weights tutorials venv clean

# The venv is (re)installed only when pyproject.toml changes: a second run installs nothing.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[test]"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) -m specdec_np demo

test: $(STAMP)
	$(PY) -m pytest -q

# The benchmark's prompts (HumanEval) and its --plot charts (matplotlib) come from optional extras,
# never needed by demo or test.
$(VENV)/.bench: $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[bench,plot]"
	touch $@

# make bench ARGS="--limit 10"   (ARGS="--curves", "--seeds 2", "--plot" ...: see --help)
bench: $(VENV)/.bench
	$(PY) -m specdec_np bench $(ARGS)

# Real GPT-2 checkpoints from the Hugging Face hub (the only target that needs the network).
MODELS ?= gpt2-large gpt2
weights: $(STAMP)
	$(PY) -m specdec_np weights $(MODELS)

tutorials: $(STAMP)
	@ls tutorials/[0-9]*.py >/dev/null 2>&1 || { echo "no tutorials yet"; exit 0; }; \
	for t in tutorials/[0-9]*.py; do echo "== $$t"; $(PY) $$t || exit 1; done

clean:
	rm -rf $(VENV) out .pytest_cache .hypothesis
