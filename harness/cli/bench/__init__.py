"""The routing benchmark (``harness bench routing``): workloads, policies, load replay and report.

The command-line entry points are imported lazily: the library parts (``workload``, ``stats``) load
without Envoy's API types or matplotlib.
"""

from __future__ import annotations

import argparse
from typing import Final

HELP: Final = "benchmarks: `routing` compares the EPP with round robin, the peer routers and an oracle"


def configure_parser(parser: argparse.ArgumentParser) -> None:
    from harness.cli.bench.cli import configure_parser as configure

    configure(parser)


def run(args: argparse.Namespace) -> int:
    from harness.cli.bench.cli import run as run_command

    return run_command(args)
