"""`epp` / `python -m epp`: parse flags, run the endpoint picker until SIGTERM or SIGINT.

A signal drains (`Epp.drain`: NOT_SERVING, `--shutdownDelay`, then streams in flight get
`--shutdownGracePeriod`); a second signal cuts the drain short.

Exit codes: 0 after a signal-initiated shutdown, 1 if a component failed (or could not start),
2 for a bad command line.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence

from prometheus_client import CollectorRegistry

from epp.config import ServerConfig
from epp.k8s import KubeClient, KubeError, load_config
from epp.server.event_loop import EventLoopUnavailable, loop_factory
from epp.server.flag_values import FlagError
from epp.server.flags import parse_flags
from epp.server.logs import configure_logging
from epp.server.runner import Epp
from epp.server.supervisor import TaskFailed

log = logging.getLogger("epp")


async def serve(config: ServerConfig, environ: Mapping[str, str]) -> int:
    kube_config = load_config(config.kubeconfig, environ)
    loop = asyncio.get_running_loop()
    log.info("event loop: %s.%s", type(loop).__module__, type(loop).__qualname__)
    async with KubeClient(kube_config) as client:
        epp = Epp(config, registry=CollectorRegistry(), kube_client=client)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, epp.request_stop)
        try:
            async with epp:
                await epp.wait()
                log.info("shutting down")
                await epp.drain()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        flags = parse_flags(sys.argv[1:] if argv is None else argv, os.environ)
    except FlagError as exc:
        print(f"epp: {exc} (see --help)", file=sys.stderr)
        return 2
    configure_logging(flags.log_level, flags.log_encoder, sys.stderr)
    log.info("flags: %s (verbosity %d)", flags.config, flags.verbosity)
    for note in flags.notes:
        log.info("%s", note)
    try:
        with asyncio.Runner(loop_factory=loop_factory(flags.config.event_loop)) as runner:
            return runner.run(serve(flags.config, os.environ))
    except (TaskFailed, KubeError, OSError, EventLoopUnavailable) as exc:
        log.error("endpoint picker failed: %s", exc)
        return 1


if __name__ == "__main__":
    sys.exit(main())
