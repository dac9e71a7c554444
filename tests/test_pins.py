"""The minimum versions pinned in pyproject.toml are the ones the code needs.

Each entry names a package, the first version with what hamid uses, and a
probe of that feature. The test fails when the pin is lower than what the
code needs (a user installing the minimum would get a broken daemon), when
the installed version is below the pin, or when the feature is missing.
"""

from __future__ import annotations

import inspect
import tomllib
from importlib.metadata import version
from pathlib import Path

import cbor2
import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from hamid.errors import HamidError
from hamid import cborcheck
from hamid.gossip import codec

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def _anyio_abandon_on_cancel() -> None:
    import anyio.to_thread

    assert "abandon_on_cancel" in inspect.signature(anyio.to_thread.run_sync).parameters


def _generated_grpc() -> str:
    """The grpcio the generated device-plugin code demands (it refuses an older one at import)."""
    from hamid.kubelet.api import deviceplugin_pb2_grpc, podresources_pb2_grpc  # noqa: F401 - the probe

    return deviceplugin_pb2_grpc.GRPC_GENERATED_VERSION


def _generated_protobuf() -> str:
    """The protobuf runtime the generated *_pb2.py demand: the version in their runtime check."""
    import re

    text = (Path(__file__).resolve().parents[1] / "hamid/kubelet/api/deviceplugin_pb2.py").read_text()
    m = re.search(r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+)",
                  text)
    assert m, "the generated deviceplugin_pb2.py has no protobuf runtime check"
    return ".".join(m.groups())


def _probe_generated() -> None:
    from hamid.kubelet.api import deviceplugin_pb2, podresources_pb2  # noqa: F401 - importing is the probe


# package -> (first version with the feature, probe of the feature)
NEEDED = {
    "grpcio": (_generated_grpc(), _probe_generated),  # the generated gRPC stubs of hamid/kubelet/api
    "protobuf": (_generated_protobuf(), _probe_generated),  # the generated messages
    "cbor2": (cborcheck.CBOR2_MIN, cborcheck.check_cbor2),  # loads(max_depth=): the gossip codec and the peer API
    "anyio": ("4.1.0", _anyio_abandon_on_cancel),  # to_thread.run_sync(abandon_on_cancel=): metrics scrapes
}


def pins() -> dict[str, Version]:
    deps = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    out = {}
    for d in deps:
        req = Requirement(d)
        lows = [Version(s.version) for s in req.specifier if s.operator == ">="]
        if lows:
            out[req.name.lower()] = max(lows)
    return out


@pytest.mark.parametrize("package", sorted(NEEDED))
def test_the_pinned_minimum_has_what_the_code_uses(package):
    needed, probe = NEEDED[package]
    pinned = pins().get(package)
    assert pinned is not None, f"pyproject.toml pins no minimum for {package}; the code needs >= {needed}"
    assert pinned >= Version(needed), f"pyproject.toml pins {package}>={pinned}; the code needs >= {needed}"
    assert Version(version(package)) >= pinned
    probe()


def test_a_cbor2_without_max_depth_stops_the_codec_instead_of_dropping_frames(monkeypatch):
    real = cbor2.loads

    def loads_5_8(data, **kw):  # cbor2 5.8's loads: no max_depth keyword
        if "max_depth" in kw:
            raise TypeError("'max_depth' is an invalid keyword argument for this function")
        return real(data, **kw)

    monkeypatch.setattr(cbor2, "loads", loads_5_8)
    with pytest.raises(HamidError, match=r"cbor2 \S+ has no max_depth .* install cbor2>=5\.9\.0"):
        codec.Codec(None, 4096)


def test_a_cbor2_that_ignores_max_depth_stops_the_codec(monkeypatch):
    real = cbor2.loads
    monkeypatch.setattr(cbor2, "loads", lambda data, max_depth=None, **kw: real(data, **kw))
    with pytest.raises(HamidError, match="no depth limit"):
        codec.Codec(None, 4096)
