"""Argument parsing for ``hamid`` and the mapping of errors to exit codes.

Exit codes: 0 success, 1 a hamid error (the message says what and why; for
``plan``, some item did not fit), 2 bad command-line usage, 130 interrupted
(Ctrl-C), 141 the reader of our output went away (``| head``), as for a
program killed by SIGPIPE. No user error ends in a traceback: a permission
refused (the state directory, sockets and ledger are root's) says to run as
root.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .. import __version__
from ..errors import HamidError

DEFAULT_STATE_DIR = "/var/lib/hamid"


def _plan_formats() -> str:
    """``plan --help``'s text: the cluster and workload file formats, from the
    planner's own docstring (read, not imported: every command builds the parser)."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec("hamid.cluster.plan")
    with open(spec.origin) as f:  # type: ignore[union-attr,arg-type]
        doc = ast.get_docstring(ast.parse(f.read())) or ""
    return doc.replace("``", "`") + "\n\nExamples: docs/examples/ (cluster.yaml, workload.yaml, workload-refused.yaml)."


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hamid", description="GPU sharing without a central scheduler.")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run the node daemon in the foreground")
    run.add_argument("--config", help="YAML config file (see README); flags below override it")
    run.add_argument("--state-dir", help=f"ledger, sockets and container dirs (default {DEFAULT_STATE_DIR})")
    run.add_argument("--metrics-port", type=int, help="Prometheus port (default 9394; 0 disables)")
    run.add_argument("--legacy-metrics", action="store_true", default=None,
                     help="also export HAMi's pre-2.9 metric names (legacyMetrics)")
    run.add_argument("--node-name", help="this node's name (default $NODE_NAME, then the host name)")
    run.add_argument("--simulate", metavar="MODEL[:COUNT],...",
                     help="simulated GPUs instead of NVML, e.g. H100-80GB-HBM3:2,T4")
    run.add_argument("--log-format", choices=["auto", "json", "console"])
    run.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    run.add_argument("--kubernetes", action="store_true", default=None,
                     help="be kubelet's device plugin and follow this node's pods (kubernetes)")
    run.add_argument("--kubeconfig", metavar="FILE", help="API server credentials (default: in-cluster)")
    run.add_argument("--kubelet-dir", metavar="DIR", help="kubelet's root directory (default /var/lib/kubelet)")
    run.add_argument("--gossip-listen", metavar="HOST:PORT", help="join the gossip group: listen here (gossipListen)")
    run.add_argument("--gossip-advertise", metavar="HOST:PORT", help="the address peers dial (default: --gossip-listen)")
    run.add_argument("--join", metavar="HOST:PORT[,...]", help="seed members to join through (gossipJoin)")
    run.add_argument("--gossip-key-file", metavar="FILE",
                     help="keyring: one base64 AES key (16/24/32 bytes) per line, the first sends (gossipKeyFile)")
    run.add_argument("--gossip-insecure", action="store_true", default=None,
                     help="allow gossip without a key off loopback: unencrypted, unauthenticated (gossipInsecure)")
    run.add_argument("--peer-listen", metavar="HOST:PORT", help="serve the peer API here (peerListen)")
    run.add_argument("--peer-advertise", metavar="HOST:PORT",
                     help="the address other nodes dial for the peer API (default: --peer-listen; peerAdvertise)")

    run.add_argument("--web-listen", metavar="HOST:PORT",
                     help="serve the web view here, e.g. 127.0.0.1:7949 (webListen; off by default)")
    run.add_argument("--web-token-file", metavar="FILE", help="the web view's token, one line (webTokenFile)")

    wh = sub.add_parser("front", aliases=["webhook"],
                        help="serve the webhook, extender and metrics for a daemon, unprivileged (the chart's "
                             "front container; see frontDir)")
    wh.add_argument("--config", help="the daemon's config file (webhook*, extender*, metrics*, frontDir, node defaults)")
    wh.add_argument("--node-name", help="this node's name (default: NODE_NAME, else the host name)")
    wh.add_argument("--log-format", choices=["auto", "json", "console"], help="logFormat")

    st = sub.add_parser("status", help="this node's GPUs and what is reserved on them")
    st.add_argument("--state-dir", help=f"the daemon's state dir (default {DEFAULT_STATE_DIR})")
    st.add_argument("--config", help="read stateDir from this config file")
    st.add_argument("-o", "--output", choices=["table", "json"], default="table")
    st.add_argument("--cluster", action="store_true",
                    help="every gossip member (alive, suspect, dead) with its GPUs and their use")

    ins = sub.add_parser("inspect", help="what one container or pod was given: GPUs, limits file, live use")
    ins.add_argument("target", metavar="CONTAINER|POD",
                     help="a Docker container's name or id (prefix), a pod's namespace/name, name or UID, "
                          "or an owner key (docker:ID, pod:UID)")
    ins.add_argument("--state-dir", help=f"the daemon's state dir (default {DEFAULT_STATE_DIR})")
    ins.add_argument("--config", help="read stateDir from this config file")
    ins.add_argument("-o", "--output", choices=["table", "json"], default="table")

    pl = sub.add_parser("plan", help="what-if placement of a workload on a described cluster",
                        description=_plan_formats(), formatter_class=argparse.RawDescriptionHelpFormatter)
    src = pl.add_mutually_exclusive_group(required=True)
    src.add_argument("--cluster", help="cluster file: nodes with their GPUs and config")
    src.add_argument("--live", action="store_true",
                     help="plan on the live gossiped view of the local daemon (--state-dir) instead of a file")
    pl.add_argument("--state-dir", help=f"with --live: the daemon's state dir (default {DEFAULT_STATE_DIR})")
    pl.add_argument("--config", help="with --live: node settings (defaults, policies) and stateDir from this file")
    pl.add_argument("--workload", required=True, help="multi-document YAML of Pods and Docker entries")
    pl.add_argument("-o", "--output", choices=["table", "json"], default="table")
    pl.add_argument("--scores", action="store_true",
                    help="table output: each node's score and each GPU's score for every item")

    cfg = sub.add_parser("config", help="configuration tools")
    csub = cfg.add_subparsers(dest="config_cmd", required=True, metavar="TOOL")
    fh = csub.add_parser("from-hami", help="translate HAMi's chart values (and device config) into hamid's values")
    fh.add_argument("values", metavar="VALUES.yaml", help="HAMi's Helm values (helm get values RELEASE -a)")
    fh.add_argument("device_config", metavar="DEVICE-CONFIG.yaml", nargs="?",
                    help="HAMi's device-config.yaml (nvidia: ...) or the device plugin's config.json (nodeconfig)")
    fh.add_argument("-o", "--output", metavar="FILE", help="write hamid's chart values here (default: stdout)")
    fh.add_argument("--config-out", metavar="FILE",
                    help="also write the config part alone, for hamid run --config on a Docker host")

    idp = sub.add_parser("identity", help="this node's identity key (signs its gossip statements and peer calls)")
    isub = idp.add_subparsers(dest="identity_cmd", required=True, metavar="TOOL")
    rot = isub.add_parser("rotate", help="replace the node's identity key; the old key signs the handover, so the "
                                         "other members take the new key at once (restart the daemon to use it)")
    rot.add_argument("--state-dir", help=f"the daemon's state dir (default {DEFAULT_STATE_DIR})")
    rot.add_argument("--config", help="read stateDir from this config file")

    sub.add_parser("version", help="print the version")
    return p


