"""What a reservation records beside its decision: typed fields, each with one writer.

The ledger stores these as one JSON object per row (the ``details`` column;
the keys below are the stored names, unchanged from earlier versions, so a
ledger written by one version reads in the next). Nothing a caller sends is
stored as it came: callers build a :class:`Details` (remote callers through
:func:`hamid.node.callers.caller_details`, which accepts ``placed_by`` and
``attempt`` alone), and no field names a path the node acts on except
``extra_files``, which the node itself writes and release deletes only inside
a directory a face registered (:meth:`hamid.node.core.NodeCore.own_file_dir`).

Fields, by writer:

- the Docker face and runtime: ``container_id`` (``id``), ``runc_root`` and
  ``bundle`` (absolute paths, read for liveness only), ``display_name``
  (``name``: ``docker run --name``);
- the kubelet face: ``container_slots`` (container -> the device IDs kubelet
  gave it), ``extra_files`` (its CDI specs for the reservation);
- the control plane (through the peer API): ``placed_by``, ``attempt``; the
  receiving node: ``placer`` (the identity of the leader that placed it);
- the node core: ``mps_failure`` (why the GPU's MPS server failed under it).

Earlier versions also stored ``slots`` (time slots per device); the ledger
removes that key when it opens (:data:`hamid.ledger.store.DROPPED_DETAILS`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

# field name -> the key it is stored under (where they differ)
_STORED = {"container_id": "id", "display_name": "name"}
_FROM_STORED = {v: k for k, v in _STORED.items()}


@dataclass(frozen=True)
class Details:
    container_id: str = ""
    runc_root: str = ""
    bundle: str = ""
    display_name: str = ""
    container_slots: dict[str, str] = field(default_factory=dict)  # container -> its slot's name
    extra_files: tuple[str, ...] = ()
    placed_by: str = ""
    attempt: str = ""
    placer: str = ""
    mps_failure: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The stored (and wire) form: set fields only, under their stored keys."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v:
                out[_STORED.get(f.name, f.name)] = list(v) if isinstance(v, tuple) else v
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "Details":
        """A stored row's details. Keys of no field (a newer version's) are not kept."""
        known = {f.name for f in fields(cls)}
        kw: dict[str, Any] = {}
        for k, v in (d or {}).items():
            name = _FROM_STORED.get(k, k)
            if name in known and v:
                kw[name] = tuple(v) if name == "extra_files" else v
        return cls(**kw)

    def merged(self, other: "Details | None") -> "Details":
        """These details with every field ``other`` sets taken from it."""
        if other is None:
            return self
        return replace(self, **{f.name: getattr(other, f.name) for f in fields(other) if getattr(other, f.name)})
