"""The configuration schema. Every key, its default, and the reason for it.

The file is YAML with camelCase keys, the same names HAMi's device config and
``nodeconfig`` use where the meaning is the same, so a HAMi user's values carry
over. Global keys sit at the top; ``nodeconfig`` lists per-node overrides of
the node settings, matched on the node's name.

Example::

    deviceSplitCount: 10
    operatingMode: hami-core
    nodeconfig:
      - name: gpu-node-7
        operatingMode: mig
        filterDevices: {index: [3]}
"""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from ..request.model import ResourceNames

_STRICT = ConfigDict(extra="forbid", populate_by_name=True, frozen=True, validate_default=True)

_HAMI_NAMES = ResourceNames()  # the resource names' defaults are HAMi's, defined once there
# A Kubernetes extended resource name: a DNS-subdomain prefix, a slash, a name.
_RESOURCE_NAME = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"


class FilterDevices(BaseModel):
    """GPUs this node must never hand out (not registered, refused on request)."""

    model_config = _STRICT
    uuid: tuple[str, ...] = ()
    """Exact GPU UUIDs (``GPU-...``) to leave alone."""
    index: tuple[int, ...] = ()
    """NVML indexes to leave alone."""

    @field_validator("index")
    @classmethod
    def _non_negative(cls, v):
        for i in v:
            if i < 0:
                raise ValueError(f"GPU index must be >= 0, got {i}")
        return v


class MigAllowlistEntry(BaseModel):
    """One ``migProfileAllowlist`` entry: models and the profiles they may use."""

    model_config = _STRICT
    models: tuple[str, ...] = Field(min_length=1)
    """Substrings of GPU names (``A100-SXM4-40GB``, ``H100``)."""
    profiles: tuple[str, ...] = Field(min_length=1)
    """MIG profile names (``1g.10gb``, ``3g.40gb``)."""

    @field_validator("profiles")
    @classmethod
    def _profile_names(cls, v):
        import re

        for p in v:
            if not re.fullmatch(r"[1-8]g\.[0-9]{1,3}gb(\+me)?", p, re.ASCII):
                raise ValueError(f"{p!r} is not a MIG profile name such as 1g.10gb or 3g.40gb+me")
        return v


class ResourceNameSettings(BaseModel):
    """The Kubernetes resource names pods ask with (HAMi's ``nvidia:`` keys of
    the same names). The request parser, the device plugin's registration and
    the webhook all read them from here, so renaming one renames it everywhere."""

    model_config = _STRICT

    resourceCountName: str = Field(_HAMI_NAMES.count, pattern=_RESOURCE_NAME)
    """GPUs per container. HAMi's default; rename it (``example.com/vgpu``) to
    run beside NVIDIA's own device plugin, which owns ``nvidia.com/gpu``."""

    resourceMemoryName: str = Field(_HAMI_NAMES.memory, pattern=_RESOURCE_NAME)
    """MiB per GPU (times ``memoryFactor``). HAMi's default."""

    resourceMemoryPercentageName: str = Field(_HAMI_NAMES.memory_percentage, pattern=_RESOURCE_NAME)
    """Percent of each card's memory. HAMi's default."""

    resourceCoreName: str = Field(_HAMI_NAMES.cores, pattern=_RESOURCE_NAME)
    """Percent of each GPU's compute. HAMi's default."""

    resourcePriorityName: str = Field(_HAMI_NAMES.priority, pattern=_RESOURCE_NAME)
    """Task priority (0 high, 1 low). HAMi's default."""

    @model_validator(mode="after")
    def _distinct(self):
        names = [self.resourceCountName, self.resourceMemoryName, self.resourceMemoryPercentageName,
                 self.resourceCoreName, self.resourcePriorityName]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"resource names must differ; {dup[0]!r} is used for two resources")
        return self


