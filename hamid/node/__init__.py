"""node: the node's authority, the one thing every face is a door into.

- :mod:`.identity`: who owns a reservation (a pod's UID, a container's id).
- :mod:`.core`: admit, commit, release, reconcile, as blocking calls
  (:class:`~.core.NodeCore`), shared by the daemon and the Docker runtime.
- :mod:`.service`: the same for trio code, with change notifications
  (:class:`~.service.NodeService`).
- :mod:`.realize`: a reservation -> a container's edits (pure).
- :mod:`.edits`: those edits, in the shape of CDI's ``containerEdits``.
- :mod:`.mig`: MIG instances made inside admission, destroyed inside release.
- :mod:`.facts`, :mod:`.devnodes`, :mod:`.capacity`: what the node is.
- :mod:`.layout`, :mod:`.released`: the state directory.
- :mod:`.face`: what a face is.

Nothing here imports a face.
"""
