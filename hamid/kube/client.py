"""The Kubernetes API client the daemon's faces share."""

from __future__ import annotations

from ..errors import HamidError


def api_client(kubeconfig: str | None):
    """The Kubernetes API client: ``kubeconfig`` if given, else in-cluster config."""
    from kubernetes import client, config

    cfg = client.Configuration()
    # Faces call from several worker threads at once (the leader's placements, the pod watch, the
    # device plugin): urllib3's default pool of 4 connections would serialise them.
    cfg.connection_pool_maxsize = 32
    try:
        if kubeconfig:
            return config.new_client_from_config(config_file=kubeconfig, client_configuration=cfg)
        config.load_incluster_config(client_configuration=cfg)
        return client.ApiClient(cfg)
    except Exception as e:  # the library raises several types for a missing or bad config
        where = kubeconfig or "the in-cluster service account (KUBERNETES_SERVICE_HOST)"
        raise HamidError(f"cannot configure the Kubernetes client from {where}: {e}") from None
