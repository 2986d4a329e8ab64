"""What every long-running ``harness`` command shares: signal handling, a throw-away control plane,
and the check that nothing was left running.

A command runs its work inside ``signals_raise_interrupt()`` (Ctrl-C and SIGTERM become
KeyboardInterrupt, so ``finally`` blocks stop child processes in order) and stops inside
``interrupts_deferred()`` (a second Ctrl-C while stopping prints a note instead of abandoning children
half-stopped).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from collections.abc import Iterator
from types import FrameType

from harness.base.guards import child_processes
from harness.cluster.controlplane import ControlPlane, ControlPlaneStartError
from harness.cluster.go_binaries import ensure_all, missing_binaries


class StartError(RuntimeError):
    """The environment did not come up; the message says which part and why."""


def say(text: str) -> None:
    print(text, flush=True)


def start_control_plane() -> ControlPlane:
    """The full cluster plane + CRDs, building the control-plane binaries first if they are not cached."""
    if missing_binaries():
        say("the control-plane binaries are not cached yet: building them once (later runs skip this)")
    try:
        ensure_all()
    except Exception as exc:
        raise StartError(f"no control-plane binaries: {exc}") from exc
    began = time.monotonic()
    say("starting the control plane (etcd, kube-apiserver, scheduler, controller-manager, CRDs) ...")
    plane = ControlPlane()
    try:
        plane.start()
    except ControlPlaneStartError as exc:
        raise StartError(str(exc)) from exc
    say(f"  up in {time.monotonic() - began:.1f} s at {plane.server_url}")
    return plane


def no_children_left() -> bool:
    """True when this process has no child left running; otherwise say which survived."""
    left = child_processes()
    for child in left:
        print(f"error: process {child.pid} is still running: {child.command}", file=sys.stderr)
    return not left


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def signals_raise_interrupt() -> Iterator[None]:
    """Ctrl-C and SIGTERM raise KeyboardInterrupt inside the block; handlers restored after.

    SIGINT gets Python's own handler even when it was inherited as ignored (a background job of a
    script), so ``asyncio.run`` still turns it into a clean cancellation.
    """
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """While stopping: Ctrl-C/SIGTERM print a note instead of abandoning children half-stopped."""

    def note(signum: int, frame: FrameType | None) -> None:
        print("still stopping (bounded by each process's stop timeout) ...", file=sys.stderr, flush=True)

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        signal.signal(sig, note)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
