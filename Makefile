# The two commands of the README: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test test-fast demo bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q -m "not integration"
	$(PY) -m pytest -q -m integration

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not integration"

demo: $(STAMP)
	$(PY) -m jobs.demo

clean:
	rm -rf $(VENV) build *.egg-info
