"""The scheduling face: what makes GPU pods land on a node with no scheduler pod.

On the leader, the gate controller (``gates``) places gated pods; on every
daemon, kube-scheduler's extender (``extender``); both choose on the cluster
view (``placer``, ``ranking``, ``verdicts``) within namespace GPU quotas
(``quota``), judge nodes as kube-scheduler would (``kubefit``), and commit
through the peer API (``commit``, ``batches``), where the chosen node's ledger
re-checks every commit. The placement engine itself is ``hamid.placement``;
the Lease election is ``hamid.kube.election``; the webhook is ``hamid.webhook``.
"""
