"""The kubelet API protos: generated code current, wire shape exactly kubelet's.

Wire compatibility with a real kubelet depends only on the package, the
service and method names, and each field's number and type. The expected
tables below are hard-coded from the project's reference notes on kubelet's
device plugin API v1beta1 (its field table) and on the pod-resources API v1
(its List / Get / GetAllocatableResources table); they are not read at test
time because the notes are not part of every clone.
"""

from __future__ import annotations

import filecmp
import shutil
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from google.protobuf.descriptor import FieldDescriptor

from hamid.kubelet.api import deviceplugin_pb2, podresources_pb2

ROOT = Path(__file__).resolve().parents[2]
API = ROOT / "hamid" / "kubelet" / "api"
GENERATED = [
    f"{stem}{suffix}"
    for stem in ("deviceplugin", "podresources")
    for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
]

# message -> {field: (number, type)}; type is a scalar name, a message name,
# "repeated X", or "map<string,string>".
DEVICEPLUGIN_MESSAGES = {
    "Empty": {},
    "DevicePluginOptions": {
        "pre_start_required": (1, "bool"),
        "get_preferred_allocation_available": (2, "bool"),
    },
    "RegisterRequest": {
        "version": (1, "string"),
        "endpoint": (2, "string"),
        "resource_name": (3, "string"),
        "options": (4, "DevicePluginOptions"),
    },
    "ListAndWatchResponse": {"devices": (1, "repeated Device")},
    "TopologyInfo": {"nodes": (1, "repeated NUMANode")},
    "NUMANode": {"ID": (1, "int64")},
    "Device": {"ID": (1, "string"), "health": (2, "string"), "topology": (3, "TopologyInfo")},
    "PreStartContainerRequest": {"devices_ids": (1, "repeated string")},
    "PreStartContainerResponse": {},
    "PreferredAllocationRequest": {
        "container_requests": (1, "repeated ContainerPreferredAllocationRequest"),
    },
    "ContainerPreferredAllocationRequest": {
        "available_deviceIDs": (1, "repeated string"),
        "must_include_deviceIDs": (2, "repeated string"),
        "allocation_size": (3, "int32"),
    },
    "PreferredAllocationResponse": {
        "container_responses": (1, "repeated ContainerPreferredAllocationResponse"),
    },
    "ContainerPreferredAllocationResponse": {"deviceIDs": (1, "repeated string")},
    "AllocateRequest": {"container_requests": (1, "repeated ContainerAllocateRequest")},
    "ContainerAllocateRequest": {"devices_ids": (1, "repeated string")},
    "CDIDevice": {"name": (1, "string")},
    "AllocateResponse": {"container_responses": (1, "repeated ContainerAllocateResponse")},
    "ContainerAllocateResponse": {
        "envs": (1, "map<string,string>"),
        "mounts": (2, "repeated Mount"),
        "devices": (3, "repeated DeviceSpec"),
        "annotations": (4, "map<string,string>"),
        "cdi_devices": (5, "repeated CDIDevice"),
    },
    "Mount": {"container_path": (1, "string"), "host_path": (2, "string"), "read_only": (3, "bool")},
    "DeviceSpec": {
        "container_path": (1, "string"),
        "host_path": (2, "string"),
        "permissions": (3, "string"),
    },
}

# service -> {method: (request, response, server streaming)}
DEVICEPLUGIN_SERVICES = {
    "Registration": {"Register": ("RegisterRequest", "Empty", False)},
    "DevicePlugin": {
        "GetDevicePluginOptions": ("Empty", "DevicePluginOptions", False),
        "ListAndWatch": ("Empty", "ListAndWatchResponse", True),
        "GetPreferredAllocation": ("PreferredAllocationRequest", "PreferredAllocationResponse", False),
        "Allocate": ("AllocateRequest", "AllocateResponse", False),
        "PreStartContainer": ("PreStartContainerRequest", "PreStartContainerResponse", False),
    },
}

# The pod-resources messages whose fields the reference states; the memory
# message's inner fields and ClaimResource.share_id are not stated there and
# are left out of the proto (protobuf keeps them as unknown fields).
PODRESOURCES_MESSAGES = {
    "ListPodResourcesRequest": {},
    "ListPodResourcesResponse": {"pod_resources": (1, "repeated PodResources")},
    "AllocatableResourcesRequest": {},
    "AllocatableResourcesResponse": {
        "devices": (1, "repeated ContainerDevices"),
        "cpu_ids": (2, "repeated int64"),
        "memory": (3, "repeated ContainerMemory"),
    },
    "GetPodResourcesRequest": {"pod_name": (1, "string"), "pod_namespace": (2, "string")},
    "GetPodResourcesResponse": {"pod_resources": (1, "PodResources")},
    "PodResources": {
        "name": (1, "string"),
        "namespace": (2, "string"),
        "containers": (3, "repeated ContainerResources"),
        "cpu_ids": (4, "repeated int64"),
        "memory": (5, "repeated ContainerMemory"),
    },
    "ContainerResources": {
        "name": (1, "string"),
        "devices": (2, "repeated ContainerDevices"),
        "cpu_ids": (3, "repeated int64"),
        "memory": (4, "repeated ContainerMemory"),
        "dynamic_resources": (5, "repeated DynamicResource"),
    },
    "ContainerDevices": {
        "resource_name": (1, "string"),
        "device_ids": (2, "repeated string"),
        "topology": (3, "TopologyInfo"),
    },
    "TopologyInfo": {"nodes": (1, "repeated NUMANode")},
    "NUMANode": {"ID": (1, "int64")},
    "ContainerMemory": {},
    "DynamicResource": {
        "claim_name": (2, "string"),
        "claim_namespace": (3, "string"),
        "claim_resources": (4, "repeated ClaimResource"),
    },
    "ClaimResource": {
        "cdi_devices": (1, "repeated CDIDevice"),
        "driver_name": (2, "string"),
        "pool_name": (3, "string"),
        "device_name": (4, "string"),
    },
    "CDIDevice": {"name": (1, "string")},
}

