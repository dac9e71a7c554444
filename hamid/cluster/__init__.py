"""The cluster as data, shared by the faces and the CLI: the capacity document
each node gossips (:mod:`.capacity`), the reports built from the gossiped view
(:mod:`.report`), and the what-if planner over nodes (:mod:`.plan`, behind
``hamid plan`` and the web view's what-if box). Pure functions; no I/O beyond
reading the files ``hamid plan`` is given."""
