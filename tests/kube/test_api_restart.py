"""A restarted API server answers 403 for about a second before its RBAC caches sync: the
daemon's informers and its leader elector, running under a service account as in the chart,
must take that as passing (retry), never as final."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "standins"))

from hamid.kube.client import api_client  # noqa: E402
from hamid.kube.election import LeaderElector  # noqa: E402
from hamid.kube.informer import Informer  # noqa: E402

RBAC = "rbac.authorization.k8s.io"


@pytest.fixture
def secure_api():
    from apiserver import ApiServer

    with ApiServer(tls=True, authorize=True, bookmark_interval=0.2) as api:
        yield api


def _service_account(api, tmp_path) -> str:
    """A kubeconfig for kube-system/hamid allowed what the daemon's informers and elector use."""
    api.create({"apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": "hamid", "namespace": "kube-system"}})
    api.create({"apiVersion": f"{RBAC}/v1", "kind": "ClusterRole", "metadata": {"name": "hamid"}, "rules": [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}]})
    api.create({"apiVersion": f"{RBAC}/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "hamid"},
                "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": "hamid"},
                "subjects": [{"kind": "ServiceAccount", "name": "hamid", "namespace": "kube-system"}]})
    return api.write_kubeconfig(tmp_path / "sa", token=api.issue_token("kube-system", "hamid"))


def _pod(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "x"}]}}


async def test_informers_and_the_leader_ride_out_the_403s_after_an_api_server_restart(secure_api, tmp_path):
    kubeconfig = _service_account(secure_api, tmp_path)
    secure_api.create(_pod("before"))
    pods = Informer(api_client(kubeconfig), "/api/v1/pods", name="pods")
    leader = LeaderElector(api_client(kubeconfig), identity="node-a", namespace="kube-system", lease_duration=30,
                           renew_deadline=20, retry_period=0.5)
    async with trio.open_nursery() as n:
        await n.start(pods.run)
        await n.start(leader.run)
        with trio.fail_after(20):
            await pods.synced.wait()
            await leader.wait_leading()
        assert pods.get("default/before") is not None
        since = len(secure_api.audit)

        def denied(resource: str) -> bool:
            return any(not a["allowed"] and a.get("resource") == resource for a in secure_api.audit[since:])

        # RBAC answers 403 from the restart until both clients have met it (the informer's relist, the
        # leader's renewal), however long a busy machine takes them to try again, then syncs
        await trio.to_thread.run_sync(secure_api.restart, 60.0)
        with trio.fail_after(15):  # under the leader's 20 s renew deadline
            while not (denied("pods") and denied("leases")):
                await trio.sleep(0.05)
        secure_api.rbac_synced()
        secure_api.create(_pod("after"))
        # both ride the 403s out: the informer follows the pods again, the leader still leads in its first term
        with trio.fail_after(30):
            while pods.get("default/after") is None:
                await trio.sleep(0.05)
        assert leader.is_leader and leader.terms == 1  # seconds of 403s are well within the renew deadline
        n.cancel_scope.cancel()
