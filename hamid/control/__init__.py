"""The control face: what makes GPU pods land on a node with no scheduler pod.

Leader election over a Lease (``leader``), gossip seeds from the API
(``seeds``), the webhook, the gate controller and the extender; the placement
itself is ``hamid.placement`` and every commit is re-checked by the chosen
node's ledger through the peer API.
"""
