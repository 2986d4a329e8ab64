"""``python -m harness.nodeagent --kubeconfig PATH --state-dir DIR [--nodes N] [--health-port P]``

The cluster's kubelets in one process (``harness.nodeagent.agent``). The full ``ControlPlane`` starts
it as a component; it can also be run against any harness-made cluster by hand. SIGTERM or SIGINT
stops it: every container process is killed, the nodes are deleted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from pathlib import Path

from harness.nodeagent.agent import DEFAULT_NODES, AgentSettings, NodeAgent
from harness.nodeagent.pod import BackoffPolicy
from harness.nodeagent.runtime import LauncherGone


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness.nodeagent", description=__doc__)
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--state-dir", type=Path, required=True, help="pod logs and working directories")
    parser.add_argument("--nodes", type=int, default=DEFAULT_NODES, help="how many Nodes to register")
    parser.add_argument(
        "--health-port", type=int, default=0, help="loopback port of /healthz and /debug/pods"
    )
    parser.add_argument("--host-ip", default="127.0.0.1", help="the nodes' InternalIP (pods' hostIP)")
    parser.add_argument("--backoff-initial", type=float, default=BackoffPolicy.initial,
                        help="first crash-loop backoff in seconds (a kubelet: 10)")  # fmt: skip
    parser.add_argument("--backoff-max", type=float, default=BackoffPolicy.maximum,
                        help="crash-loop backoff cap in seconds (a kubelet: 300)")  # fmt: skip
    parser.add_argument("--no-events", action="store_true", help="do not record Events on pods")
    parser.add_argument("--container-engine", type=Path, metavar="DIR",
                        help="run our images (epp-harness/*) as containers in the running engine of "
                        "this directory (harness.cluster.container_engine); others: processes")  # fmt: skip
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser


async def _main(settings: AgentSettings) -> None:
    agent = NodeAgent(settings)
    task = asyncio.create_task(agent.run(), name="node-agent")
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await task


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    settings = AgentSettings(
        kubeconfig=args.kubeconfig,
        state_dir=args.state_dir,
        nodes=args.nodes,
        health_port=args.health_port,
        host_ip=args.host_ip,
        backoff=BackoffPolicy(args.backoff_initial, args.backoff_max),
        events=not args.no_events,
        container_engine=args.container_engine,
    )
    try:
        asyncio.run(_main(settings))
    except LauncherGone as exc:
        logging.getLogger("harness.nodeagent").error("stopping: %s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
