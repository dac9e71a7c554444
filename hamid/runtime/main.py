"""``hamid-runtime``: the OCI runtime wrapper for Docker (see the Docker issue)."""

import sys


def main() -> int:
    print("hamid-runtime: not implemented yet", file=sys.stderr)
    return 2
