# hamid: the two commands a newcomer needs are `make run` and `make test`.
# Everything else here is what those two depend on.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test test-fast venv shim clean proto

$(STAMP): pyproject.toml contrib/docker/hamid-runtime
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

CLIENT := $(VENV)/bin/hamid-runtime-client

# The runtime's create path without Python (see its header); beside the launcher.
$(CLIENT): contrib/docker/hamid-runtime-client.c $(STAMP)
	$(CC) -O2 -Wall -Wextra -Werror -o $@ $<

venv: $(STAMP) $(CLIENT)

# The shim is built when its sources exist; the daemon installs it on start.
shim:
	@if [ -f shim/Makefile ]; then $(MAKE) -C shim; fi

run: venv shim
	$(VENV)/bin/hamid run $(RUN_ARGS)

test: venv shim
	$(PY) tests/prepare_host.py
	$(PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

# The fast tier for a developer's loop: everything not marked slow or docker, on every core
# (pytest-xdist). Under 90 s on 2 cores. `make test` stays the whole suite, and what CI runs.
test-fast: venv shim
	$(PY) -m pytest -q -p no:cacheprovider -m "not slow and not docker" -n auto $(PYTEST_ARGS)

# The kubelet APIs' Python modules, generated from hamid/kubelet/api/*.proto
# with the grpcio-tools pinned in the test extra (tests/k8s/test_protos.py
# checks the committed ones are current). Run from the repository root so the
# generated imports read `from hamid.kubelet.api import ...`.
PROTOS    := hamid/kubelet/api/deviceplugin.proto hamid/kubelet/api/podresources.proto
PROTO_OUT ?= .

proto:
	$(PY) -m grpc_tools.protoc -I . --python_out=$(PROTO_OUT) --pyi_out=$(PROTO_OUT) --grpc_python_out=$(PROTO_OUT) $(PROTOS)

clean:
	rm -rf $(VENV) shim/build
