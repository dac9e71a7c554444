"""The driver's names on the wire: one home for every string Kubernetes and kubelet see.

Kubelet's directories are relative to its root (``/var/lib/kubelet``);
``plugins_registry`` is where its plugin watcher looks for registration
sockets and ``plugins/<driver>/`` where a DRA driver keeps its service socket.
"""

from __future__ import annotations

DRIVER = "gpu.hamid.io"
API_GROUP = "resource.k8s.io"
API_VERSION = "v1"
GROUP_VERSION = f"{API_GROUP}/{API_VERSION}"

REGISTRY_DIR = "plugins_registry"  # kubelet's plugin watcher
PLUGINS_DIR = "plugins"  # <dir>/<driver>/dra.sock
REG_SOCKET = f"{DRIVER}-reg.sock"
DRA_SOCKET = "dra.sock"
PLUGIN_TYPE = "DRAPlugin"
# the services' names in registration (supported_versions), newest first (kubelet takes the newest it
# knows), and the gRPC service each is served as (kubelet's proto packages name the paths)
SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
GRPC_SERVICES = {"v1.DRAPlugin": "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
                 "v1beta1.DRAPlugin": "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"}
# device health (KEP-4680): registration names and gRPC services are the same strings
HEALTH_SERVICES = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")

CDI_KIND = f"{DRIVER}/claim"  # CDI device ids: gpu.hamid.io/claim=<claim uid>-<request index>

# What a claim's opaque config carries (DeviceClass or claim config with driver gpu.hamid.io).
CONFIG_API_VERSION = f"{DRIVER}/v1alpha1"
CONFIG_KIND = "GpuConfig"

# Device attributes (unqualified names are the driver's own domain) and capacities
ATTR_NUMA = "resource.kubernetes.io/numaNode"  # the standard name, so claims can align across drivers
CAP_MEMORY = "memory"  # bytes
CAP_CORES = "cores"  # percent of the GPU's compute, 0-100
CAP_SHARES = "shares"  # tenants: each claim takes one of the GPU's deviceSplitCount
TAINT_UNHEALTHY = f"{DRIVER}/unhealthy"

# Partitionable (MIG) devices: the counters of one physical GPU
COUNTER_MEMORY = "memory"  # bytes
COUNTER_SLICE = "memory-slice-{}"  # one counter of 1 per memory slice: placements may not overlap
COUNTER_COMPUTE = "compute-slices"


def device_name(index: int) -> str:
    """A whole GPU's device name in the pool."""
    return f"gpu-{index}"


def mig_device_name(index: int, profile: str, start: int) -> str:
    """A MIG profile placement's device name: ``gpu-0-mig-1g-10gb-3`` (DNS label characters only)."""
    safe = profile.lower().replace(".", "-").replace("+", "-")
    return f"gpu-{index}-mig-{safe}-{start}"


def counter_set(index: int) -> str:
    return f"gpu-{index}-counters"


def slice_name(node: str, part: str) -> str:
    return f"{node}-{DRIVER}-{part}"
