"""The catalog of real GPU models that the simulated backend can stand up.

Memory, SM counts and MIG profile tables are facts about real cards (NVIDIA's
MIG user guide, supported profiles). The H100 table is as read through NVML
on a real H100 80GB HBM3. Memory per profile is NVML's ``memorySizeMB`` where
known, otherwise the GiB figure ``nvidia-smi mig -lgip`` prints, in MiB. The
H200's per-profile memory and SMs are scaled from the H100 (no H200 dump was
available); its names, IDs and placements are NVIDIA's.

``nvlinks`` is what ``nvidia-smi topo -m`` shows between two GPUs of the
SXM boards these models come on (NV12 on HGX A100, NV18 on HGX H100/H200,
every pair through NVSwitch); PCIe cards (A30, T4) have none (an A30 NVLink
bridge is optional and not assumed). The simulated backend derives HAMi's
link scores from it.

Keys are what ``--simulate MODEL[:COUNT]`` accepts; matching is
case-insensitive and a few common aliases are accepted.
"""

from __future__ import annotations

from dataclasses import dataclass

from .types import MigPlacement, MigProfile


@dataclass(frozen=True)
class Model:
    key: str
    nvml_name: str
    memory_mib: int
    sm_count: int
    memory_slices: int = 0
    compute_slices: int = 0
    mig_profiles: tuple[MigProfile, ...] = ()
    nvlinks: int = 0  # NVLinks between any two of these GPUs on their (NVSwitch) board; 0: PCIe only

    @property
    def mig_capable(self) -> bool:
        return bool(self.mig_profiles)


def _spans(starts, size):
    return tuple(MigPlacement(s, size) for s in starts)


# Placement grids of 8-memory-slice / 7-compute-slice GPUs (A100, H100, H200).
_GRID8 = {
    # NVML profile index name: (profile id, max instances, placements, compute slices)
    "1_SLICE": (19, 7, _spans(range(7), 1), 1),
    "1_SLICE_REV1": (20, 1, _spans(range(7), 1), 1),
    "1_SLICE_REV2": (15, 4, _spans((0, 2, 4, 6), 2), 1),
    "2_SLICE": (14, 3, _spans((0, 2, 4), 2), 2),
    "3_SLICE": (9, 2, _spans((0, 4), 4), 3),
    "4_SLICE": (5, 1, _spans((0,), 4), 4),
    "7_SLICE": (0, 1, _spans((0,), 8), 7),
}


def _table8(rows):
    """rows: (grid key, name, memory MiB, SMs)."""
    out = []
    for key, name, mem, sms in rows:
        pid, count, spans, slices = _GRID8[key]
        out.append(MigProfile(name, pid, mem, slices, count, sms, spans))
    return tuple(out)


A100_40 = Model(
    "A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB", 40960, 108, 8, 7,
    _table8([
        ("1_SLICE", "1g.5gb", 4864, 14),
        ("1_SLICE_REV1", "1g.5gb+me", 4864, 14),
        ("1_SLICE_REV2", "1g.10gb", 9856, 14),
        ("2_SLICE", "2g.10gb", 9856, 28),
        ("3_SLICE", "3g.20gb", 19968, 42),
        ("4_SLICE", "4g.20gb", 19968, 56),
        ("7_SLICE", "7g.40gb", 40192, 98),
    ]),
    nvlinks=12,  # HGX A100: NV12 between every pair (third-generation NVLink through NVSwitch)
)

A100_80 = Model(
    "A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", 81920, 108, 8, 7,
    _table8([
        ("1_SLICE", "1g.10gb", 9728, 14),
        ("1_SLICE_REV1", "1g.10gb+me", 9728, 14),
        ("1_SLICE_REV2", "1g.20gb", 19968, 14),
        ("2_SLICE", "2g.20gb", 19968, 28),
        ("3_SLICE", "3g.40gb", 40192, 42),
        ("4_SLICE", "4g.40gb", 40192, 56),
        ("7_SLICE", "7g.80gb", 80640, 98),
    ]),
    nvlinks=12,
)

H100_80 = Model(
    "H100-80GB-HBM3", "NVIDIA H100 80GB HBM3", 81559, 132, 8, 7,
    _table8([
        ("1_SLICE", "1g.10gb", 9984, 16),
        ("1_SLICE_REV1", "1g.10gb+me", 9984, 16),
        ("1_SLICE_REV2", "1g.20gb", 20096, 26),
        ("2_SLICE", "2g.20gb", 20096, 32),
        ("3_SLICE", "3g.40gb", 40448, 60),
        ("4_SLICE", "4g.40gb", 40448, 64),
        ("7_SLICE", "7g.80gb", 81152, 132),
    ]),
    nvlinks=18,  # HGX H100: NV18 between every pair (fourth-generation NVLink through NVSwitch)
)

H200_141 = Model(
    "H200-141GB", "NVIDIA H200", 143771, 132, 8, 7,
    _table8([
        ("1_SLICE", "1g.18gb", 17408, 16),
        ("1_SLICE_REV1", "1g.18gb+me", 17408, 16),
        ("1_SLICE_REV2", "1g.35gb", 35328, 26),
        ("2_SLICE", "2g.35gb", 35328, 32),
        ("3_SLICE", "3g.71gb", 71168, 60),
        ("4_SLICE", "4g.71gb", 71168, 64),
        ("7_SLICE", "7g.141gb", 142336, 132),
    ]),
    nvlinks=18,  # HGX H200: NV18, as the H100 board
)

A30_24 = Model(
    "A30", "NVIDIA A30", 24576, 56, 4, 4,
    (
        MigProfile("1g.6gb", 14, 5949, 1, 4, 14, _spans(range(4), 1)),
        MigProfile("1g.6gb+me", 21, 5949, 1, 1, 14, _spans(range(4), 1)),
        MigProfile("2g.12gb", 5, 11971, 2, 2, 28, _spans((0, 2), 2)),
        MigProfile("2g.12gb+me", 6, 11971, 2, 1, 28, _spans((0, 2), 2)),
        MigProfile("4g.24gb", 0, 24259, 4, 1, 56, _spans((0,), 4)),
    ),
)

T4 = Model("T4", "Tesla T4", 15360, 40)

MODELS: dict[str, Model] = {m.key.lower(): m for m in (A100_40, A100_80, A30_24, H100_80, H200_141, T4)}

ALIASES = {
    "a100": "a100-sxm4-40gb",
    "a100-40gb": "a100-sxm4-40gb",
    "a100-80gb": "a100-sxm4-80gb",
    "h100": "h100-80gb-hbm3",
    "h100-80gb": "h100-80gb-hbm3",
    "h200": "h200-141gb",
    "tesla-t4": "t4",
    "a30-24gb": "a30",
}


def lookup(name: str) -> Model | None:
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    return MODELS.get(key)


def model_keys() -> list[str]:
    return [m.key for m in MODELS.values()]
