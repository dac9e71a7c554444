"""Install the host tools the test suite needs (``make test`` runs this first).

The suite uses real parts: a C compiler for the shim and its fake driver
libraries, and later dockerd, runc and busybox for the runtime tests. On a
fresh machine, as root, the missing Debian packages are installed with apt-get;
without root the missing tools are reported and the tests that need them skip
with that reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

# command on PATH -> Debian package that provides it
NEEDED = {
    "gcc": "gcc",
    "make": "make",
    "nm": "binutils",  # the shim tests check its exported symbols (nm, readelf)
    "readelf": "binutils",
    "dockerd": "docker.io",  # the runtime tests drive a real Docker engine...
    "containerd": "containerd",
    "runc": "runc",  # ...and runc
    "busybox": "busybox-static",  # the test image's rootfs (docker import)
    "tar": "tar",
    "ip": "iproute2",  # gossip partition tests: network namespaces and veth pairs
    "iptables": "iptables",  # packet loss inside a namespace
    "kubectl": "kubernetes-client",  # kubectl 1.20 against the API-server stand-in (tests/k8s)
    "debootstrap": "debootstrap",  # the image test's base image (tests/image)
    "chromium": "chromium",  # the web view's browser tests (tests/web), driven by Playwright
    "npm": "npm",  # axe-core, the web view's accessibility check (tests/web), from the npm registry
}


def main() -> int:
    missing = sorted({pkg for cmd, pkg in NEEDED.items() if shutil.which(cmd) is None})
    if not missing:
        return 0
    if os.geteuid() != 0:
        print(f"prepare_host: missing {', '.join(missing)} and not root; tests needing them will skip")
        return 0
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing], check=True, env=env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
