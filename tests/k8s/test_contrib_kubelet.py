"""contrib/kubelet/: what a self-managed control plane adds to kube-scheduler for extender mode.

Owns the checks of those files against what reads them: the
KubeSchedulerConfiguration (all three copies) loads in the kube-scheduler
stand-in, which validates extenders, client connection and leader election as
kube-scheduler does; the kubeadm static pod manifest is a valid Pod for every
Kubernetes version from 1.29 to the newest the schemas know (strict: no unknown
field) and mounts the file at the path its ``--config`` names; the kubeadm
ClusterConfiguration, k3s and RKE2 settings name that same path, the one the
README installs the file at; the README stands alone and its reachability
check answers what it says against a real daemon in extender mode. The end to
end use of the file (a pod placed, bound and started through it) is
tests/k8s/test_placement_cluster.py's extender-mode test, which reads it.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from pathlib import Path

import httpx
import pytest
import yaml

from scheduler import SchedulerStandIn, parse_config

ROOT = Path(__file__).resolve().parents[2]
CONTRIB = ROOT / "contrib" / "kubelet"
README = CONTRIB / "README.md"
RESOURCES = ["nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores",
             "nvidia.com/priority"]
# distribution -> (its scheduler-config.yaml, the scheduler's kubeconfig there, where the README installs the file)
DISTROS = {
    "kubeadm": (CONTRIB / "scheduler-config.yaml", "/etc/kubernetes/scheduler.conf",
                "/etc/kubernetes/hamid/scheduler-config.yaml"),
    "k3s": (CONTRIB / "k3s" / "scheduler-config.yaml", "/var/lib/rancher/k3s/server/cred/scheduler.kubeconfig",
            "/etc/rancher/k3s/hamid/scheduler-config.yaml"),
    "rke2": (CONTRIB / "rke2" / "scheduler-config.yaml", "/var/lib/rancher/rke2/server/cred/scheduler.kubeconfig",
             "/etc/rancher/rke2/hamid/scheduler-config.yaml"),
}


def load(path: Path):
    return yaml.safe_load(path.read_text())


def readme_install_path(source: str) -> str:
    """Where the README's ``install`` command puts ``source`` (a path under contrib/kubelet/)."""
    for line in README.read_text().splitlines():
        words = shlex.split(line.strip()) if line.strip().startswith("install ") else []
        if source in words:
            return words[-1]
    raise AssertionError(f"the README installs {source} nowhere")


# --- the KubeSchedulerConfiguration -----------------------------------------------------------


@pytest.mark.parametrize("distro", sorted(DISTROS))
def test_the_scheduler_configuration_loads_in_the_kube_scheduler_stand_in(api_server, distro):
    path, kubeconfig, _ = DISTROS[distro]
    config = load(path)
    assert (config["apiVersion"], config["kind"]) == ("kubescheduler.config.k8s.io/v1", "KubeSchedulerConfiguration")
    assert config["clientConnection"] == {"kubeconfig": kubeconfig}
    assert config["leaderElection"]["leaderElect"] is True
    sched = SchedulerStandIn(api_server, config=config)  # parses and validates; not started
    (ext,) = sched.extenders
    assert ext.url_prefix == "https://127.0.0.1:31999"  # the chart's NodePort, from the hostNetwork scheduler
    # kube-scheduler's client certificate, beside the configuration where the README installs them
    tls_dir = posixpath.dirname(DISTROS[distro][2])
    assert ext.tls == {"certFile": f"{tls_dir}/extender-client.crt", "keyFile": f"{tls_dir}/extender-client.key",
                       "caFile": f"{tls_dir}/extender-ca.crt", "serverName": "hamid-webhook.kube-system.svc"}
    assert (ext.filter_verb, ext.prioritize_verb, ext.bind_verb) == ("filter", "prioritize", "bind")
    assert ext.node_cache_capable and not ext.ignorable
    assert ext.weight == 10 and ext.http_timeout == 10.0
    assert ext.managed == {r: False for r in RESOURCES}  # kube-scheduler checks them too: the nodes advertise them
    assert sched.scheduler_names == ["default-scheduler"]
    assert sched.ignored == set()


def test_the_three_copies_differ_only_in_the_kubeconfig():
    def same_dir(config: dict, distro: str) -> dict:  # the TLS files' directory is each distribution's own
        text = yaml.safe_dump(config).replace(posixpath.dirname(DISTROS[distro][2]), "TLSDIR")
        return yaml.safe_load(text)

    main = same_dir(load(DISTROS["kubeadm"][0]), "kubeadm")
    for distro in ("k3s", "rke2"):
        other = same_dir(load(DISTROS[distro][0]), distro)
        assert {k: v for k, v in other.items() if k != "clientConnection"} == \
            {k: v for k, v in main.items() if k != "clientConnection"}, distro


