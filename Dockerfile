# The hamid image: the node daemon (`hamid` on PATH) and the in-container shim
# (/usr/lib/hamid/libvgpu.so, the daemon's default shimLibrary) in one image,
# the one the Helm chart's DaemonSet runs with `command: ["hamid"]`.
#
#   docker build -t hamid:0.1.0 .
#
# Two stages on one base: `build` compiles the shim (gcc and make only, see
# shim/Makefile) and installs the package with its dependencies into a venv at
# /opt/hamid, with the Docker runtime hamid-runtime and hamid-runtime-admit (C,
# built by the Makefile's rules) beside hamid-runtime-py;
# the final stage gets that venv and the shim, nothing else.
#
# Build arguments:
#   BASE      the base image of both stages (default below: Debian 12 with
#             Python 3.11). Another base needs python3 with its venv module;
#             a base without gcc, make and libc6-dev gets them from apt-get in
#             the build stage, one that has them needs no Debian mirror.
#   VERSION   the image's org.opencontainers.image.version label; keep it the
#             version in pyproject.toml (tests/image checks the default).
#   REVISION, CREATED   the commit and the RFC 3339 build time, for the
#             hamid-build.json that `hamid version` and hami_build_info read and
#             the org.opencontainers.image.revision and .created labels.
#   PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_TRUSTED_HOST, PIP_NO_INDEX
#             passed to pip as its own environment variables (a mirror, or
#             none at all).
#
# Offline (no package index reachable from inside the build): put wheels of
# hamid's dependencies, and of setuptools and wheel to build hamid itself, in
# .whl/ at the root of the build context (git ignores it), made on Linux of the
# image's architecture with the base's Python version (3.11), and turn the
# index off. .whl/ is searched whenever it exists:
#
#   python3 -m pip wheel --wheel-dir .whl . setuptools wheel
#   docker build --build-arg PIP_NO_INDEX=1 -t hamid:0.1.0 .
#
# Only Dockerfile syntax the legacy builder knows (no RUN --mount, no named
# build contexts), so `DOCKER_BUILDKIT=0 docker build` with Debian's docker.io
# and BuildKit build it alike.

ARG BASE=python:3.11-slim-bookworm

FROM ${BASE} AS build
ARG PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST PIP_NO_INDEX REVISION CREATED
RUN if ! command -v gcc >/dev/null || ! command -v make >/dev/null || [ ! -e /usr/include/stdio.h ]; then \
        apt-get update && apt-get install -y --no-install-recommends gcc make libc6-dev \
        && rm -rf /var/lib/apt/lists/*; \
    fi
COPY . /src
# The shim, as the versioned file the daemon's installer expects
# (libvgpu.so.<version>) with the libvgpu.so link to it; then the package and
# its dependencies in a venv at /opt/hamid. Both land under /out, which the
# final stage copies onto its / in one step.
RUN set -eu; \
    export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_ROOT_USER_ACTION=ignore; \
    if [ -d /src/.whl ]; then export PIP_FIND_LINKS=/src/.whl; fi; \
    make -C /src/shim; \
    v="$(cat /src/shim/VERSION)"; \
    install -d -m 0755 /out/usr/lib/hamid /out/opt; \
    install -m 0644 "/src/shim/build/libvgpu.so.$v" /out/usr/lib/hamid/; \
    ln -s "libvgpu.so.$v" /out/usr/lib/hamid/libvgpu.so; \
    python3 -m venv /opt/hamid; \
    /opt/hamid/bin/pip install /src; \
    make -C /src CC=cc RUNTIME=/opt/hamid/bin/hamid-runtime ADMIT=/opt/hamid/bin/hamid-runtime-admit STAMP= \
        /opt/hamid/bin/hamid-runtime /opt/hamid/bin/hamid-runtime-admit; \
    printf '{"shim_version": "%s", "revision": "%s", "build_date": "%s"}\n' "$v" "${REVISION:-unknown}" \
        "${CREATED:-$(date -u +%Y-%m-%dT%H:%M:%SZ)}" > /opt/hamid/hamid-build.json; \
    /opt/hamid/bin/hamid version; \
    mv /opt/hamid /out/opt/hamid

FROM ${BASE}
ARG VERSION=0.1.0 REVISION= CREATED=
LABEL org.opencontainers.image.title="hamid" \
      org.opencontainers.image.description="hamid: GPU sharing without a central scheduler (daemon and shim)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}"
ENV PATH=/opt/hamid/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1
# No USER: the daemon runs as root on purpose. It is a node daemon: it drives
# the GPUs through NVML and their device nodes under /dev (MIG instances made
# and destroyed), serves the device-plugin socket in kubelet's root-owned
# /var/lib/kubelet/device-plugins and reads pod-resources, and writes the
# shim, the limits files and its ledger under /var/lib/hamid owned by root
# (the shim refuses a limits file that root does not own).
CMD ["hamid", "run"]
# Last, so that the metadata steps above stay cheap (each is a commit).
COPY --from=build /out/ /
