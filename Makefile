# `make train`, `make test`, `make test-slurm` (the benchmark tools against a one-node Slurm) and `make docs`. Each
# creates .venv from requirements.txt when it is missing or older than requirements.txt.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The flagship script once it exists, else the first algorithm.
TRAIN_SCRIPT := $(if $(wildcard vmpo_continuous.py),vmpo_continuous.py,ppo_discrete.py)

.PHONY: train test test-slurm docs

$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -r requirements.txt
	touch $@

train: $(VENV)/.installed
	$(PY) $(TRAIN_SCRIPT)

# The video tests render MuJoCo headless; training itself needs no GL library.
GL_CHECK := import vmpo_continuous as s, sys; sys.exit(s.choose_gl_backend(capture_video=True) is None)

test: $(VENV)/.installed
	@$(PY) -c "$(GL_CHECK)" || { echo "make test: the video tests need Mesa's EGL or OSMesa; install one (Debian/Ubuntu: apt-get install libegl1 libegl-mesa0, or libosmesa6)"; exit 1; }
	$(PY) -m ruff format --check .
	$(PY) -m ruff check .
	$(PY) -m pytest

# The tests that submit jobs to a real Slurm (tests/test_slurm.py, marked `slurm`; `make test` deselects them): a
# one-node cluster on this machine (slurmctld and slurmd on localhost, 2 CPUs; Slurm and MUNGE installed from Debian's
# packages where missing, which needs root and apt-get), the tests, then the cluster stopped whether they passed or
# not. Where the cluster cannot start, this fails and says why.
SLURM_DIR ?= /tmp/rl-bench-slurm
test-slurm: $(VENV)/.installed
	bash tools/slurm_cluster.sh start $(SLURM_DIR)
	SLURM_CONF=$(SLURM_DIR)/slurm.conf $(PY) -m pytest -m slurm tests/test_slurm.py; \
	rc=$$?; bash tools/slurm_cluster.sh stop $(SLURM_DIR); exit $$rc

# Regenerate the rendered math pages from the scripts' `# LaTeX:` comments, then build the site.
docs: $(VENV)/.installed
	$(PY) tools/render_math_docs.py
	$(PY) -m mkdocs build --strict
