"""Kubernetes on the node: hamid as kubelet's device plugin."""