def _cmd_identity(args) -> int:
    from ..nodekey import rotate

    state = _state_dir(args)
    if not state.is_dir():
        raise HamidError(f"no state dir {state}: give the daemon's --state-dir")
    old, new = rotate(state)
    print(f"identity key of {state} rotated: {old} -> {new}\n"
          "restart the daemon (hamid run, or its pod) to gossip the new key; members take it with the old key's "
          "signature, at once")
    return 0


def _trio_run(fn, *args, what: str) -> None:
    """``trio.run``, with a face's error (inside the nursery's exception group) said in one line."""
    import trio

    try:
        trio.run(fn, *args)
    except KeyboardInterrupt:
        pass
    except OSError as e:
        raise HamidError(f"{what} stopped: {e}") from None
    except BaseExceptionGroup as group:
        mine, _ = group.split(HamidError)
        if mine is None:
            raise
        first: BaseException = mine
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise HamidError(str(first)) from None


def _cmd_front(args) -> int:
    from .. import logs
    from ..config import load_config, resolve_node
    from ..config.load import node_name
    from ..daemon import front

    config = load_config(args.config, {"nodeName": args.node_name, "logFormat": args.log_format})
    logs.configure(config.logFormat, config.logLevel)
    settings = resolve_node(config, node_name(config))
    front.front_faces(config, settings)  # refuse a config it cannot serve before starting
    _trio_run(front.run, config, settings, what="front")
    return 0


