"""metrics: Prometheus exposition with HAMi's ``hami_*`` names.

:mod:`.exporter` holds the collectors (read from the ledger at scrape time,
so the numbers cannot drift from the record) and the ASGI app the daemon
serves on the metrics port. Other parts contribute collectors by registering
them on the registry the daemon hands them.
"""
