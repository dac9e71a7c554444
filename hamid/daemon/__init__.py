"""daemon: the ``hamid run`` process that puts the parts together.

:mod:`.inventory` turns device readings and node settings into the
capacities the ledger records (shared with the runtime hook, which must do
the same when no daemon runs); :mod:`.service` runs the parts as tasks in
one trio nursery and handles shutdown.
"""
