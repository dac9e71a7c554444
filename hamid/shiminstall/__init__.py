"""hamid.shiminstall: puts the shim on the host as an immutable, versioned file.

Owns install_shim(): copying libvgpu.so.<version> into the host directory
that containers mount, atomically (temporary name, fsync, link into place,
fsync the directory), never rewriting a file that exists, so a restart or an
upgrade never touches a library a running process has mapped. Must not
delete installed versions (running containers may still use them).
"""

from hamid.shiminstall.installer import ShimInstallError, install_shim, shim_version_of

__all__ = ["ShimInstallError", "install_shim", "shim_version_of"]
