"""pytest fixtures for end-to-end tests: whole `Stack`s (registered by entry point, ``harness_stack``).

Thin by design (STYLE habit 13): `harness.beds.stack.Stack` does the work; these fixtures only scope it.

* ``stack_factory`` (function scope) starts one Stack in the test's own namespace with the options
  the test asks for (``stack_factory(pods=2, sim_config=...)``) and stops it after the test. For tests
  that change pods, gauges or the EPP.
* ``shared_stack`` (module scope) is one Stack for the tests of a module that only send requests and
  look where they went. Its options come from the module-scoped ``shared_stack_options`` fixture,
  which a test module overrides to change pods, models or simulator settings; its namespace is unique
  (`harness.plugin.core.namespace_name`) and created by the Stack itself. Under pytest-xdist each
  worker that runs tests of the module starts its own.

Leaks (STYLE habit 17). The autouse per-test guard snapshots after the module's fixtures are set up
(pytest sets up wider scopes first), so a shared Stack's processes, threads and temp dirs are never
blamed on the test that happened to start it, and it only checks what each test itself left behind.
What a shared Stack leaves behind at its own teardown is then checked here, the same way: anything new
between just before its start and just after its stop fails the module's last test (as a teardown
error) and stray child processes are killed.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from harness.base import guards
from harness.cluster.controlplane import ClusterAccess
from harness.plugin.conformance import STARTED_STACKS
from harness.plugin.core import namespace_name
from harness.subject.foreign_epp import EppCommand

if TYPE_CHECKING:  # imported when first used: Envoy's API types are slow to import for unit-only runs
    from harness.beds.stack import Stack, StackOptions
    from harness.dataplane.envoy import Envoy

StackFactory = Callable[..., "Stack"]


@pytest.fixture
def stack_factory(
    control_plane: ClusterAccess,
    namespace: str,
    epp_command: EppCommand | None,
    envoy_factory: Callable[..., Envoy] | None,
    request: pytest.FixtureRequest,
) -> Iterator[StackFactory]:
    """``stack_factory(**StackOptions fields but namespace)`` -> a started Stack, stopped after the test.

    The EPP is ``--epp-command``'s when one is given (`harness.plugin.conformance`), else ours."""
    from harness.beds.stack import Stack, StackOptions

    started: list[Stack] = []
    request.node.stash[STARTED_STACKS] = started

    def make(**changes: Any) -> Stack:
        if started:
            raise RuntimeError("one Stack per test: the namespace and the pool name are the test's own")
        options = StackOptions(namespace=namespace, epp_command=epp_command, envoy_factory=envoy_factory)
        stack = Stack(control_plane, dataclasses.replace(options, **changes))
        started.append(stack)
        stack.start()
        return stack

    try:
        yield make
    finally:
        for stack in started:
            stack.stop()


@pytest.fixture(scope="module")
def shared_stack_options(request: pytest.FixtureRequest) -> StackOptions:
    """The shared Stack's options (override in a test module); the default is the demo's Stack."""
    from harness.beds.stack import StackOptions

    return StackOptions(namespace=namespace_name(request.module.__name__))


@pytest.fixture(scope="module")
def shared_stack(
    control_plane: ClusterAccess,
    shared_stack_options: StackOptions,
    epp_command: EppCommand | None,
    envoy_factory: Callable[..., Envoy] | None,
) -> Iterator[Stack]:
    """One Stack for every test of the module (running ``--epp-command``'s EPP when given);
    checked for leaks at its own teardown."""
    from harness.beds.stack import Stack

    options = shared_stack_options
    if options.epp_command is None and epp_command is not None:
        options = dataclasses.replace(options, epp_command=epp_command)
    if options.envoy_factory is None and envoy_factory is not None:
        options = dataclasses.replace(options, envoy_factory=envoy_factory)
    before = guards.snapshot()
    stack = Stack(control_plane, options)
    try:
        stack.start()
        yield stack
    finally:
        stack.stop()
        _delete_namespace(control_plane, shared_stack_options.namespace)
    leaks = guards.find_leaks(before)
    if leaks:
        guards.clean_up_leaks(before)
        pytest.fail("the shared Stack left behind:\n  " + "\n  ".join(leaks), pytrace=False)


def _delete_namespace(access: ClusterAccess, name: str) -> None:
    """Without waiting, like the ``namespace`` fixture: no namespace controller ever finishes it."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    with access.api_client() as api_client, contextlib.suppress(ApiException):
        client.CoreV1Api(api_client).delete_namespace(name, _request_timeout=10)
