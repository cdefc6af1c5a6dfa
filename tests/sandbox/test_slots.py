"""Slot lifecycle on each backend: a dead runner is replaced (its test scores internal, never a pass), and closing
a slot leaves no process, container or cgroup behind."""

from __future__ import annotations

import socket
import time

import pytest
from sandbox_backends import require

from or1.sandbox.check import leftover_test_processes
from or1.sandbox.protocol import Limits, TestRequest

ECHO = TestRequest("stdin", "print(input())", 5, stdin="hi\n")
KILL_RUNNER = (
    "import os\nfor p in os.listdir('/proc'):\n"
    "    if p.isdigit() and '--serve' in open(f'/proc/{p}/cmdline').read().split('\\0'):\n"
    "        os.kill(int(p), 9)\n"
)


def test_local_slot_recovers_from_a_dead_runner_and_cleans_up():
    require("local")
    from or1.sandbox.local import LocalSandbox

    sandbox = LocalSandbox(0, Limits())
    cgroup = sandbox.cgroup
    try:
        assert sandbox.run(ECHO).stdout == "hi\n"
        sandbox.proc.kill()  # our own child: the bwrap process, PID 1 of the slot's namespace is its child
        sandbox.proc.wait()
        assert sandbox.run(ECHO).stdout == "hi\n"  # restarted before the test
        sandbox.channel.send({"kind": "stdin"})  # a malformed request: the runner reports, the host goes on
        assert sandbox.channel.recv(time.monotonic() + 10)["status"] == "internal"
        assert sandbox.run(ECHO).stdout == "hi\n"
    finally:
        sandbox.close()
    assert sandbox.proc is None and not leftover_test_processes()
    if cgroup is not None:
        assert not any(d.exists() for d in cgroup.dirs.values())


@pytest.mark.docker
def test_docker_slot_recovers_and_close_removes_the_container():
    require("docker")
    from or1.sandbox.docker_backend import DockerSandbox

    sandbox = DockerSandbox(1)
    container_id = sandbox.container.id
    client = sandbox.client
    try:
        attrs = client.api.inspect_container(container_id)["HostConfig"]
        assert attrs["NetworkMode"] == "none" and attrs["ReadonlyRootfs"] and attrs["PidsLimit"] > 0
        assert attrs["Memory"] == Limits().slot_memory_mb << 20
        assert sandbox.run(ECHO).stdout == "hi\n"
        sandbox.container.exec_run(
            ["python3", "-c", KILL_RUNNER]
        )  # the next test is internal, then all is well
        assert sandbox.run(ECHO).status == "internal"
        assert sandbox.run(ECHO).stdout == "hi\n"
    finally:
        sandbox.close()
    assert not client.containers.list(all=True, filters={"id": container_id})
    assert not leftover_test_processes()


@pytest.mark.docker
def test_docker_containers_of_dead_owners_are_removed():
    require("docker")
    from or1.sandbox.docker_backend import IMAGE, LABEL, docker_client, remove_orphans

    client = docker_client()
    owner = f"{socket.gethostname()}:999999999:0"  # no such pid
    orphan = client.containers.run(
        IMAGE, ["sleep", "60"], detach=True, network_mode="none", labels={LABEL: "1", "or1.owner": owner}
    )
    try:
        assert remove_orphans(client) >= 1
        assert not client.containers.list(all=True, filters={"id": orphan.id})
    finally:
        try:
            orphan.remove(force=True)
        except Exception:
            pass
