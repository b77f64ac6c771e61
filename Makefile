# The two commands a learner and an instructor need:
#   make lab    set everything up, then open the course in JupyterLab
#   make test   set everything up, then run every test and every notebook
#
# For instructors: make outputs   re-execute every lesson and solution here, storing the outputs
#
# Overrides: PYTHON=python3.12   the interpreter that creates .venv (3.10 or newer)
#            TORCH_SPEC=...      what pip installs for torch (default: the newest release;
#                                CI pins a CPU build with TORCH_SPEC=torch==2.13.0)
#            PORT=8888 TOKEN=... where `make lab` listens, and its access token (default: random)

PYTHON ?= python3
TORCH_SPEC ?= torch
PORT ?= 8888
TOKEN ?=
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.mpcourse-installed
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg
# Another CPU's kernel paths on this one: torch's baseline (non-vectorised) kernels and oneDNN
# limited to AVX2. Floats that depend on the machine's kernels come out different here, so a
# stored output that holds only on the author's CPU fails here, not on an instructor's.
OTHER_KERNELS := ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=AVX2

.PHONY: lab test unit notebooks portability browser outputs bench release check-python clean \
	hosted site dist

check-python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' 2>/dev/null || { \
	  v=$$($(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo "not found"); \
	  echo "error: mpcourse needs Python 3.10 or newer, but PYTHON=$(PYTHON) is $$v." >&2; \
	  echo "       Install a newer Python and run, for example: make $(MAKECMDGOALS) PYTHON=python3.11" >&2; \
	  exit 1; }

$(PY): | check-python
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[dev]"
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

test: check-python $(STAMP) unit hosted notebooks portability browser

unit: $(STAMP)
	$(PY) -m pytest tests/ --ignore=tests/browser --ignore=tests/hosted

# Prints each notebook's execution time (tests/notebook_times.py).
notebooks: $(STAMP)
	$(PY) -m pytest -p tests.notebook_times $(NBVAL) notebooks/ solutions/

# The lessons once more on other kernel paths (see OTHER_KERNELS).
portability: $(STAMP)
	$(OTHER_KERNELS) $(PY) -m pytest -p tests.notebook_times $(NBVAL) notebooks/

# Re-execute every lesson and solution on this machine and store the outputs (INSTRUCTORS.md, 6).
outputs: $(STAMP)
	@for nb in notebooks/[0-9][0-9]_*.ipynb solutions/ex[0-9][0-9]_*.ipynb; do \
	  echo "== $$nb"; $(PY) -m jupyter nbconvert --to notebook --execute --inplace \
	    --ExecutePreprocessor.timeout=600 "$$nb" || exit 1; done

# Every lesson in JupyterLab in headless Chromium (skipped, with the reason, when none is found).
browser: $(STAMP)
	$(PY) -m pytest -rs tests/browser/

# Installs as a learner would (tests/hosted): the built wheel in a clean venv, and lessons 00 and 06
# and exercise 01 alone in a bare Python (torch, Jupyter's kernel, nbval) whose first cell installs
# that wheel, as it installs the package in Colab or Kaggle.
hosted: $(STAMP)
	$(PY) -m pytest -rs tests/hosted/

# The course as a static website in build/site, rendered from the notebooks' stored outputs
# (nothing is executed): site/conf.py. tests/browser/test_site.py checks it in Chromium.
site: $(STAMP)
	$(PY) -m sphinx -q -b html -c site . build/site
	@echo "open build/site/index.html"

# The wheel and the sdist, in dist/.
dist: $(STAMP)
	$(PY) -m build --outdir dist .

bench: $(STAMP)
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

release: $(STAMP)
	$(VENV)/bin/mpcourse release

clean:
	rm -rf $(VENV) build *.egg-info
