"""The DRA face: hamid as a Dynamic Resource Allocation driver (``gpu.hamid.io``).

The same daemon that serves the device plugin and Docker publishes its node's
GPUs as a ResourceSlice pool (:mod:`.slices`), registers with kubelet's plugin
watcher and answers ``NodePrepareResources`` / ``NodeUnprepareResources``
(:mod:`.plugin`): a claim's allocation becomes a reservation in the node's one
ledger (:mod:`.claims`, :mod:`.prepare`), with the limits file, shim, region
and MPS pipe the device plugin gives, handed to the runtime as CDI devices.
"""
