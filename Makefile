# Two commands: `make train` and `make test`. Both create .venv from requirements.txt
# when it is missing or older than requirements.txt.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The flagship script once it exists, else the first algorithm.
TRAIN_SCRIPT := $(if $(wildcard vmpo_continuous.py),vmpo_continuous.py,ppo_discrete.py)

.PHONY: train test docs

$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -r requirements.txt
	touch $@

train: $(VENV)/.installed
	$(PY) $(TRAIN_SCRIPT)

# The video tests render MuJoCo headless; training itself needs no GL library.
GL_CHECK := import vmpo_continuous as s, sys; sys.exit(not any(s.library_loads(libs) for _, libs in s.GL_BACKENDS))

test: $(VENV)/.installed
	@$(PY) -c "$(GL_CHECK)" || { echo "make test: the video tests need Mesa's EGL or OSMesa; install one (Debian/Ubuntu: apt-get install libegl1 libegl-mesa0, or libosmesa6)"; exit 1; }
	$(PY) -m ruff format --check .
	$(PY) -m ruff check .
	$(PY) -m pytest

# Regenerate the rendered math pages from the scripts' `# LaTeX:` comments, then build the site.
docs: $(VENV)/.installed
	$(PY) tools/render_math_docs.py
	$(PY) -m mkdocs build --strict
