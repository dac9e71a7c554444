"""hamid: GPU sharing without a central scheduler.

The package is split by the parts named in docs/design.md: ``devices``, ``ledger``,
``placement``, ``request``, ``config``, ``localapi``, ``metrics``,
``shiminstall``, ``kubelet``, ``gossip``, ``control``, ``runtime`` and the
``cli``. Each folder owns one part; none reaches into another's internals.
"""

__version__ = "0.1.0"
