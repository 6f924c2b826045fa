# The README's two commands are the contract: `make demo` and `make test` set everything up themselves.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: help demo test bench weights memory tutorials exercises notebooks trace screenshots trace-png venv clean
.DEFAULT_GOAL := help

help:
	@echo "make demo        set up .venv and run the offline demo (every method on one prompt)"
	@echo "make test        set up .venv and run the test suite (offline)"
	@echo "make tutorials   run the lessons in tutorials/"
	@echo "make exercises   grade your solutions in tutorials/exercises/ (exact checks, one line each)"
	@echo "make notebooks   regenerate tutorials/notebooks/ from the lessons (quiet machine; installs Jupyter)"
	@echo "make trace       one decoding run as a self-contained HTML page, out/trace.html"
	@echo "make trace-png   docs/trace.png, the README's picture of the trace page (needs Chromium)"
	@echo "make bench       the HumanEval benchmark (ARGS=\"--limit 10\", ...; installs its prompts)"
	@echo "make weights     download real GPT-2 checkpoints into specdec_np/weights/ (MODELS=\"gpt2-large gpt2\"; needs the network)"
	@echo "make memory      peak memory of generate with gpt2-large + gpt2 shapes (random weights, in /tmp)"
	@echo "make venv        only set up .venv;  make clean  remove .venv and out/"

# The venv is (re)installed only when pyproject.toml changes: a second run installs nothing.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[test]"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) -m specdec_np demo

# One line per test file with its progress (a few minutes in all on 2 cores).
test: $(STAMP)
	$(PY) -m pytest

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

# Peak resident memory of `generate` with a gpt2-large-shaped target and a gpt2-shaped draft, random
# weights written to a temporary directory and deleted (ARGS="--plan machine" for this machine's plan).
memory: $(STAMP)
	$(PY) weights/measure_memory.py $(ARGS)

# One decoding run as a self-contained HTML page, out/trace.html: by default make trace-png's run (below), the
# demo's prompt, staged and sampled, so that the rule's min(1, p/q) against u shows; the constant plan (the same
# tokens on every machine; the passes' costs are measured on this one). Open it offline; arrow keys step through it.
# Greedy: make trace TRACE_ARGS="--method staged --plan default --max-new-tokens 64"
TRACE_ARGS ?= $(PNG_ARGS)
trace: $(STAMP)
	mkdir -p out
	$(PY) -c "from specdec_np.tools.demo import PROMPT; print(PROMPT, end='')" | \
	  $(PY) -m specdec_np trace - $(TRACE_ARGS) --out out/trace.html

# The trace page as a real browser draws it, at a few steps (out/trace-step-N.png), for a person
# to look at. Needs Chromium; not part of `make test`.
CHROMIUM ?= chromium
SHOT_STEPS ?= 1 3 5 9
SHOT_SIZE ?= 1100,900
SHOT = $(CHROMIUM) --headless --disable-gpu --hide-scrollbars --virtual-time-budget=2000 \
  $$( [ "$$(id -u)" = 0 ] && echo --no-sandbox )
screenshots: trace
	@command -v $(CHROMIUM) >/dev/null 2>&1 || { echo "screenshots need Chromium: apt-get install chromium"; exit 1; }
	@for k in $(SHOT_STEPS); do \
	  $(SHOT) --window-size=$(SHOT_SIZE) --screenshot=out/trace-step-$$k.png "file://$(CURDIR)/out/trace.html#step=$$k" \
	    >/dev/null 2>&1 && test -s out/trace-step-$$k.png && echo "wrote out/trace-step-$$k.png" || exit 1; \
	done

# docs/trace.png, the README's picture: step PNG_STEP of this sampled run. The README's caption
# gives its step and token counts; tests/tools/test_trace.py reads these two lines and checks the
# caption against a run of the same arguments (it needs no browser).
PNG_ARGS = --method staged --plan default --max-new-tokens 64 --temperature 1 --top-k 50 --seed 1 --sampled without --widths 2,2,1
PNG_STEP = 4
trace-png: $(STAMP)
	@command -v $(CHROMIUM) >/dev/null 2>&1 || { echo "trace-png needs Chromium: apt-get install chromium"; exit 1; }
	$(MAKE) trace TRACE_ARGS="$(PNG_ARGS)"
	$(SHOT) --window-size=1280,1500 --screenshot=docs/trace.png "file://$(CURDIR)/out/trace.html#step=$(PNG_STEP)" >/dev/null 2>&1
	test -s docs/trace.png && echo "wrote docs/trace.png"

# Each lesson through tutorials/lesson.py, which ends it in one line on Ctrl-C (exit status 130).
tutorials: $(STAMP)
	@for t in tutorials/[0-9]*.py; do echo "== $$t"; $(PY) tutorials/lesson.py $$t || exit $$?; done

# One executed notebook per lesson in tutorials/notebooks/ (jupytext, nbclient, ipykernel from the
# notebooks extra; the kernel `specdec_np` is registered for the current user, first). OpenBLAS picks its
# own kernel for the CPU: OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are unset for this command only.
# Refuses on a busy machine (the notebooks show a quiet run's timings); Ctrl-C: one line, exit 130.
$(VENV)/.notebooks: $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[notebooks]"
	touch $@

notebooks: $(VENV)/.notebooks
	@env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $(PY) tutorials/make_notebooks.py

# Each exercise graded in a process of its own; exit 1 until every one is correct (the stubs say "not
# yet written"), and make then adds its own line "make: *** [...] Error 1". ARGS="--case 1:2" reruns
# one case in full, ARGS="--help" says more.
exercises: $(STAMP)
	@$(PY) tutorials/exercises/grade.py $(ARGS)

clean:
	rm -rf $(VENV) out .pytest_cache .hypothesis
