# hamid: the two commands a newcomer needs are `make run` and `make test`.
# Everything else here is what those two depend on.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test test-fast lint venv shim clean proto install uninstall

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

RUNTIME := $(VENV)/bin/hamid-runtime
ADMIT   := $(VENV)/bin/hamid-runtime-admit

# The OCI runtime Docker calls, C, beside hamid-runtime-py: hamid-runtime, the
# front door Docker runs for every verb, with no C library (it starts in ~0.05 ms
# instead of ~0.5: see its header), and hamid-runtime-admit, to which it hands
# create, run and the poststop hook.
FRONT_CFLAGS := -O2 -Wall -Wextra -Werror -static -nostdlib -ffreestanding -fno-builtin \
	-fno-stack-protector -fno-asynchronous-unwind-tables -fno-tree-loop-distribute-patterns -fno-pie -no-pie
ADMIT_CFLAGS := -O2 -Wall -Wextra -Werror

$(RUNTIME): contrib/docker/hamid-runtime.c $(STAMP)
	$(CC) $(FRONT_CFLAGS) -o $@ $<

$(ADMIT): contrib/docker/hamid-runtime-admit.c $(STAMP)
	$(CC) $(ADMIT_CFLAGS) -o $@ $<

venv: $(STAMP) $(RUNTIME) $(ADMIT)

# The shim is built when its sources exist; the daemon installs it on start.
shim:
	@if [ -f shim/Makefile ]; then $(MAKE) -C shim; fi

run: venv shim
	$(VENV)/bin/hamid run $(RUN_ARGS)

# The whole suite, what CI runs: the unit tier on every core (pytest-xdist), then the integration
# tier (real daemons, dockerd, the stand-ins: they mostly wait on each other) on two, under a short
# base directory (unix socket paths are at most 107 bytes). No test bounds wall-clock time (the
# shim's rates are measured on the stand-in driver's virtual clock, speed is bench/'s), so a busy
# machine makes the suite slower, never red. A tier that PYTEST_ARGS leaves empty is not a failure
# (pytest's exit code 5).
# One base directory per checkout: pytest empties its basetemp at start, so two checkouts testing at once (CI
# beside a developer's run) must not share one; short, since the chart test's socket paths come near the 107-byte limit.
SLOW_TMP ?= /tmp/hs-$(shell printf %s "$(CURDIR)" | cksum | cut -d' ' -f1)
test: venv shim lint
	$(PY) tests/prepare_host.py
	$(PY) -m pytest -q -p no:cacheprovider -m "not slow and not docker" -n auto $(PYTEST_ARGS) || [ $$? -eq 5 ]
	$(PY) -m pytest -q -p no:cacheprovider -m "slow or docker" -n 2 --basetemp=$(SLOW_TMP) $(PYTEST_ARGS) || [ $$? -eq 5 ]

# The fast tier for a developer's loop: everything not marked slow or docker, on every core
# (pytest-xdist). `make test` stays the whole suite, and what CI runs.
test-fast: venv shim lint
	$(PY) -m pytest -q -p no:cacheprovider -m "not slow and not docker" -n auto $(PYTEST_ARGS) || [ $$? -eq 5 ]

# The linters, configured in pyproject.toml (what they check is said there): ruff on every Python
# file, mypy on hamid/. `make test` and `make test-fast` run them first.
lint: venv
	$(VENV)/bin/ruff check -q .
	$(VENV)/bin/mypy

# The kubelet APIs' Python modules, generated from hamid/kubelet/api/*.proto
# with the grpcio-tools pinned in the test extra (tests/k8s/test_protos.py
# checks the committed ones are current). Run from the repository root so the
# generated imports read `from hamid.kubelet.api import ...`.
PROTOS    := hamid/kubelet/api/deviceplugin.proto hamid/kubelet/api/podresources.proto \
             hamid/dra/api/dra.proto hamid/dra/api/pluginregistration.proto hamid/dra/api/drahealth.proto
PROTO_OUT ?= .

proto:
	$(PY) -m grpc_tools.protoc -I . --python_out=$(PROTO_OUT) --pyi_out=$(PROTO_OUT) --grpc_python_out=$(PROTO_OUT) $(PROTOS)

clean:
	rm -rf $(VENV) shim/build build

# A standalone install for a Docker host (no checkout needed afterwards):
# a venv of its own at $(PREFIX)/lib/hamid holding hamid, the runtime
# hamid-runtime and hamid-runtime-admit (C) and hamid-runtime-py side by side (the
# runtime finds the other two beside its real path, so links work), the
# shim at $(PREFIX)/lib/hamid/shim/libvgpu.so (where the daemon looks when no
# shimLibrary is set), hamid-build.json (the commit, build time and shim
# version `hamid version` and hami_build_info show), and two links in
# $(PREFIX)/bin: hamid and hamid-runtime, the path contrib/docker/daemon.json
# names. Run it as root for the default PREFIX; `make uninstall` removes
# exactly these. DESTDIR (packaging) puts it all under $(DESTDIR)$(PREFIX),
# made to work once moved to $(PREFIX): the venv's scripts are rewritten to
# name $(PREFIX)/lib/hamid, the links point there, and no .pyc is compiled
# (they would record the staging path; root writes them at first use).
PREFIX  ?= /usr/local
DESTDIR ?=
HOMEDIR := $(PREFIX)/lib/hamid
DEST    := $(DESTDIR)$(HOMEDIR)
SHIMV    = $(shell cat shim/VERSION)

install: shim
	$(PYTHON) -m venv $(DEST)
	$(DEST)/bin/python -m pip uninstall -q -y hamid >/dev/null 2>&1 || true
	$(DEST)/bin/python -m pip install -q $(if $(DESTDIR),--no-compile) .
	$(CC) $(FRONT_CFLAGS) -o $(DEST)/bin/hamid-runtime contrib/docker/hamid-runtime.c
	$(CC) $(ADMIT_CFLAGS) -o $(DEST)/bin/hamid-runtime-admit contrib/docker/hamid-runtime-admit.c
	install -d -m 0755 $(DEST)/shim $(DESTDIR)$(PREFIX)/bin
	install -m 0644 shim/build/libvgpu.so.$(SHIMV) $(DEST)/shim/
	ln -sfn libvgpu.so.$(SHIMV) $(DEST)/shim/libvgpu.so
	printf '{"shim_version": "%s", "revision": "%s", "build_date": "%s"}\n' "$(SHIMV)" \
		"$$(git rev-parse HEAD 2>/dev/null || echo unknown)" "$$(date -u +%Y-%m-%dT%H:%M:%SZ)" > $(DEST)/hamid-build.json
	if [ -n "$(DESTDIR)" ]; then \
		grep -rlIZ -F "$(DEST)" $(DEST)/bin $(DEST)/pyvenv.cfg | xargs -0 -r sed -i "s|$(DEST)|$(HOMEDIR)|g"; fi
	ln -sfn $(HOMEDIR)/bin/hamid $(DESTDIR)$(PREFIX)/bin/hamid
	ln -sfn $(HOMEDIR)/bin/hamid-runtime $(DESTDIR)$(PREFIX)/bin/hamid-runtime
	$(DEST)/bin/python -m hamid.cli.main version

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/hamid $(DESTDIR)$(PREFIX)/bin/hamid-runtime
	rm -rf $(DEST)
