"""Stage timestamps inside a ``hamid run`` process, for the benches (``bench/allocate.py --trace FILE``).

Not part of hamid: a measuring aid. Python imports ``sitecustomize`` at start-up from ``PYTHONPATH``;
this one does nothing unless ``HAMID_STAGETRACE`` names a file and the process is ``hamid.cli.main``.
Then it appends one line per event to that file::

    <what> <start> <end> <thread name> [<extra>]

times from ``time.perf_counter`` (CLOCK_MONOTONIC: comparable between processes of one machine), for:
the calls of :data:`WRAPPED` (the PreStartContainer path, the ledger, the daemon's periodic passes,
the pod informer), generation-1 and -2 garbage collections (``gc1``/``gc2``, extra: objects
collected) and every module imported after start-up (``IMPORT``, extra: its name).
``bench/stagetrace/report.py`` lines them up against the bench's own timed calls.
"""

import os
import sys

OUT = os.environ.get("HAMID_STAGETRACE")

# module -> (class, methods): what is timed
WRAPPED = {
    "hamid.kubelet.admission": ("PodAdmission", ("prestart", "_reserve")),
    "hamid.kubelet.pods": ("PodDirectory", ("allocations", "holder", "get_pod", "event")),
    "hamid.kubelet.face": ("KubeletFace", ("_prestart", "_preferred", "_on_pod", "_pod_alive")),
    "hamid.node.core": ("NodeCore", ("admit", "prepare", "write_container_files", "release", "reconcile",
                                     "priority_pass", "drain_released", "_container_files")),
    "hamid.ledger.store": ("Ledger", ("list", "in_state", "get", "view", "reserve", "allocate", "begin_release",
                                      "finish_release", "transition")),
    "hamid.kube.informer": ("Informer", ("_notify",)),
}


def _install(out_path: str) -> None:
    import functools
    import gc
    import importlib.abc
    import importlib.machinery
    import threading
    import time

    out = open(out_path, "a", buffering=1)
    pc = time.perf_counter
    lock = threading.Lock()

    def rec(what, t0, t1, extra=""):
        with lock:
            out.write(f"{what} {t0:.6f} {t1:.6f} {threading.current_thread().name.replace(' ', '_')} {extra}\n")

    started = {}

    def on_gc(phase, info):
        if phase == "start":
            started["t"] = pc()
        elif info["generation"] >= 1 and "t" in started:
            rec(f"gc{info['generation']}", started.pop("t"), pc(), str(info.get("collected")))

    gc.callbacks.append(on_gc)

    def wrap(cls, name):
        fn = getattr(cls, name, None)
        if fn is None:  # renamed since this list was written: say so in the trace, time the rest
            rec("MISSING", pc(), pc(), f"{cls.__name__}.{name}")
            return

        @functools.wraps(fn)
        def timed(*a, **kw):
            t0 = pc()
            try:
                return fn(*a, **kw)
            finally:
                rec(f"{cls.__name__}.{name}", t0, pc())

        setattr(cls, name, timed)

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            rec("IMPORT", pc(), pc(), name)
            if name not in WRAPPED:
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None:
                return spec
            exec_module = spec.loader.exec_module

            def exec_and_wrap(module, exec_module=exec_module, name=name):
                exec_module(module)
                cls_name, methods = WRAPPED[name]
                for m in methods:
                    wrap(getattr(module, cls_name), m)

            spec.loader.exec_module = exec_and_wrap
            return spec

    sys.meta_path.insert(0, Finder())


def _is_daemon() -> bool:
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return b"hamid.cli.main" in f.read()
    except OSError:
        return False


if OUT and _is_daemon():
    _install(OUT)
