"""Entry point of the ``hamid`` command."""

def main() -> int:
    return 0
