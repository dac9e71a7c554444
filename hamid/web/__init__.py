"""The web view: the cluster's GPUs in a browser, served by every daemon.

A face like the others (:mod:`hamid.web.face`): it reads the node service
(this node's tenants and their live use) and the gossiped cluster view (every
node's GPUs), never another face. :mod:`.snapshot` turns those into the one
JSON document the page draws, :mod:`.tenants` reads this node's tenants and
their shim regions, :mod:`.whatif` answers the what-if box with ``hamid
plan``'s engine, :mod:`.guard` holds the listener's rules (token, connection
cap, deadlines, body limit). The page itself (``static/``) is plain HTML, CSS
and JavaScript with no external asset.
"""