class NodeSettings(BaseModel):
    """Settings that may differ per node (the ``nodeconfig`` keys)."""

    model_config = _STRICT

    deviceSplitCount: int = Field(10, ge=1, le=1024)
    """How many containers may share one GPU. 10 is HAMi's default: enough
    sharing for inference fleets without so many tenants that each one's
    share of memory becomes useless."""

    deviceMemoryScaling: float = Field(1.0, gt=0, le=100)
    """Multiplier on each GPU's physical memory for booking. 1.0 books exactly
    what exists; above 1 oversubscribes (the shim then cannot promise every
    tenant its limit at once)."""

    deviceCoreScaling: float = Field(1.0, gt=0, le=100)
    """Multiplier on each GPU's 100% of compute for booking. 1.0: the cores of
    all tenants add up to at most the whole GPU."""

    operatingMode: Literal["hami-core", "mig", "mps", "any"] = "hami-core"
    """``hami-core``: share GPUs through the shim's memory and compute limits.
    ``mig``: carve MIG instances on demand (the GPU must already be in MIG
    mode; hamid never switches it). ``mps``: share each GPU among clients of
    one NVIDIA MPS control daemon per GPU that hamid starts and stops, each
    client held to its own active thread percentage (hard SM partitions) and
    pinned-memory limit. ``any``: a GPU serves hami-core and MPS tenants, one
    mode at a time (whichever its current tenants use; an idle GPU takes
    either, hami-core for a request that names none). A GPU's real MIG mode
    always wins over this setting. Shim mode is the default because every
    NVIDIA GPU supports it; MPS needs Volta or newer and the driver's
    ``nvidia-cuda-mps-control``."""

    deviceModes: dict[str, Literal["hami-core", "mps", "any"]] = {}
    """Per GPU, by NVML index (``"0"``) or UUID (``GPU-...``): the share mode
    that GPU serves, overriding ``operatingMode`` for it (e.g. ``{"0": mps}``
    keeps GPU 0 for MPS tenants and the rest in hami-core mode). Empty (the
    default): every GPU follows ``operatingMode``. A GPU in MIG mode is MIG
    whatever this says."""

    mpsDir: str | None = None
    """Where each GPU's MPS pipe and log directories go (``<dir>/<GPU uuid>/pipe``).
    Unset: ``<stateDir>/mps``, private to root like the state directory, which
    serves containers that run as root (the common case). MPS starts each
    client's server as the client's UID, and that server opens the pipe
    directory by its host path: for containers of other users set an
    absolute directory whose ancestors they may traverse (hamid makes it
    0711), e.g. ``/run/hamid-mps``. Its control socket's path must fit a unix
    socket (107 bytes)."""

    mpsControl: str = "nvidia-cuda-mps-control"
    """The MPS control program: a name looked up on ``PATH`` (the driver
    installs it in ``/usr/bin``) or an absolute path. Only read where some
    GPU serves MPS."""

    filterDevices: FilterDevices = FilterDevices()
    """GPUs to leave alone; empty by default (use every GPU)."""

    draDevices: str = Field("", max_length=4096, pattern=r"^[A-Za-z0-9,._ -]*$")
    """GPUs this node serves through Dynamic Resource Allocation (driver
    ``gpu.hamid.io``, docs/dra.md) instead of the device plugin: ``all``, or
    a comma-separated list of indexes and UUIDs (``0,1`` or ``GPU-...``);
    empty (the default): DRA off, every GPU is the device plugin's. A GPU is
    never served by both: the device plugin leaves these out of what it
    advertises to kubelet, and placement never chooses them for a pod, nor
    for a Docker container that does not name them (``HAMI_VISIBLE_DEVICES``).
    Set per node in ``nodeconfig`` to turn DRA on for
    some nodes only. Needs ``kubernetes`` (the slices are published through
    the API server)."""

    defaultMemory: int = Field(0, ge=0)
    """MiB given to a container that asks for GPUs but no memory. 0 means the
    whole card, HAMi's default, so a plain ``nvidia.com/gpu: 1`` behaves as it
    does without hamid."""

    defaultCores: int = Field(0, ge=0, le=100)
    """Percent of compute given to a container that names no cores. 0: no
    compute reservation (time-shared), HAMi's default."""

    defaultGPUNum: int = Field(1, ge=1, le=64)
    """GPUs given to a container that asks for memory or cores but no GPU
    count. 1, as in HAMi."""

    nodeSchedulerPolicy: Literal["binpack", "spread"] = "binpack"
    """How nodes are ranked. ``binpack`` fills busy nodes first, keeping whole
    nodes free for large jobs (HAMi's default)."""

    gpuSchedulerPolicy: str = "spread"
    """How GPUs within a node are ranked: ``spread``, ``binpack``,
    ``topology-aware`` (multi-GPU requests get the best-linked set),
    ``mutex`` (idle GPUs only), ``numa`` or a chain such as ``binpack,numa``,
    as HAMi's. ``spread`` puts tenants on the least busy GPU, which limits
    noisy neighbours (HAMi's default)."""

    gpuCorePolicy: Literal["default", "force", "disable"] = "default"
    """The compute limit's policy (HAMi's ``gpuCorePolicy``, written into each
    container's limits file as ``GPU_CORE_UTILIZATION_POLICY``): ``default``
    limits a container only while another container runs kernels on its GPU
    (the GPU's time is not wasted when nobody else wants it), ``force`` always,
    ``disable`` never. ``default`` is HAMi's chart default. A container may ask
    for ``force`` (pod env ``GPU_CORE_UTILIZATION_POLICY``, Docker
    ``HAMI_VGPU_SPEC`` ``policy=force``), never for less than the node's."""

    computeBypass: Literal["stop", "report"] = "stop"
    """What the daemon does with a container that has a compute limit and runs
    kernels its shim does not charge (no shim in its processes, or a region it
    froze: ``hamid_vgpu_region_untrusted_total{reason="uncharged"}``).
    ``stop`` holds it to its limit from outside: while NVML shows its
    processes over their limit, it stops them (SIGSTOP) pass by pass and
    continues them (SIGCONT) when they are back under (the daemon needs the
    host's pid namespace, as for priority). ``report`` only logs and counts
    it, and it runs unlimited."""

    memoryBypass: Literal["kill", "report"] = "kill"
    """What the daemon does with a container that has a GPU memory limit and
    whose processes hold more than it (NVML's per-process count, plus 2 % or
    at least 128 MiB) two passes running, where some of its processes have no
    shim mapped (nothing inside counts their allocations). ``kill`` kills
    those processes (SIGKILL), as a cgroup's memory limit does: memory a
    stopped process holds stays held. ``report`` only logs and counts it
    (``hamid_vgpu_memory_over_limit_passes_total``). Processes that map the
    shim are never killed: their shim holds their allocations."""

    memoryFactor: int = Field(1, ge=1, le=1 << 20)
    """Multiplier on ``nvidia.com/gpumem`` (HAMi's ``memoryFactor``): with
    1024 a pod writes GiB. 1, HAMi's default, keeps the value in MiB. Docker's
    ``mem=`` has units of its own and is not multiplied."""

    migProfileAllowlist: tuple[MigAllowlistEntry, ...] = ()
    """MIG profiles this node may create, per GPU model (HAMi's
    ``migProfileAllowlist``): a GPU whose name contains one of an entry's
    ``models`` may use only that entry's ``profiles`` (the first entry that
    matches applies). Empty (the default): every profile of the GPU's table,
    since hamid creates instances on demand and needs no fixed geometry."""

    simulate: str | None = None
    """Simulated inventory ``MODEL[:COUNT][,...]``. Unset: NVML when a driver
    is present, otherwise the default simulated inventory. The first log line
    says which."""


    @field_validator("gpuSchedulerPolicy")
    @classmethod
    def _gpu_policy(cls, v):
        from ..request.model import RequestError, parse_gpu_policy

        try:
            return parse_gpu_policy(v, "gpuSchedulerPolicy")
        except RequestError as e:
            raise ValueError(str(e)) from None

    @field_validator("mpsDir")
    @classmethod
    def _mps_dir(cls, v):
        if v is not None and (not v.startswith("/") or "\x00" in v):
            raise ValueError(f"mpsDir {v!r}: expected an absolute directory path")
        return v

    @field_validator("deviceModes")
    @classmethod
    def _device_keys(cls, v):
        import re

        for k in v:
            if not (re.fullmatch(r"[0-9]{1,2}", k, re.ASCII)
                    or re.fullmatch(r"GPU-[0-9a-fA-F-]{36}", k, re.ASCII)):
                raise ValueError(f"deviceModes key {k!r}: expected a GPU index (\"0\") or a GPU UUID (GPU-...)")
        return v

    def share_modes(self, index: int, uuid: str) -> tuple[str, ...]:
        """The share modes a non-MIG GPU serves, its default (for a request
        that names none) first: ``deviceModes`` for it, else ``operatingMode``."""
        m = self.deviceModes.get(uuid) or self.deviceModes.get(str(index)) or self.operatingMode
        return {"mps": ("mps",), "any": ("hami-core", "mps")}.get(m, ("hami-core",))

    @field_validator("simulate")
    @classmethod
    def _simulate_spec(cls, v):
        if v is not None:
            from ..devices.errors import DeviceError
            from ..devices.simulated import parse_simulate_spec

            try:
                parse_simulate_spec(v)
            except DeviceError as e:
                raise ValueError(str(e)) from None
        return v