def test_the_stand_in_refuses_what_kube_scheduler_refuses_in_these_sections():
    """The stand-in's checks of clientConnection and leaderElection, which the files above pass."""
    base = load(DISTROS["kubeadm"][0])
    for bad, match in (
        ({"leaderElection": {**base["leaderElection"], "renewDeadline": "15s"}},
         "LeaseDuration must be greater than RenewDeadline"),
        ({"leaderElection": {**base["leaderElection"], "retryPeriod": "0s"}}, "retryPeriod: must be greater than zero"),
        ({"leaderElection": {**base["leaderElection"], "resourceLock": "endpoints"}}, "accepted: leases"),
        ({"leaderElection": {**base["leaderElection"], "leaderElection": True}}, "unknown keys"),
        ({"clientConnection": {"kubeConfig": "/x"}}, r"unknown keys \['kubeConfig'\]"),
    ):
        with pytest.raises(ValueError, match=match):
            parse_config({**base, **bad})


# --- kubeadm ----------------------------------------------------------------------------------


def _versions() -> list[str]:
    from kubernetes_validate import latest_version
    from kubernetes_validate.utils import Version, all_versions

    got = sorted({v for v in all_versions() if Version(v) >= Version("1.29.0")}, key=Version)
    assert latest_version() in got and "1.29.0" in got, got
    return got


def _config_flag(command: list[str]) -> str:
    (flag,) = [a for a in command if a.startswith("--config=")]
    return flag.split("=", 1)[1]


def test_the_static_pod_manifest_is_a_valid_pod_that_mounts_the_config_where_the_flag_names_it():
    import kubernetes_validate

    doc = load(CONTRIB / "kubeadm" / "kube-scheduler.yaml")
    for version in _versions():
        kubernetes_validate.validate(doc, version, strict=True)
    spec = doc["spec"]
    assert spec["hostNetwork"] is True  # so that 127.0.0.1:31999 is this node's NodePort
    (c,) = spec["containers"]
    config_path = _config_flag(c["command"])
    assert config_path == DISTROS["kubeadm"][2] == readme_install_path("contrib/kubelet/scheduler-config.yaml")
    volumes = {v["name"]: v for v in spec["volumes"]}

    def host_file(path: str) -> str:
        """The host path the container's ``path`` comes from, through its mounts (the longest one that holds it)."""
        best = None
        for m in c["volumeMounts"]:
            mp = m["mountPath"].rstrip("/")
            if path == mp or path.startswith(mp + "/"):
                if best is None or len(mp) > len(best["mountPath"].rstrip("/")):
                    best = m
        assert best is not None, f"nothing mounted at {path}"
        assert best.get("readOnly") is True, best
        host = volumes[best["name"]]["hostPath"]["path"]
        return posixpath.normpath(posixpath.join(host, posixpath.relpath(path, best["mountPath"])))

    assert host_file(config_path) == DISTROS["kubeadm"][2]  # the same path on the host, where the README puts it
    kubeconfig = load(DISTROS["kubeadm"][0])["clientConnection"]["kubeconfig"]
    assert host_file(kubeconfig) == kubeconfig == "/etc/kubernetes/scheduler.conf"
    hamid_volume = volumes["hamid-scheduler-config"]["hostPath"]
    assert hamid_volume == {"path": posixpath.dirname(config_path), "type": "Directory"}


def _extra_volume_holds(volumes: list[dict], path: str) -> None:
    (v,) = [v for v in volumes if path.startswith(v["mountPath"].rstrip("/") + "/")]
    assert v["hostPath"] == v["mountPath"] == posixpath.dirname(path), v
    assert v["readOnly"] is True and v["pathType"] == "Directory", v


def test_the_kubeadm_cluster_configuration_names_the_same_path_in_both_api_versions():
    path = CONTRIB / "kubeadm" / "cluster-configuration.yaml"
    want = DISTROS["kubeadm"][2]
    v4 = load(path)
    assert (v4["apiVersion"], v4["kind"]) == ("kubeadm.k8s.io/v1beta4", "ClusterConfiguration")
    assert v4["scheduler"]["extraArgs"] == [{"name": "config", "value": want}]
    _extra_volume_holds(v4["scheduler"]["extraVolumes"], want)
    # the v1beta3 form (kubeadm 1.29, 1.30), given in the comments
    commented = "\n".join(line[4:] for line in path.read_text().splitlines() if line.startswith("#   "))
    v3 = yaml.safe_load(commented)
    assert (v3["apiVersion"], v3["kind"]) == ("kubeadm.k8s.io/v1beta3", "ClusterConfiguration")
    assert v3["scheduler"]["extraArgs"] == {"config": want}
    _extra_volume_holds(v3["scheduler"]["extraVolumes"], want)


