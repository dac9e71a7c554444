"""The chart's DRA pieces (issue 41): off by default; on, kubelet's plugin directories mounted,
least-privilege access to ResourceSlices and ResourceClaims, and the DeviceClasses (one serving
``nvidia.com/gpu`` when asked); ``config.draDevices`` without ``dra.enabled`` refused."""

from __future__ import annotations

import pytest

from test_chart import by_kind, helm, one, render

ON = {"dra": {"enabled": True, "extendedResourceName": "gpu.hamid.io/gpu"}, "config": {"draDevices": "all"}}


def _rules(docs):
    return one(docs, "ClusterRole")["rules"]


def test_dra_is_off_by_default():
    docs = render()
    assert by_kind(docs, "DeviceClass") == []
    assert not [r for r in _rules(docs) if "resource.k8s.io" in r.get("apiGroups", [])]
    mounts = one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    assert not [m for m in mounts if "/plugins" in m["mountPath"]]


def test_dra_on_mounts_kubelets_plugin_dirs_grants_least_privilege_and_installs_the_classes():
    docs = render(ON)
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert {"/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins/gpu.hamid.io"} <= mounts
    dra_rules = {tuple(r["resources"]): sorted(r["verbs"]) for r in _rules(docs)
                 if r.get("apiGroups") == ["resource.k8s.io"]}
    assert dra_rules == {("resourceslices",): ["create", "delete", "list", "update"],
                         ("resourceclaims",): ["get"]}
    classes = {c["metadata"]["name"]: c["spec"] for c in by_kind(docs, "DeviceClass")}
    assert set(classes) == {"gpu.hamid.io", "mig.gpu.hamid.io"}
    assert classes["gpu.hamid.io"]["extendedResourceName"] == "gpu.hamid.io/gpu"
    assert "extendedResourceName" not in classes["mig.gpu.hamid.io"]


def test_dra_devices_without_dra_enabled_is_refused():
    with pytest.raises(helm.HelmError, match="config.draDevices is set but dra.enabled is false"):
        render({"config": {"nodeconfig": [{"name": "n1", "draDevices": "0"}]}})


def test_the_device_plugins_own_name_through_dra_only_without_hamids_webhook():
    """nvidia.com/gpu pods are placed by hamid's webhook for the device plugin (gate, extender): the
    class may carry that name only in mode none, where kube-scheduler sends them to DRA-only nodes."""
    nv = {"dra": {"enabled": True, "extendedResourceName": "nvidia.com/gpu"}, "config": {"draDevices": "all"}}
    with pytest.raises(helm.HelmError, match="is the device plugin's resourceCountName"):
        render(nv)
    docs = render({**nv, "mode": "none"})
    assert one(docs, "DeviceClass", "gpu.hamid.io")["spec"]["extendedResourceName"] == "nvidia.com/gpu"
