# hamid: the two commands a newcomer needs are `make run` and `make test`.
# Everything else here is what those two depend on.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test venv shim clean

$(STAMP): pyproject.toml contrib/docker/hamid-runtime
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

# The shim is built when its sources exist; the daemon installs it on start.
shim:
	@if [ -f shim/Makefile ]; then $(MAKE) -C shim; fi

run: venv shim
	$(VENV)/bin/hamid run $(RUN_ARGS)

test: venv shim
	$(PY) tests/prepare_host.py
	$(PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) shim/build