# --- k3s and RKE2 -----------------------------------------------------------------------------


@pytest.mark.parametrize("distro", ["k3s", "rke2"])
def test_the_k3s_and_rke2_settings_name_the_path_the_readme_installs_the_file_at(distro):
    settings = load(CONTRIB / distro / "config.yaml")
    want = DISTROS[distro][2]
    assert settings["kube-scheduler-arg"] == [f"config={want}"]
    assert readme_install_path(f"contrib/kubelet/{distro}/scheduler-config.yaml") == want
    # the settings file itself, installed as a drop-in, is named as such in the README
    assert readme_install_path(f"contrib/kubelet/{distro}/config.yaml") == \
        f"/etc/rancher/{distro}/config.yaml.d/hamid.yaml"
    if distro == "rke2":  # a static pod: the host directory mounted at the same path
        (mount,) = settings["kube-scheduler-extra-mount"]
        host, ctr = mount.split(":")
        assert host == ctr == posixpath.dirname(want)
    else:  # inside the k3s process: no mount
        assert set(settings) == {"kube-scheduler-arg"}


# --- the README -------------------------------------------------------------------------------


def test_the_readme_stands_alone():
    text = README.read_text()
    assert "gate mode" in text and "EKS, GKE and AKS" in text
    for target in re.findall(r"\]\(([^)]+)\)", text):  # markdown links: inside the repository only
        assert not re.match(r"[a-z]+://", target), target
        assert (README.parent / target).exists(), target
    for url in re.findall(r"https?://[^\s`'\"]+", text):  # addresses: the cluster's own, never a website
        assert re.match(r"https?://(127\.0\.0\.1|<|hamid-webhook\.kube-system\.svc:)", url), url
    for rel in set(re.findall(r"(?<![\w/.])((?:contrib|charts)/[\w./-]*\w)", text)):  # paths it names exist
        assert (ROOT / rel).exists(), rel
    for name in ("scheduler-config.yaml", "kubeadm/kube-scheduler.yaml", "kubeadm/cluster-configuration.yaml",
                 "k3s/config.yaml", "rke2/config.yaml"):
        assert f"`{name}`" in text or f"contrib/kubelet/{name}" in text, name


def test_the_readmes_reachability_check_answers_what_the_readme_says(tmp_path, api_server):
    """The README's curl against a real daemon in extender mode, at the extender's own port."""
    from clusterenv import ClusterEnv

    text = README.read_text()
    m = re.search(r"curl -s --cert \$DIR/extender-client.crt --key \$DIR/extender-client.key \\\s*"
                  r"--cacert \$DIR/extender-ca.crt --connect-to (\S+) \\\s*"
                  r"-X POST -H 'Content-Type: application/json' \\\s*-d '([^']*)' \\\s*(\S+)/filter", text)
    assert m, "the README's curl check is gone"
    connect_to, body, url = m.group(1), m.group(2), m.group(3)
    assert url == "https://hamid-webhook.kube-system.svc:31999"
    assert connect_to == "hamid-webhook.kube-system.svc:31999:127.0.0.1:31999"
    answer = re.search(r"answers `(\{.*?\})`", text, re.S)
    assert answer, "the README does not say what the check answers"
    env = ClusterEnv(tmp_path / "c", api_server, nodes=1, mode="extender").start(webhook=False)
    try:
        env.leader()
        import ssl

        tls = env.extender_tls()  # what the README's step before copies out of the Secrets
        ctx = ssl.create_default_context(cafile=tls["caFile"])
        ctx.load_cert_chain(tls["certFile"], tls["keyFile"])
        with httpx.Client(verify=ctx, trust_env=False) as c:  # --connect-to: the name checked, 127.0.0.1 dialled
            got = c.post(f"https://127.0.0.1:{env.ports[0][3]}/filter", content=body,
                         headers={"Content-Type": "application/json"}, timeout=10,
                         extensions={"sni_hostname": "hamid-webhook.kube-system.svc"})
        with httpx.Client(verify=ssl.create_default_context(cafile=tls["caFile"]), trust_env=False) as c, \
                pytest.raises(httpx.HTTPError):  # without the client certificate: refused in the handshake
            c.post(f"https://127.0.0.1:{env.ports[0][3]}/filter", content=body, timeout=10,
                   extensions={"sni_hostname": "hamid-webhook.kube-system.svc"})
    finally:
        env.stop()
    assert got.status_code == 200, got.text
    assert got.json() == json.loads(answer.group(1).replace("\n", " ")), got.text
