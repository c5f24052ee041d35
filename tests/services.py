"""Real services for the tests, on loopback ports: a Redis server and a Redis Cluster started
from the OS package (``redis-server``, ``redis-cli``), or the test skips saying what is missing.
Import the fixtures (``redis_url``, ``redis_cluster_url``) into a test module to use them."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def redis_server() -> str:
    """The redis-server program and the client package, or the test skips saying which is
    missing."""
    pytest.importorskip("redis", reason="the redis client package is not installed")
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server; .ci/run does)")
    return server


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    server = redis_server()
    port = free_port()
    proc = start_redis(server, port, tmp_path_factory.mktemp("redis"))
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(timeout=10)


def start_redis(server: str, port: int, folder, *options: str) -> subprocess.Popen:
    """A redis-server on the loopback ``port`` (no persistence; more ``options``), once it
    accepts connections; skips the test if it does not start."""
    proc = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(folder)]
        + list(options),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    pytest.skip("redis-server did not start")


def start_redis_cluster(folder, masters: int = 3) -> tuple[str, list[subprocess.Popen]]:
    """A Redis Cluster of ``masters`` masters on loopback ports (the OS package's
    ``redis-server`` and ``redis-cli --cluster create``), once every slot is served:
    (``redis-cluster://`` URL, the server processes). Skips the test if it cannot start."""
    server = redis_server()
    cli = shutil.which("redis-cli")
    if cli is None:
        pytest.skip("redis-cli is not installed (apt-get install redis-server; .ci/run does)")
    ports: list[int] = []
    while len(ports) < masters:  # each node also listens on its port + 10000 (the cluster bus)
        port = free_port()
        if port < 55000 and port not in ports and port_free(port + 10000):
            ports.append(port)
    procs: list[subprocess.Popen] = []
    try:
        for port in ports:
            node = folder / str(port)
            node.mkdir()
            cluster = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
            procs.append(start_redis(server, port, node, *cluster))
    except BaseException:  # a node did not start (the test skips): none is left running
        for proc in procs:
            proc.kill()
        raise
    create = subprocess.run(
        [cli, "--cluster", "create", *[f"127.0.0.1:{p}" for p in ports], "--cluster-replicas", "0", "--cluster-yes"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    deadline = time.time() + 30
    while create.returncode == 0 and time.time() < deadline:
        # every node's own view: one node may say ok while another still thinks the cluster down
        views = [subprocess.run([cli, "-p", str(p), "cluster", "info"], capture_output=True, text=True) for p in ports]
        if all("cluster_state:ok" in v.stdout for v in views):
            return f"redis-cluster://127.0.0.1:{ports[0]}", procs
        time.sleep(0.1)
    for proc in procs:
        proc.kill()
    pytest.skip(f"the Redis Cluster did not form: {create.stdout[-300:]} {create.stderr[-300:]}")


@pytest.fixture(scope="module")
def redis_cluster_url(tmp_path_factory):
    url, procs = start_redis_cluster(tmp_path_factory.mktemp("redis-cluster"))
    yield url
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=10)