def _cmd_run(args) -> int:
    from .. import logs
    from ..config import load_config, resolve_node
    from ..config.load import node_name
    from ..daemon import service

    overrides = {"kubernetes": True if args.kubelet_dir else args.kubernetes, "kubeconfig": args.kubeconfig, "kubeletDir": args.kubelet_dir,
                 "stateDir": args.state_dir, "metricsPort": args.metrics_port,
                 "legacyMetrics": args.legacy_metrics, "nodeName": args.node_name,
                 "simulate": args.simulate, "logFormat": args.log_format, "logLevel": args.log_level,
                 "gossipListen": args.gossip_listen, "gossipAdvertise": args.gossip_advertise,
                 "gossipKeyFile": args.gossip_key_file,
                 "gossipInsecure": args.gossip_insecure,
                 "peerListen": args.peer_listen, "peerAdvertise": args.peer_advertise,
                 "webListen": args.web_listen, "webTokenFile": args.web_token_file,
                 "gossipJoin": tuple(a.strip() for a in args.join.split(",") if a.strip()) if args.join else None}
    config = load_config(args.config, overrides)
    logs.configure(config.logFormat, config.logLevel)
    node = node_name(config)
    settings = resolve_node(config, node)
    if args.simulate:  # the flag beats a per-node override too
        settings = settings.model_copy(update={"simulate": args.simulate})
    daemon = service.prepare(config, settings, node)
    _trio_run(service.run, daemon, what="daemon")
    return 0


def _state_dir(args) -> Path:
    if args.state_dir:  # absolute, as the daemon's: what status and inspect print is usable from anywhere
        return Path(os.path.abspath(args.state_dir))
    if args.config:
        from ..config import load_config

        return Path(load_config(args.config).stateDir)
    return Path(DEFAULT_STATE_DIR)


def _cmd_status(args) -> int:
    from ..localapi.client import DaemonUnavailable, LocalClient

    state = _state_dir(args)
    if args.cluster:
        return _cluster_status(state, args.output)
    try:
        with LocalClient(state) as c:
            doc = c.status()
    except DaemonUnavailable as e:
        from ..daemon.service import LEDGER_NAME
        from ..ledger import Ledger
        from ..ledger.report import status_document
        from ..node import released

        path = state / LEDGER_NAME
        if not path.exists():
            raise HamidError(f"{e}, and no ledger at {path}: is hamid running with --state-dir {state}?") from None
        print(f"note: {e}; showing the ledger at {path} directly", file=sys.stderr)
        releasing = {f"docker:{cid}" for cid in released.pending(str(state))}
        ledger = Ledger(path)
        try:
            doc = status_document(ledger.view(), ledger.list(), _offline_backend(state), releasing)
        finally:
            ledger.close()
        if doc["releasing"]:
            print(f"note: left out, release pending (the daemon drains it when it runs): "
                  f"{', '.join(doc['releasing'])}", file=sys.stderr)
    if args.output == "json":
        print(json.dumps(doc, indent=2))
    else:
        from .render import status_table

        print(status_table(doc))
    return 0


def _cmd_inspect(args) -> int:
    from ..localapi.client import DaemonUnavailable, LocalClient
    from . import inspect

    state = _state_dir(args)
    try:
        with LocalClient(state) as c:
            reservations = c.reservations()
            gpus = {g["uuid"] for g in c.status()["gpus"]}
    except DaemonUnavailable as e:
        from ..daemon.service import LEDGER_NAME
        from ..ledger import Ledger

        path = state / LEDGER_NAME
        if not path.exists():
            raise HamidError(f"{e}, and no ledger at {path}: is hamid running with --state-dir {state}?") from None
        print(f"note: {e}; reading the ledger at {path} directly", file=sys.stderr)
        ledger = Ledger(path)
        try:
            reservations = [r.to_dict() for r in ledger.list()]
            gpus = {g.uuid for g in ledger.view().gpus}
        finally:
            ledger.close()
    doc = inspect.describe(inspect.find(reservations, args.target), state, gpus)
    print(json.dumps(doc, indent=2) if args.output == "json" else inspect.render(doc))
    return 0