PODRESOURCES_SERVICES = {
    "PodResourcesLister": {
        "List": ("ListPodResourcesRequest", "ListPodResourcesResponse", False),
        "GetAllocatableResources": ("AllocatableResourcesRequest", "AllocatableResourcesResponse", False),
        "Get": ("GetPodResourcesRequest", "GetPodResourcesResponse", False),
    },
}

SCALARS = {
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_BOOL: "bool",
    FieldDescriptor.TYPE_INT64: "int64",
    FieldDescriptor.TYPE_INT32: "int32",
    FieldDescriptor.TYPE_UINT64: "uint64",
}


def field_type(field: FieldDescriptor, package: str) -> str:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        msg = field.message_type
        if msg.GetOptions().map_entry:
            key, value = (field_type(msg.fields_by_name[n], package) for n in ("key", "value"))
            return f"map<{key},{value}>"
        assert msg.full_name.startswith(package + "."), f"{field.full_name} refers to {msg.full_name} outside {package}"
        name = msg.name
    else:
        name = SCALARS.get(field.type, f"type#{field.type}")
    return f"repeated {name}" if field.is_repeated else name


def shape(module, package: str) -> tuple[dict, dict]:
    fd = module.DESCRIPTOR
    assert fd.package == package
    messages = {
        name: {f.name: (f.number, field_type(f, package)) for f in msg.fields}
        for name, msg in fd.message_types_by_name.items()
    }
    services = {
        name: {
            m.name: (m.input_type.name, m.output_type.name, m.server_streaming)
            for m in svc.methods
        }
        for name, svc in fd.services_by_name.items()
    }
    for svc in fd.services_by_name.values():
        for m in svc.methods:
            assert not m.client_streaming, m.full_name
    return messages, services


@pytest.mark.parametrize(
    "module, package, messages, services",
    [
        (deviceplugin_pb2, "v1beta1", DEVICEPLUGIN_MESSAGES, DEVICEPLUGIN_SERVICES),
        (podresources_pb2, "v1", PODRESOURCES_MESSAGES, PODRESOURCES_SERVICES),
    ],
    ids=["deviceplugin", "podresources"],
)
def test_every_message_and_method_has_kubelets_wire_shape(module, package, messages, services):
    got_messages, got_services = shape(module, package)
    assert sorted(got_messages) == sorted(messages)
    for name, fields in messages.items():
        assert got_messages[name] == fields, f"{package}.{name}"
    assert got_services == services


def test_method_paths_are_kubelets():
    # The full method names gRPC puts on the wire.
    paths = {
        f"/{m.full_name.rsplit('.', 1)[0]}/{m.name}"
        for mod in (deviceplugin_pb2, podresources_pb2)
        for svc in mod.DESCRIPTOR.services_by_name.values()
        for m in svc.methods
    }
    assert paths == {
        "/v1beta1.Registration/Register",
        "/v1beta1.DevicePlugin/GetDevicePluginOptions",
        "/v1beta1.DevicePlugin/ListAndWatch",
        "/v1beta1.DevicePlugin/GetPreferredAllocation",
        "/v1beta1.DevicePlugin/Allocate",
        "/v1beta1.DevicePlugin/PreStartContainer",
        "/v1.PodResourcesLister/List",
        "/v1.PodResourcesLister/GetAllocatableResources",
        "/v1.PodResourcesLister/Get",
    }


def pinned_grpcio_tools() -> str:
    import tomllib

    from packaging.requirements import Requirement

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    for line in extra:
        req = Requirement(line)
        if req.name == "grpcio-tools":
            (spec,) = req.specifier
            assert spec.operator == "==", f"grpcio-tools must be pinned exactly (==), not {spec}"
            return spec.version
    raise AssertionError("pyproject.toml's test extra does not pin grpcio-tools")


def test_generated_code_is_what_make_proto_makes_now(tmp_path):
    pin = pinned_grpcio_tools()
    try:
        have = version("grpcio-tools")
    except PackageNotFoundError:
        pytest.fail(f"grpcio-tools is not installed; `pip install -e '.[test]'` installs grpcio-tools=={pin}")
    assert have == pin, f"grpcio-tools {have} is installed; the generated code is made with the pinned {pin}"
    make = shutil.which("make")
    assert make, "make is needed to run the proto target"
    subprocess.run(
        [make, "-s", "-C", str(ROOT), "proto", f"PROTO_OUT={tmp_path}", f"PY={sys.executable}"],
        check=True,
        capture_output=True,
    )
    fresh = tmp_path / "hamid" / "kubelet" / "api"
    assert sorted(p.name for p in fresh.iterdir()) == sorted(GENERATED)
    stale = [name for name in GENERATED if not filecmp.cmp(fresh / name, API / name, shallow=False)]
    assert not stale, f"generated code is stale, run `make proto`: {stale}"
