"""request: one request model for Kubernetes pods and Docker containers.

Owns the request types (:mod:`.model`), the parsers that turn a Pod manifest
(:mod:`.kube`) or a Docker container's ``HAMI_VISIBLE_DEVICES`` and
``HAMI_VGPU_SPEC`` (:mod:`.docker`) into them, and size parsing
(:mod:`.quantity`). Parsers are pure and raise only :class:`RequestError`,
whose message names the field, the bad value and what is accepted.
"""

from .docker import parse_docker_env, VGPU_SPEC_FORMS, VISIBLE_DEVICES_FORMS
from .kube import parse_pod
from .model import ContainerRequest, Defaults, GpuRequest, Request, RequestError

__all__ = [
    "ContainerRequest",
    "Defaults",
    "GpuRequest",
    "Request",
    "RequestError",
    "VGPU_SPEC_FORMS",
    "VISIBLE_DEVICES_FORMS",
    "parse_docker_env",
    "parse_pod",
]