class NodeOverride(NodeSettings):
    """One ``nodeconfig`` entry: a node name plus the settings it overrides."""

    name: str = Field(min_length=1)


class Config(NodeSettings, ResourceNameSettings):
    """The whole file: node settings plus daemon-wide keys."""

    nodeName: str | None = None
    """This node's name. Unset: ``$NODE_NAME`` (set by the DaemonSet), then
    the host name."""

    stateDir: str = "/var/lib/hamid"
    """Where the ledger, the local API socket and per-container directories
    live. Several daemons on one machine (tests) each get their own. A
    relative path is made absolute against the working directory when the
    config is loaded: runc resolves a container's mount sources against its
    bundle, so a relative one would name nothing there."""

    metricsPort: int = Field(9394, ge=0, le=65535)
    """Prometheus port; 9394 is HAMi's monitor port, so existing scrape
    configs keep working. 0 disables the metrics endpoint."""

    regionTmpfs: bool = True
    """Give each container's region directory (the one host directory it may
    write) a 4 MiB tmpfs of its own, so a tenant cannot fill the node's disk
    through it. Needs CAP_SYS_ADMIN, which the daemon has as root; false keeps
    region directories on the state directory's file system."""

    legacyMetrics: bool = False
    """Also export HAMi's pre-2.9 metric names (``GPUDeviceMemoryLimit``,
    ``vGPU_device_memory_usage_in_bytes``, ...) with their old label names, as
    HAMi's ``--legacy-metrics`` does, for dashboards and alerts not yet moved
    to the ``hami_*`` names. Off by default, as in HAMi: twice the series."""

    metricsAddress: str = "127.0.0.1"
    """Address the metrics endpoint binds to. Loopback by default: the
    metrics name every tenant and its use, so a host serves them to its own
    Prometheus (or node agent) unless told otherwise; ``0.0.0.0`` to be
    scraped from other hosts (the chart sets it: in a cluster Prometheus
    scrapes pods by their address)."""

    logFormat: Literal["auto", "json", "console"] = "auto"
    """``auto``: readable on a terminal, JSON lines otherwise."""

    logLevel: Literal["debug", "info", "warning", "error"] = "info"
    """``info`` logs each reservation and release: enough to audit, little
    enough to keep."""

    reconcileInterval: float = Field(30.0, gt=0, le=3600)
    """Seconds between reconciliations of the ledger against what really runs.
    30 s bounds how long a missed release holds capacity without costing
    measurable CPU."""

    shimLibrary: str | None = None
    """The built shim (``libvgpu.so``) to install into ``stateDir/shim`` at
    start-up. Unset: ``shim/build/libvgpu.so`` of this source tree, then
    ``shim/libvgpu.so`` in the Python prefix hamid runs from (where ``make
    install`` puts it: ``/usr/local/lib/hamid/shim``), then
    ``/usr/lib/hamid/libvgpu.so`` (the image's). Without a shim, containers asking for
    memory or compute limits are refused rather than run unlimited."""

    devRoot: str = "/dev"
    """Where the host's NVIDIA device nodes are. Only tests change it."""

    migCapsRoot: str = "/proc/driver/nvidia/capabilities"
    """Where the driver publishes MIG capability minors. Only tests change it."""

    dockerStartGrace: float = Field(120.0, gt=0, le=3600)
    """Seconds a Docker reservation may exist before runc has created its
    container. The runtime reserves before it execs runc; 120 s covers a slow
    image mount without holding a crashed start's capacity for long."""

    releasePollInterval: float = Field(0.2, gt=0, le=60)
    """Seconds between looks for containers whose poststop hook has run, where
    the daemon cannot watch the markers' directory with inotify (on Linux it
    does, and drains a marker as soon as it appears, waking for nothing while
    none does: an idle wake-up costs ~0.4 ms of CPU on a VM, so polling at
    0.2 s alone was 0.25% of a core). The look is one directory listing; 0.2 s
    returns a GPU to the pool about as fast as Docker reports the exit. Every
    reservation drains them first anyway."""

    mpsCheckInterval: float = Field(5.0, gt=0, le=3600)
    """Seconds between health checks of the GPUs' MPS control daemons (where
    some GPU serves MPS). A check is one ``get_server_list`` per daemon with
    tenants (milliseconds); 5 s finds a dead or wedged daemon, marks its
    tenants failed and restarts it before most clients' own retries give up."""

    nodeconfig: tuple[NodeOverride, ...] = ()
    """Per-node overrides, matched on the node's name."""

    # --- Kubernetes on the node (hamid/kubelet) ---

    kubernetes: bool = False
    """Run the kubelet face: register with kubelet as the device plugin for
    ``resourceCountName``, tie each container to its pod by UID, watch this
    node's pods through the API server. Off by default so that ``hamid run``
    on a Docker host needs no cluster."""

    kubeconfig: str | None = None
    """A kubeconfig file for the API server. Unset: the in-cluster service
    account, as a DaemonSet pod has it."""

    kubeletDir: str = "/var/lib/kubelet"
    """Kubelet's root directory: its ``device-plugins/`` (registration, the
    plugin's socket) and ``pod-resources/`` sockets live under it. The default
    is every kubelet's unless it was started with ``--root-dir``."""

    deviceListStrategy: Literal["envvar", "cdi-cri"] = "envvar"
    """How containers get their devices. ``envvar`` (HAMi's default name) works
    with every container runtime: the devices kubelet chose decide the GPU and
    the reservation follows them under the ledger's re-check. ``cdi-cri``: the
    container gets a CDI device whose spec hamid writes once the pod is known,
    so the GPU is the ledger's choice and MIG works; it needs a runtime with
    CDI (containerd >= 1.7 with CDI on, containerd 2, CRI-O) and Kubernetes
    >= 1.31."""

    controlMode: Literal["gate", "extender", "none"] = "gate"
    """How GPU pods are placed on the cluster (with ``kubernetes``). ``gate``:
    the webhook gates every GPU pod and the elected leader places it, then
    kube-scheduler binds it; needs no scheduler configuration, so it works on
    managed clusters (EKS, GKE, AKS). ``extender``: kube-scheduler calls
    hamid's extender (``contrib/kubelet/``). ``none``: this daemon runs no
    scheduling face (pods then arrive with ``spec.nodeName`` or no reservation
    and are admitted by their node)."""

    extenderListen: str = "0.0.0.0:9998"
    """``HOST:PORT`` of the extender's HTTP server (``controlMode: extender``).
    Every daemon serves it and forwards to the leader; the Service selecting
    the leader's label is what kube-scheduler's ``urlPrefix`` names."""

    extenderClientCAFile: str | None = None
    """PEM CA certificate(s) of the extender's callers (``controlMode:
    extender``). The extender then serves HTTPS only (the webhook's serving
    certificate) and completes no TLS handshake without a client certificate
    this CA signed: kube-scheduler's (``tlsConfig`` in its extender entry) and
    the daemons' own (``extenderClientCertFile``, for a follower forwarding to
    the leader). ``bind`` commits on a node and binds pods with the daemon's
    rights, so nobody else may call it. The chart makes this CA and both
    certificates. Required in extender mode unless ``extenderInsecure``."""

    extenderClientCertFile: str | None = None
    """PEM client certificate a follower presents when it forwards an
    extender call to the leader (signed by ``extenderClientCAFile``'s CA);
    with ``extenderClientKeyFile``. Unset: a follower answers calls itself
    (every commit is still re-checked by its node's ledger)."""

    extenderClientKeyFile: str | None = None
    """PEM private key of ``extenderClientCertFile``."""

    extenderServerCAFile: str | None = None
    """PEM CA that signed the daemons' serving certificate (the chart's
    webhook CA): a follower checks the leader's certificate against it when
    forwarding an extender call (the name is not checked: gossip gives pod
    addresses, the certificate names the Service). Unset:
    ``extenderClientCAFile``."""

    extenderSchedulerNames: tuple[str, ...] = ("default-scheduler",)
    """The ``schedulerName`` values of pods the extender may bind: the
    profiles of the kube-scheduler that calls it (kube-scheduler's own default
    profile is ``default-scheduler``). A pod of another scheduler is refused
    at ``bind``, so no caller can have hamid bind pods it does not schedule."""

    extenderInsecure: bool = False
    """Serve the extender over plain HTTP with no authentication: anyone who
    reaches ``extenderListen`` can then bind pods to nodes with the daemon's
    rights. For a test cluster on one machine only; a warning is logged."""

    webhookListen: str = "0.0.0.0:9443"
    """``HOST:PORT`` of the mutating admission webhook's HTTPS server (with
    ``kubernetes`` and a ``controlMode`` other than ``none``). Every daemon
    serves it, so it survives the leader's death. 9443 is the port
    controller-runtime webhooks use; above 1024 so no capability is needed."""

    frontDir: str = ""
    """A directory shared with ``hamid front``, the unprivileged process that
    serves this node's network faces for callers outside the node (the
    webhook, the extender, ``/metrics``, the peer API, gossip; the chart's
    ``front`` container). Set: ``hamid run`` serves none of them on TCP; it
    answers the extender, the metrics, the relayed peer requests and gossip
    (its membership) on unix sockets in this directory (``extender.sock``,
    ``metrics.sock``, ``peer.sock``, ``gossip.sock``, mode 0660, group
    ``frontGroup``) and ``hamid front`` serves ``webhookListen``,
    ``extenderListen``, the metrics port, ``peerListen`` and ``gossipListen``
    (and dials the other daemons' gossip ports), doing the TLS, client
    certificates, deadlines, size limits, JSON parsing and the opening of
    peer and gossip frames with ``gossipKeyFile`` as nobody. Empty: ``hamid
    run`` serves them itself (a host without the chart)."""

    frontGroup: int | None = Field(None, ge=0)
    """The group whose members may connect to the sockets in ``frontDir``: the
    group ``hamid front`` runs as, and nothing else. Required with ``frontDir``
    (no default: a shared group such as ``nogroup``, 65534, is held by many
    host services, each of which could then call the extender socket). The
    chart sets 65534, the group its ``front`` container runs as: inside the
    pod nothing else has it. On a host, make one for it (``groupadd --system
    hamid-front``)."""

    webhookCertFile: str | None = None
    """PEM certificate (chain) the webhook serves; with ``webhookKeyFile``.
    The chart mounts one Secret into every daemon so one ``caBundle`` trusts
    them all. Unset (both): the daemon keeps a CA of its own in
    ``stateDir/webhook-tls`` (``ca.pem`` is the ``caBundle``; logged at start)
    and a serving certificate for ``webhookNames``; fine for one daemon or a
    test, not for several behind one Service."""

    webhookKeyFile: str | None = None
    """PEM private key of ``webhookCertFile``; set both or neither."""

    webhookNames: tuple[str, ...] = ()
    """DNS names and IP addresses put in the self-made serving certificate
    (no ``webhookCertFile``), besides ``localhost``, ``127.0.0.1`` and a
    concrete ``webhookListen`` host; e.g. ``hamid-webhook.kube-system.svc``,
    the name the API server checks for a ``service`` reference."""

    webhookAllocationWriters: tuple[str, ...] | None = None
    """API users (``userInfo.username``) allowed to change HAMi's allocation
    annotations (``hami.io/vgpu-node``...) on a pod UPDATE; anyone else's
    update that adds, changes or removes one is refused (HAMi #3041: its
    webhook sees CREATE only, so they can be forged later). Unset: this
    daemon's own service account, read from the pod's mounted token; outside
    a pod with it unset, updates are not checked (a warning says so). No node
    ever trusts these annotations; the check keeps tools that read them (and
    the leader, which skips a pod that names a node) from being misled."""

    adoptSchedulerNames: tuple[str, ...] = ("hami-scheduler",)
    """``spec.schedulerName`` values the webhook resets to ``default-scheduler``
    on a GPU pod, saying so in the annotation ``hamid.io/scheduler-name`` and in
    a warning. HAMi's webhook sets ``hami-scheduler`` (and manifests written for
    HAMi carry it); with no scheduler of that name such a pod would stay
    pending forever, while hamid places through kube-scheduler's own profile
    (gate mode: the leader; extender mode: kube-scheduler with the extender).
    ``[]`` leaves every name alone (HAMi's scheduler still running beside
    hamid during a move)."""

    cdiSpecDir: str = "/var/run/cdi"
    """Where ``cdi-cri`` specs are written: the dynamic spec directory every
    CDI-aware runtime reads."""

    healthCheckInterval: float = Field(5.0, gt=0, le=300)
    """Seconds between readings of the GPUs' health for kubelet. 5 s takes an
    unhealthy GPU out of new placements within seconds while costing one NVML
    query per GPU per reading."""

    # --- gossip (hamid/gossip; defaults after memberlist's LAN profile) ---

    gossipListen: str | None = None
    """``HOST:PORT`` the gossip listener binds (websocket). Unset: no gossip,
    the daemon knows only its own node, as before. memberlist's port is 7946;
    we suggest 7947 so both can run on one host."""

    gossipAdvertise: str | None = None
    """``HOST:PORT`` peers dial to reach this node. Unset: ``gossipListen``,
    which must then be a concrete address (not 0.0.0.0): a wildcard cannot be
    dialled, and guessing an interface picks the wrong one on multi-homed nodes."""

    gossipJoin: tuple[str, ...] = ()
    """Seed addresses (``HOST:PORT``) to join through. Empty: this node starts
    a cluster of its own and waits to be joined. Seeds are retried with
    backoff until one answers, and again whenever every peer is gone."""

    gossipKeyFile: str | None = None
    """Keyring file: one base64 AES key (16, 24 or 32 bytes) per line; the
    first seals what this node sends, all are tried on what it receives, so
    keys rotate without downtime. Unset: frames are plain CBOR and a node with
    a key refuses them; off loopback that needs ``gossipInsecure``."""

    gossipInsecure: bool = False
    """Allow gossip without ``gossipKeyFile`` on an address other than
    loopback. Off: such a config is refused, since anyone who reaches the port
    could read the cluster's capacity and inject members and capacity claims
    that steer placement. Plain gossip on loopback (tests, one host) needs no
    key and no flag."""

    gossipProbeInterval: float = Field(1.0, gt=0, le=60)
    """Seconds between failure-detection probes (memberlist LAN: 1 s). Detection
    time and probe load per member both scale with it; 1 s keeps the load at
    one ping/ack pair per second per member at any group size."""

    gossipProbeTimeout: float = Field(0.5, gt=0, le=60)
    """Seconds to wait for a direct ack before asking helpers (LAN: 500 ms):
    well above a LAN round trip plus a busy event loop's delay, and leaves half
    the interval for the indirect probes."""

    gossipIndirectChecks: int = Field(3, ge=0, le=16)
    """Helpers (k) asked to probe a member that missed its direct ack (LAN: 3).
    Three independent paths make a lossy link between two nodes unlikely to
    cause a suspicion, at 4 messages per helper."""

    gossipSuspicionMult: float = Field(3.0, gt=0, le=100)
    """Minimum suspicion timeout = mult x max(1, log10 n) x probe interval.
    memberlist LAN uses 4, which alone gives 8 s at 100 members and puts the
    median detection near 10 s; 3 (memberlist's Local profile) gives 6 s at
    100 and meets a median detection under 8 s. False positives stay rare
    because a suspected member refutes within a few gossip rounds."""

    gossipSuspicionMaxTimeoutMult: float = Field(6.0, ge=1, le=100)
    """Maximum suspicion timeout = this x the minimum (LAN: 6). A suspicion
    nobody confirms waits this long, which is what protects a member that only
    one slow or cut-off prober cannot reach."""

    gossipSuspicionConfirmations: int = Field(2, ge=0, le=32)
    """Independent confirmations (other members also suspecting) that shrink
    the timeout from max to min (Lifeguard). memberlist derives it as
    SuspicionMult - 2 = 2 on LAN; kept at 2 here since the multiplier is lower.
    0 when the group has fewer than k + 2 members."""

    gossipRetransmitMult: int = Field(4, ge=1, le=64)
    """Each update is piggybacked mult x ceil(log10(n + 1)) times (LAN: 4):
    enough for an epidemic to reach every member with high probability."""

    gossipInterval: float = Field(0.2, gt=0, le=60)
    """Seconds between gossip rounds that push queued updates (LAN: 200 ms).
    With 3 targets per round, a change reaches 99% of 100 members in about
    six rounds (~1.2 s); rounds with nothing queued send nothing."""

    gossipNodes: int = Field(3, ge=1, le=64)
    """Members each gossip round sends to (fanout; LAN: 3)."""

    gossipPushPullInterval: float = Field(30.0, gt=0, le=86400)
    """Seconds between full-state exchanges with one random member (LAN: 30 s),
    stretched by ceil(log2 n - 5) + 1 above 32 members so the traffic stays
    flat. Anti-entropy repairs what epidemic dissemination missed."""

    gossipToTheDeadTime: float = Field(30.0, ge=0, le=86400)
    """Seconds a dead member still receives gossip (LAN: 30 s), so a member
    wrongly declared dead hears it and refutes quickly."""

    gossipConnectTimeout: float = Field(5.0, gt=0, le=300)
    """Seconds to dial a peer or finish a send before the link is dropped.
    memberlist's TCP timeout is 10 s for its rare stream calls; ours carry
    probes, so 5 s, still far above a LAN handshake."""

    gossipAwarenessMaxMultiplier: int = Field(8, ge=1, le=64)
    """Lifeguard local health: the probe interval stretches up to this factor
    when this node sees signs that it, not its peers, is slow (missed nacks,
    refutations, a late event loop). 8, as memberlist."""

    gossipMaxFrameBytes: int = Field(256 * 1024, ge=4096, le=64 * 1024 * 1024)
    """Largest frame accepted or sent. A node document of 8 GPUs with full MIG
    tables is ~2.2 KB and a push/pull of 1000 members ~50 KB, so 256 KiB leaves
    room while bounding what a peer can make us buffer and decode."""

    gossipPiggybackBytes: int = Field(16 * 1024, ge=512, le=1024 * 1024)
    """Budget of updates piggybacked on one frame. memberlist is bound by a
    1400 B UDP packet; over TCP 16 KiB carries several node documents per frame
    and still keeps a probe's latency low."""

    gossipCapacityInterval: float = Field(1.0, gt=0, le=3600)
    """Seconds between looks at this node's ledger for its capacity document
    (a commit through the local API also triggers one). A look is SQLite's
    ``data_version`` (microseconds, no worker thread); the ledger is read and
    the document rebuilt only when someone committed, and a new document goes
    out only when its content changed."""

    gossipReconnectInterval: float = Field(10.0, gt=0, le=86400)
    """Seconds between full-state exchanges with one random dead member (as
    serf's reconnect). This is what heals a partition: both sides learn they
    were declared dead and refute."""

    gossipDeadRetention: float = Field(86400.0, gt=0)
    """Seconds a dead member stays in the table (shown by ``status --cluster``
    and retried for reconnection) before it is forgotten; 24 h, serf's
    reconnect timeout."""

    gossipMaxMembers: int = Field(16384, ge=2, le=1_000_000)
    """Members this node's table holds at most (itself included); a new name
    beyond it is refused, counted in ``hamid_gossip_refused_updates_total{reason="cap"}``
    and logged. Bounds what a holder of the gossip key can make a daemon keep."""

    gossipIdentityResetAfter: float = Field(600.0, ge=0)
    """Seconds a member's identity key must have been silent (the member dead
    or left, nothing signed by it heard) before another self-signed key may
    take its name: how a node whose state directory was wiped comes back
    (README, "Gossip security"). A key changed with ``hamid identity rotate``
    is taken at once."""

    # --- peer API (hamid/peer): commit/release/status asked by other nodes ---

    peerListen: str | None = None
    """``HOST:PORT`` the peer API binds (HTTP; every body sealed with the
    gossip keyring). Unset: no peer API, and no other node can commit here; the
    elected leader needs it on every node it places on. We suggest 7948, next
    to gossip's 7947."""

    peerAdvertise: str | None = None
    """``HOST:PORT`` other nodes dial to reach this node's peer API. Unset:
    ``peerListen``, which must then be a concrete address (a wildcard such as
    0.0.0.0 cannot be dialled)."""

    peerInsecure: bool = False
    """Serve the peer API without a key (plain, unauthenticated frames). Off:
    without ``gossipKeyFile`` the peer API refuses to start, since whoever
    reaches the port could commit and release reservations. Only for tests on
    loopback."""

    peerReplayWindow: float = Field(30.0, ge=1, le=3600)
    """Seconds a request's timestamp may differ from this node's clock. Ids of
    requests inside the window are remembered, so each is accepted once; 30 s
    covers NTP-synchronised clocks and a slow answer many times over while
    keeping the cache small."""

    peerReplayCacheSize: int = Field(65536, ge=16, le=16 * 1024 * 1024)
    """Request ids remembered (about 100 bytes each: 6.5 MB at most). Past it,
    requests are refused as busy, never accepted unchecked; 65536 in a 30 s
    window is over 2000 requests a second, far above a leader's commit rate."""

    peerMaxBodyBytes: int = Field(256 * 1024, ge=4096, le=64 * 1024 * 1024)
    """Largest request body accepted. A commit of an 8-GPU pod with MIG
    placements is ~3 KB; 256 KiB leaves room for large details while bounding
    what a peer can make us buffer and decrypt."""

    peerTimeout: float = Field(5.0, gt=0, le=300)
    """Seconds this node's peer client waits to connect and for each read of
    an answer. A commit is one SQLite transaction (milliseconds); 5 s, as
    gossip's connect timeout, declares a stuck node unreachable quickly enough
    for the leader to place elsewhere."""

    # --- leader election and gossip seeds in Kubernetes (hamid/kube/election.py, seeds.py) ---

    leaderElectionLeaseDuration: int = Field(15, ge=1, le=3600)
    """Seconds a candidate waits, on its own clock, without seeing the Lease
    change before it takes over from a silent leader. 15, client-go's
    default; whole seconds because the Lease's ``leaseDurationSeconds`` is an
    integer. It bounds how long the cluster has no leader after one dies
    without releasing (SIGKILL, a lost node)."""

    leaderElectionRenewDeadline: float = Field(10.0, gt=0, le=3600)
    """Seconds the leader keeps trying to renew before it stops leading (and
    cancels its cluster-wide work). 10, client-go's default; it must be below
    the lease duration so a cut-off leader stops before another may start."""

    leaderElectionRetryPeriod: float = Field(2.0, gt=0, le=600)
    """Seconds between renewals, and between a candidate's tries (jittered up
    to 2.2 times it). 2, client-go's default: one small Lease write every 2 s
    per cluster, and room for several retries within the renew deadline."""

    leaderElectionLeaseName: str = Field("hamid-leader", pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
    """Name of the ``coordination.k8s.io/v1`` Lease the daemons compete for.
    Two hamid installs in one namespace need different names."""

    leaderElectionNamespace: str | None = Field(None, pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    """Namespace of that Lease. Unset: the daemon's own (``POD_NAMESPACE``
    from the downward API), else ``kube-system``, so the Lease sits beside
    the DaemonSet and its RBAC stays namespaced."""

    daemonPodSelector: str = Field("app.kubernetes.io/name=hamid", min_length=1)
    """Label selector of the DaemonSet's pods in their namespace: the gossip
    seeds are listed with it, and the leader removes its label
    ``hamid.io/leader`` from every other pod it matches. The chart's own
    label; change it only with the DaemonSet's labels."""

    gossipSeedsFromPods: bool = True
    """With ``kubernetes`` and ``gossipListen``: at start, join gossip through
    the pod IPs of the other DaemonSet pods (``daemonPodSelector``, listed
    through the API) at ``gossipListen``'s port, so no address is configured
    by hand. Off: only ``gossipJoin`` and ``gossipSeedsService``."""

    gossipSeedsService: str | None = None
    """A headless Service's DNS name (e.g. ``hamid-gossip.kube-system.svc``)
    whose A/AAAA records are the daemons' pod IPs; each becomes a seed at
    ``gossipListen``'s port. Unset: not used. Give the Service
    ``publishNotReadyAddresses: true`` so starting pods find each other."""

    # --- the web view (hamid/web) ---

    webListen: str | None = None
    """``HOST:PORT`` of the web view (the cluster's nodes, GPUs and tenants in a
    browser, live). Unset: off, the default outside Kubernetes, where a port
    nobody asked for should not appear; the chart turns it on. On an address
    other than loopback it needs ``webTokenFile`` (or ``webInsecure``). We
    suggest 127.0.0.1:7949 on a Docker host (an SSH tunnel reaches it), next
    to gossip's 7947 and the peer API's 7948."""

    webTokenFile: str | None = None
    """A file holding the web view's token (one line, at least 16 characters,
    mode 0600). Browsers log in with it once (an HttpOnly, SameSite=Strict
    session cookie follows); scripts send ``Authorization: Bearer``. Unset:
    no token, allowed only on loopback unless ``webInsecure``."""

    webInsecure: bool = False
    """Serve the web view without a token on an address other than loopback.
    Off: such a config is refused, since the page shows every node's address
    and every tenant's name to whoever reaches the port."""

    webMaxConnections: int = Field(32, ge=1, le=4096)
    """Requests in flight at once on the web view, live streams included; past
    it new ones get 503. 32 is a room of people watching plus their what-ifs,
    while bounding the sockets and tasks a crowd (or a script) can hold."""

    webRequestTimeout: float = Field(10.0, gt=0, le=300)
    """Seconds any web request but the live stream may take (reading its
    body included) before it gets 503. A what-if over 1000 nodes plans in well
    under a second; 10 s cuts off slow senders without hurting real use."""

    @model_validator(mode="after")
    def _webhook_tls_pair(self):
        if (self.webhookCertFile is None) != (self.webhookKeyFile is None):
            raise PydanticCustomError(
                "webhook_tls_pair", "set both webhookCertFile and webhookKeyFile, or neither (a self-made CA): got "
                "webhookCertFile={cert}, webhookKeyFile={key}",
                {"cert": repr(self.webhookCertFile), "key": repr(self.webhookKeyFile)})
        return self

    @model_validator(mode="after")
    def _front_group(self):
        if self.frontDir and self.frontGroup is None:
            raise PydanticCustomError(
                "front_group", "frontDir {dir} needs frontGroup: the group hamid front runs as and nothing else "
                "does (on a host, one made for it: groupadd --system hamid-front; the chart sets its front "
                "container's group). There is no default: a shared group such as nogroup (65534) would let "
                "every host service running under it call the daemon's extender and metrics sockets",
                {"dir": self.frontDir})
        return self

    @model_validator(mode="after")
    def _extender_auth(self):
        if (self.extenderClientCertFile is None) != (self.extenderClientKeyFile is None):
            raise PydanticCustomError(
                "extender_client_pair", "set both extenderClientCertFile and extenderClientKeyFile, or neither: "
                "got extenderClientCertFile={cert}, extenderClientKeyFile={key}",
                {"cert": repr(self.extenderClientCertFile), "key": repr(self.extenderClientKeyFile)})
        if self.controlMode == "extender" and self.extenderClientCAFile is None and not self.extenderInsecure:
            raise PydanticCustomError(
                "extender_auth", "controlMode extender needs extenderClientCAFile (the CA of kube-scheduler's "
                "client certificate: only kube-scheduler may bind pods; the chart makes one), or "
                "extenderInsecure: true for a test cluster on one machine", {})
        return self

    @model_validator(mode="after")
    def _leader_election_timing(self):
        from ..config.leasetiming import ElectionConfigError, validate_timing

        try:
            validate_timing(self.leaderElectionLeaseDuration, self.leaderElectionRenewDeadline,
                            self.leaderElectionRetryPeriod)
        except ElectionConfigError as e:
            raise PydanticCustomError("leader_election_timing", "{msg}", {"msg": str(e)}) from None
        return self

    @model_validator(mode="after")
    def _gossip_key_off_loopback(self):
        if self.gossipListen and not self.gossipKeyFile and not self.gossipInsecure:
            from ..netaddr import AddressError, is_loopback, parse_address

            try:
                host, _ = parse_address(self.gossipListen, "gossipListen")
            except AddressError:
                host = self.gossipListen  # not HOST:PORT: the transport names that; never loopback here
            if not is_loopback(host):
                raise PydanticCustomError(
                    "gossip_insecure",
                    "gossip on {listen} without a key: frames would be neither encrypted nor authenticated; "
                    "set gossipKeyFile (--gossip-key-file), or accept that with gossipInsecure: true "
                    "(--gossip-insecure)", {"listen": self.gossipListen})
        return self

    @model_validator(mode="after")
    def _web_token_off_loopback(self):
        if self.webListen and not self.webTokenFile and not self.webInsecure:
            from ..netaddr import AddressError, is_loopback, parse_address

            try:
                host, _ = parse_address(self.webListen, "webListen")
            except AddressError as e:
                raise PydanticCustomError("web_listen", "{msg}", {"msg": str(e)}) from None
            if not is_loopback(host):
                raise PydanticCustomError(
                    "web_insecure",
                    "the web view on {listen} without a token would show the cluster to anyone who reaches it; "
                    "set webTokenFile (--web-token-file), listen on loopback (127.0.0.1:7949), or accept that "
                    "with webInsecure: true", {"listen": self.webListen})
        return self

    @field_validator("stateDir", "kubeletDir", "cdiSpecDir")
    @classmethod
    def _absolute_dir(cls, v, info):
        # Resolved once, at load: the daemon hands these paths to runc, kubelet
        # and CDI, which resolve a relative path against their own directory.
        if not v or "\x00" in v:
            raise ValueError(f"{info.field_name} {v!r}: expected a directory path")
        return os.path.abspath(v)

    @field_validator("peerListen", "peerAdvertise", "webListen")
    @classmethod
    def _peer_address(cls, v, info):
        if v is not None:
            from ..netaddr import AddressError, parse_address

            try:
                parse_address(v, info.field_name)
            except AddressError as e:
                raise ValueError(str(e)) from None
        return v
