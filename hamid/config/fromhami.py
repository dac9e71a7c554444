"""``hamid config from-hami``: HAMi's chart values and device config, translated.

Input: HAMi's Helm values (``charts/hami/values.yaml`` keys: ``resourceName``,
``scheduler.*``, ``devicePlugin.*``...) and, optionally, its
``device-config.yaml`` (a top-level ``nvidia:`` block beside other vendors')
or the device plugin's ``config.json`` (``nodeconfig``). Output: values for
hamid's chart (``config:`` holds hamid's config file, the same keys a Docker
host's ``--config`` takes) and one line per HAMi key saying what became of it:

``warning``         written, but likely not what was meant (an allowlist
                    model that names no GPU: such a GPU allows every profile);
``mapped``          written to the hamid key named;
``default``         HAMi's value is hamid's default too: nothing written;
``no counterpart``  hamid has nothing to set, and the line says why.

:func:`report` puts the summary first, then warnings, mapped and default
lines, then the keys with no counterpart grouped by why (a chart's values
have some 180 of them). A device config given alone, in the values' place, is
recognised (:func:`is_device_config`) and read as the device config.

The result is checked with hamid's own config schema before it is written,
so what comes out is a config ``hamid run`` accepts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..errors import HamidError


@dataclass(frozen=True)
class Line:
    key: str  # the HAMi key, dotted
    action: str  # mapped, default, no counterpart
    detail: str

    def __str__(self) -> str:
        return f"{self.action:<15} {self.key}: {self.detail}"


# HAMi chart value -> hamid config key
CONFIG = {
    "resourceName": "resourceCountName", "resourceMem": "resourceMemoryName",
    "resourceMemPercentage": "resourceMemoryPercentageName", "resourceCores": "resourceCoreName",
    "resourcePriority": "resourcePriorityName",
    "scheduler.defaultSchedulerPolicy.nodeSchedulerPolicy": "nodeSchedulerPolicy",
    "scheduler.defaultSchedulerPolicy.gpuSchedulerPolicy": "gpuSchedulerPolicy",
    "devicePlugin.deviceSplitCount": "deviceSplitCount", "devicePlugin.deviceMemoryScaling": "deviceMemoryScaling",
    "devicePlugin.deviceCoreScaling": "deviceCoreScaling", "devicePlugin.deviceListStrategy": "deviceListStrategy",
    "devices.nvidia.gpuCorePolicy": "gpuCorePolicy", "legacyMetrics": "legacyMetrics",
}
# HAMi chart value -> hamid chart value (dotted), taken whole (maps and lists too)
CHART = {
    "devicePlugin.nvidiaNodeSelector": "nodeSelector", "devicePlugin.tolerations": "tolerations",
    "scheduler.admissionWebhook.failurePolicy": "webhook.failurePolicy",
}
# hamid's chart defaults for those (charts/hamid/values.yaml): equal or empty HAMi values change nothing,
# and an empty HAMi list must not wipe hamid's own (its tolerations for GPU taints)
CHART_DEFAULTS = {"nodeSelector": {"gpu": "on"}, "webhook.failurePolicy": "Ignore"}
WHOLE = set(CHART) | {"devicePlugin.nodeConfiguration.config",  # leaves even when they are maps or lists
                       "devices.nvidia.migProfileAllowlist"}
# device-config.yaml's nvidia: keys that are hamid config keys of the same name
SAME_NAME = ("resourceCountName", "resourceMemoryName", "resourceMemoryPercentageName", "resourceCoreName",
             "resourcePriorityName", "defaultMemory", "defaultCores", "defaultGPUNum", "memoryFactor",
             "deviceSplitCount", "deviceMemoryScaling", "deviceCoreScaling", "migProfileAllowlist", "gpuCorePolicy")
# the device plugin's nodeconfig keys (lower case) -> hamid's nodeconfig keys
NODE = {"operatingmode": "operatingMode", "devicememoryscaling": "deviceMemoryScaling",
        "devicecorescaling": "deviceCoreScaling", "devicesplitcount": "deviceSplitCount",
        "filterdevices": "filterDevices"}

OTHER_VENDOR = "another vendor's device: hamid drives NVIDIA GPUs only"
# (key prefix, why there is nothing to set), first match wins
NO_COUNTERPART = (
    ("global.gpuHookPath", "the shim is installed by each daemon in its state directory (hostPaths.state)"),
    ("global.", "image registry, tags and labels: set image.* and the chart's own labels"),
    ("nameOverride", "set nameOverride in hamid's values if wanted"),
    ("fullnameOverride", "set fullnameOverride in hamid's values if wanted"),
    ("namespaceOverride", "hamid installs into the release namespace (helm -n)"),
    ("podSecurityPolicy", "PodSecurityPolicy is gone from Kubernetes since 1.25"),
    ("scheduler.kubeScheduler", "no scheduler pod: gate mode needs no kube-scheduler; extender mode configures the "
                                "cluster's own (mode=extender renders the file)"),
    ("scheduler.extender", "no scheduler Deployment: the DaemonSet's image (image.*) serves the webhook and extender"),
    ("scheduler.leaderElect", "every daemon takes part in the election (leaderElection* config keys)"),
    ("scheduler.replicas", "one daemon per GPU node; any of them can lead"),
    ("scheduler.nodeLockExpire", "hamid takes no node lock: each node's ledger re-checks every commit"),
    ("scheduler.certManager", "the chart makes the webhook certificate, or takes webhook.certificate.existingSecret"),
    ("scheduler.patch", "the chart makes the webhook certificate at install (no certgen Jobs)"),
    ("scheduler.service", "no scheduler Service: the webhook Service and, in extender mode, extender.*"),
    ("scheduler.metricsBindAddress", "every daemon serves the metrics on ports.metrics (9394)"),
    ("scheduler.forceOverwriteDefaultScheduler", "hamid keeps kube-scheduler (see adoptSchedulerNames)"),
    ("scheduler.overwriteEnv", "hamid sets no CUDA environment beyond the container's limits"),
    ("scheduler.admissionWebhook", "webhook.* (failurePolicy, timeoutSeconds, excludeNamespaces) in hamid's values"),
    ("scheduler.", "a setting of HAMi's scheduler Deployment, which hamid does not have"),
    ("devicePlugin.image", "image.* in hamid's values (one image)"),
    ("devicePlugin.monitor", "the daemon exports the vGPU monitor's metrics itself (ports.metrics)"),
    ("devicePlugin.migStrategy", "MIG instances are made on demand for nvidia.com/gpu with vgpu-mode mig; "
                                 "mixed (native MIG resources) is not offered"),
    ("devicePlugin.disablecorelimit", "HAMi's switch for its own plugin; hamid's is config.gpuCorePolicy: disable"),
    ("devicePlugin.preConfiguredDeviceMemory", "memory is read from NVML"),
    ("devicePlugin.enableNumaTopology", "NUMA nodes are always read (numa-bind, the numa policy)"),
    ("devicePlugin.libPath", "the shim lives in the state directory (hostPaths.state)"),
    ("devicePlugin.pluginPath", "hostPaths.kubelet is kubelet's root directory (device-plugins/ under it)"),
    ("devicePlugin.runtimeClassName", "nvidia.runtimeClassName runs the daemon under NVIDIA's runtime"),
    ("devicePlugin.createRuntimeClass", "hamid creates no RuntimeClass"),
    ("devicePlugin.nodeConfiguration.externalConfigName", "per-node settings go under config.nodeconfig"),
    ("devicePlugin.", "a setting of HAMi's device plugin DaemonSet: see hamid's values.yaml for its own"),
    ("mockDevicePlugin", "hamid simulates GPUs itself (config simulate)"),
    ("devices.nvidia.libCudaLogLevel", "LIBCUDA_LOG_LEVEL is read from each container's own environment"),
    ("devices.", OTHER_VENDOR),
    ("device-config", "its content is read by giving the device config file as the second argument"),
)
VENDOR_PREFIXES = ("mlu", "dcu", "metax", "enflame", "kunlun", "vastai", "biren", "iluvatar", "ascend", "mthreads",
                   "amd", "awsneuron")
NVIDIA_NO_COUNTERPART = {
    "overwriteEnv": "hamid sets no CUDA environment beyond the container's limits",
    "preConfiguredDeviceMemory": "memory is read from NVML",
    "enableNumaTopology": "NUMA nodes are always read (numa-bind, the numa policy)",
    "libCudaLogLevel": "LIBCUDA_LOG_LEVEL is read from each container's own environment",
    "runtimeClassName": "hamid sets no runtimeClassName on GPU pods (it works with the node's default runtime)",
    "disableCoreLimit": "hamid's switch is gpuCorePolicy: disable",
    "knownMigGeometries": "instances are made on demand; migProfileAllowlist restricts the profiles",
}


def _leaves(d: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(d, dict) and prefix not in WHOLE and (d or not prefix):
        out = []
        for k, v in d.items():
            out.extend(_leaves(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return [(prefix, d)]


def _set(doc: dict, dotted: str, value: Any) -> None:
    *path, last = dotted.split(".")
    for p in path:
        doc = doc.setdefault(p, {})
    doc[last] = value


def translate(values: dict | None, device_config: dict | None = None) -> tuple[dict, list[Line]]:
    """(hamid's chart values, one line per HAMi key); raises HamidError if the result is not a valid config."""
    from .schema import Config

    defaults = Config().model_dump(mode="json")
    out: dict[str, Any] = {}
    config: dict[str, Any] = {}
    lines: list[Line] = []

    def to_config(key: str, hkey: str, value: Any) -> None:
        if defaults.get(hkey) == value or (isinstance(value, str) and str(defaults.get(hkey)) == value):
            lines.append(Line(key, "default", f"{value!r} is hamid's default {hkey} too"))
        else:
            config[hkey] = value
            lines.append(Line(key, "mapped", f"{value!r} -> config.{hkey}"))

    for key, value in _leaves(values or {}):
        if not key:
            continue
        if key in CONFIG:
            to_config(key, CONFIG[key], value)
        elif key in CHART:
            if value in (None, "", [], {}) or CHART_DEFAULTS.get(CHART[key]) == value:
                lines.append(Line(key, "default", f"{value!r}: hamid's chart keeps its own {CHART[key]}"))
            else:
                _set(out, CHART[key], value)
                lines.append(Line(key, "mapped", f"{value!r} -> {CHART[key]}"))
        elif key == "schedulerName":
            names = ["hami-scheduler"] if value in (None, "") else sorted({"hami-scheduler", str(value)})
            to_config(key, "adoptSchedulerNames", names)
            lines[-1] = Line(key, lines[-1].action, lines[-1].detail + ": pods asking for it go to kube-scheduler, "
                             "where hamid places them")
        elif key == "devicePlugin.nodeConfiguration.config":
            _node_config(key, value, config, lines)
        elif key.startswith("devices.nvidia.") and key.count(".") == 2 and key.split(".")[2] in SAME_NAME:
            to_config(key, key.split(".")[2], value)
            if key.endswith(".migProfileAllowlist"):
                _check_allowlist(key, value, lines)
        elif key.startswith("devices.nvidia.") and key.split(".")[2] in NVIDIA_NO_COUNTERPART:
            lines.append(Line(key, "no counterpart", NVIDIA_NO_COUNTERPART[key.split(".")[2]]))
        elif key.split(".")[0].startswith(VENDOR_PREFIXES):
            lines.append(Line(key, "no counterpart", OTHER_VENDOR))
        else:
            why = next((w for p, w in NO_COUNTERPART if key == p or key.startswith(p if p.endswith(".") else p + ".")
                        or key == p), None)
            lines.append(Line(key, "no counterpart", why or "not a HAMi value this translation knows; left out"))
    if device_config:
        _device_config(device_config, config, lines, to_config)
    if config:
        out["config"] = config
    try:
        Config.model_validate(config)
    except Exception as e:  # pydantic's message names the key and what is accepted
        raise HamidError(f"the translated config is not one hamid accepts: {e}") from None
    return out, lines


def _node_config(key: str, value: Any, config: dict, lines: list[Line]) -> None:
    try:
        doc = json.loads(value) if isinstance(value, str) else value
    except ValueError as e:
        raise HamidError(f"{key}: not JSON ({e})") from None
    entries = (doc or {}).get("nodeconfig") or []
    if not isinstance(entries, list):
        raise HamidError(f"{key}: nodeconfig must be a list")
    nodes = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise HamidError(f"{key}: nodeconfig[{i}] must be a mapping")
        name = entry.get("name")
        if name in (None, "", "your-node-name"):
            lines.append(Line(f"{key}.nodeconfig[{i}]", "no counterpart", "HAMi's placeholder node: left out"))
            continue
        node: dict[str, Any] = {"name": name}
        for k, v in entry.items():
            where = f"{key}.nodeconfig[{i}].{k}"
            if k == "name":
                continue
            if k in NODE:
                node[NODE[k]] = v
                lines.append(Line(where, "mapped", f"{v!r} -> config.nodeconfig[name={name}].{NODE[k]}"))
            else:
                lines.append(Line(where, "no counterpart", {
                    "preconfigureddevicememory": "memory is read from NVML",
                    "enablenumatopology": "NUMA nodes are always read",
                    "migstrategy": "MIG instances are made on demand; mixed is not offered",
                    "enablegetpreferredallocation": "GetPreferredAllocation is always served",
                    "libcudaloglevel": "LIBCUDA_LOG_LEVEL is read from each container's own environment",
                }.get(k, "not a nodeconfig key this translation knows; left out")))
        nodes.append(node)
    if nodes:
        config["nodeconfig"] = nodes


def _device_config(doc: dict, config: dict, lines: list[Line], to_config) -> None:
    if not isinstance(doc, dict):
        raise HamidError("the device config must be a mapping (device-config.yaml or config.json)")
    for top, body in doc.items():
        if top == "nodeconfig":
            _node_config("nodeconfig", {"nodeconfig": body}, config, lines)
        elif top == "nvidia":
            for k, v in (body or {}).items():
                key = f"nvidia.{k}"
                if k in SAME_NAME:
                    to_config(key, k, v)
                    if k == "migProfileAllowlist":
                        _check_allowlist(key, v, lines)
                else:
                    lines.append(Line(key, "no counterpart",
                                      NVIDIA_NO_COUNTERPART.get(k, "not a HAMi key this translation knows; left out")))
        else:
            lines.append(Line(top, "no counterpart", OTHER_VENDOR))


def _check_allowlist(key: str, entries: Any, lines: list[Line]) -> None:
    """One line per allowlist model: the GPUs it names, matched as the daemon
    matches them (:mod:`hamid.devices.modelnames`), or a warning when it names
    none hamid knows (a GPU no entry names allows every profile)."""
    from ..devices.modelnames import known_gpus_named

    for i, e in enumerate(entries or ()):
        for m in (e or {}).get("models") or () if isinstance(e, dict) else ():
            where = f"{key}[{i}].models"
            named = known_gpus_named(str(m))
            if named:
                lines.append(Line(where, "mapped", f"{m!r} names the GPUs NVML reports as {', '.join(named)}"))
            else:
                lines.append(Line(where, "warning", f"{m!r} names none of the MIG GPUs hamid knows; on a node whose "
                                  "GPU no entry names, every MIG profile is allowed (the daemon logs such a GPU "
                                  "at start): write the model as `hamid status` shows its name"))


VALUES_KEYS = ("resourceName", "scheduler", "devicePlugin", "devices", "global", "schedulerName")


def is_device_config(doc: dict) -> bool:
    """Is ``doc`` HAMi's device-config.yaml (``nvidia:`` at the top) or the
    device plugin's config.json (``nodeconfig``) rather than chart values?"""
    return bool(doc) and not any(k in doc for k in VALUES_KEYS) and (
        isinstance(doc.get("nvidia"), dict) or isinstance(doc.get("nodeconfig"), list))


ORDER = ("warning", "mapped", "default", "no counterpart")


def report(lines: list[Line]) -> list[str]:
    """What the CLI prints: a summary, then the lines that matter first, and
    the keys with no counterpart grouped by why, one line per reason."""
    counts = {a: sum(1 for x in lines if x.action == a) for a in ORDER}
    out = [f"{counts['mapped']} mapped, {counts['warning']} warning(s), {counts['default']} already hamid's "
           f"default, {counts['no counterpart']} with no counterpart (grouped by why, last)"]
    for action in ORDER[:-1]:
        out += [str(x) for x in lines if x.action == action]
    groups: dict[str, list[str]] = {}
    for x in lines:
        if x.action == "no counterpart":
            groups.setdefault(x.detail, []).append(x.key)
    for why, keys in sorted(groups.items(), key=lambda kv: len(kv[1])):
        if len(keys) == 1:
            out.append(str(Line(keys[0], "no counterpart", why)))
        else:
            out.append(f"{'no counterpart':<15} {len(keys)} keys: {why}: {', '.join(keys)}")
    return out
