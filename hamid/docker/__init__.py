"""docker: the Docker face of the daemon.

The runtime (``hamid-runtime``, :mod:`hamid.runtime`) admits containers
through the local API; what the daemon itself does for Docker lives here:
draining the poststop hooks' release markers as they appear
(:mod:`.face`), and telling whether a container still exists
(:mod:`.liveness`) so the reconciler can release what runc forgot.
"""
