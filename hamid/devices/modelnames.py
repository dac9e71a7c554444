"""GPU model names as configs write them, matched to the name a GPU reports.

HAMi's ``migProfileAllowlist`` names models the way its chart presets do
(``A100-SXM4-40GB``, ``H100-SXM5-80GB``), while NVML reports ``NVIDIA A100-SXM4-40GB``
or ``NVIDIA H100 80GB HBM3``: the same card, and no substring of one another.
A model matches a GPU when it is a part of the GPU's name that starts and
ends at a word's edge (so names copied from ``nvidia-smi`` keep working, and
``H20`` does not take an ``H200``'s profiles), or when, in words
(upper case, split at anything not a letter or digit), every word of the model
is a word of the GPU's name, leaving out the vendor (``NVIDIA``, ``TESLA``), the
board form (``SXM4``, ``SXM5``, ``PCIE``) and the memory kind (``HBM3``), which
NVML names inconsistently, and with a memory size (``80GB``) matched against
the GPU's memory instead of its name, within a few percent: NVML reports
what the driver leaves usable (79.6 GiB on an 80 GB card).
"""

from __future__ import annotations

import re

_WORD = re.compile(r"[A-Z0-9]+", re.ASCII)
_IGNORED = re.compile(r"NVIDIA|TESLA|SXM[0-9]*|PCIE|HBM[0-9]*E?|GDDR[0-9]*X?", re.ASCII)
_MEMORY = re.compile(r"([0-9]{1,4})GB", re.ASCII)


def _words(name: str) -> list[str]:
    return _WORD.findall(name.upper())


def _memory_fits(gb: int, memory_mib: int) -> bool:
    gib = memory_mib / 1024
    return abs(gib - gb) <= max(2.0, 0.06 * gb)


def model_matches(model: str, gpu_name: str, memory_mib: int) -> bool:
    """Does ``model`` (a config's model name) name the GPU called ``gpu_name`` with ``memory_mib``?"""
    up, name = model.strip().upper(), gpu_name.upper()
    if not up:
        return False
    for whole in (name, "NVIDIA-" + name):
        if re.search(r"(?<![A-Z0-9])" + re.escape(up) + r"(?![A-Z0-9])", whole):
            return True
    have = set(_words(name))
    wanted = [w for w in _words(up) if not _IGNORED.fullmatch(w)]
    if not wanted:
        return False
    for w in wanted:
        m = _MEMORY.fullmatch(w)
        if m and w not in have:
            if not _memory_fits(int(m.group(1)), memory_mib):
                return False
        elif w not in have:
            return False
    return True


# MIG-capable GPUs as NVML names them, with their memory in GB: what ``hamid
# config from-hami`` checks an allowlist's model names against when no node is
# at hand (the catalog's simulated models, plus the other boards HAMi's chart
# presets name).
KNOWN_MIG_GPUS: tuple[tuple[str, int], ...] = (
    ("NVIDIA A30", 24), ("NVIDIA A100-SXM4-40GB", 40), ("NVIDIA A100-PCIE-40GB", 40),
    ("NVIDIA A100-SXM4-80GB", 80), ("NVIDIA A100 80GB PCIe", 80), ("NVIDIA H100 80GB HBM3", 80),
    ("NVIDIA H100 PCIe", 80), ("NVIDIA H100 NVL", 94), ("NVIDIA H20", 96), ("NVIDIA H200", 141),
    ("NVIDIA H200 NVL", 141), ("NVIDIA B200", 180), ("NVIDIA RTX PRO 6000 Blackwell Server Edition", 96),
)


def known_gpus_named(model: str) -> list[str]:
    """The names of :data:`KNOWN_MIG_GPUS` that ``model`` matches."""
    return [name for name, gb in KNOWN_MIG_GPUS if model_matches(model, name, gb * 1024)]
