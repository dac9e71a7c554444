"""One leader-election candidate as its own process, for tests that kill it
with SIGKILL: ``python elector_proc.py KUBECONFIG IDENTITY LEASE RENEW RETRY``.
Prints ``LEADING`` on stdout when it leads; logs go to stderr."""

from __future__ import annotations

import sys

import trio

from hamid.kube.election import LeaderElector
from hamid.kube.client import api_client
from hamid.logs import configure


async def main(kubeconfig: str, identity: str, lease: str, renew: str, retry: str) -> None:
    elector = LeaderElector(api_client(kubeconfig), identity=identity, lease_duration=int(lease),
                            renew_deadline=float(renew), retry_period=float(retry))
    async with trio.open_nursery() as nursery:
        await nursery.start(elector.run)
        await elector.wait_leading()
        print("LEADING", flush=True)
        await trio.sleep_forever()


if __name__ == "__main__":
    configure("json", "info", stream=sys.stderr)
    trio.run(main, *sys.argv[1:])