def _cmd_config(args) -> int:
    import yaml

    from ..config.fromhami import is_device_config, report, translate

    def load(path: str) -> dict:
        try:
            with open(path) as f:
                doc = yaml.safe_load(f)
        except OSError as e:
            raise HamidError(f"cannot read {path}: {e.strerror}") from None
        except yaml.YAMLError as e:
            raise HamidError(f"{path} is not YAML: {e}") from None
        if doc is not None and not isinstance(doc, dict):
            raise HamidError(f"{path}: expected a mapping at the top, got {type(doc).__name__}")
        return doc or {}

    first = load(args.values)
    device_config = load(args.device_config) if args.device_config else None
    if is_device_config(first):
        if device_config is not None:
            raise HamidError(f"{args.values} is a device config (nvidia: or nodeconfig at the top), not HAMi's "
                             f"chart values: give the values first (helm get values RELEASE -a), then "
                             f"{args.values} as the second argument")
        print(f"note: {args.values} is a device config (nvidia: or nodeconfig at the top), read as such: its place "
              f"is the second argument, after HAMi's chart values (helm get values RELEASE -a), which this run "
              f"did not translate", file=sys.stderr)
        first, device_config = {}, first
    values, lines = translate(first, device_config)
    text = "# hamid's chart values, translated from HAMi's by `hamid config from-hami`\n" + \
        yaml.safe_dump(values, sort_keys=False)
    if args.output:
        Path(args.output).write_text(text)
    else:
        print(text, end="")
    if args.config_out:
        Path(args.config_out).write_text(yaml.safe_dump(values.get("config") or {}, sort_keys=False))
    for line in report(lines):
        print(line, file=sys.stderr)
    return 0


def _offline_backend(state: Path) -> str:
    """The devices as the daemon recorded them in node.json at its last start."""
    from ..node.facts import read_facts

    try:
        facts = read_facts(state)
    except HamidError:
        return "unknown (daemon not running, no readable node.json)"
    b = facts.backend
    what = str(b.get("kind", "unknown"))
    if b.get("simulate"):
        what += f" {b['simulate']}"
    if b.get("mig_enabled"):
        what += ", MIG"
    return f"{what} (from node.json; daemon not running)"


def _cluster_status(state: Path, output: str) -> int:
    from ..cluster.report import cluster_status
    from .render import cluster_table
    from ..localapi.client import DaemonUnavailable, LocalClient

    try:
        with LocalClient(state) as c:
            doc = c.cluster()
    except DaemonUnavailable as e:
        raise HamidError(f"{e}: the cluster view lives in a running daemon") from None
    st = cluster_status(doc)
    print(json.dumps(st, indent=2) if output == "json" else cluster_table(st))
    return 0


def _live_nodes(args) -> list:
    from ..config import NodeSettings, load_config
    from ..cluster.report import LiveNode, live_views
    from ..localapi.client import LocalClient

    settings = NodeSettings()
    if args.config:
        cfg = load_config(args.config)
        settings = NodeSettings.model_validate({k: getattr(cfg, k) for k in NodeSettings.model_fields})
    with LocalClient(_state_dir(args)) as c:
        views = live_views(c.cluster())
    if not views:
        raise HamidError("the live view has no member with capacity yet")
    return [LiveNode(v, settings) for v in views]


def _cmd_plan(args) -> int:
    from ..cluster import plan

    nodes = _live_nodes(args) if args.live else plan.load_cluster(args.cluster)
    results = plan.plan(nodes, plan.load_workload(args.workload),
                        source="the live view" if args.live else f"the cluster file {args.cluster}")
    if args.output == "json":
        print(json.dumps(results, indent=2))
    else:
        print(plan.render(results, scores=args.scores))
    return 1 if any("error" in r for r in results) else 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.cmd == "version":
            from ..buildinfo import build_info

            b = build_info()
            print(f"hamid {__version__}\nshim {b.shim_version}\ncommit {b.revision}\nbuilt {b.build_date}"
                  f"\n(from {b.source})")
            return 0
        return {"run": _cmd_run, "status": _cmd_status, "plan": _cmd_plan, "front": _cmd_front, "webhook": _cmd_front,
                "inspect": _cmd_inspect, "config": _cmd_config, "identity": _cmd_identity}[args.cmd](args)
    except HamidError as e:
        print(f"hamid {args.cmd}: {e}", file=sys.stderr)
        return 1
    except PermissionError as e:
        what = f"{e.strerror or 'permission denied'}: {e.filename}" if e.filename else str(e)
        print(f"hamid {args.cmd}: {what}; hamid's state directory, sockets and ledger are root's only: "
              f"run it as root (sudo hamid {args.cmd} ...)", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # `hamid ... | head`: the reader has what it wanted. Point stdout at
        # /dev/null so the interpreter's final flush cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
