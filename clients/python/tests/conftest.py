"""Fixtures: real 3-node clusters (see cluster.py), and holder processes (see holder.py)."""

import queue
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest
from cluster import Cluster

import holdfast

HOLDER = Path(__file__).resolve().parent / "holder.py"


def three_nodes() -> Iterator[Cluster]:
    """A 3-node cluster, stopped when the fixture ends."""
    c = Cluster(3)
    try:
        yield c
    finally:
        c.stop()


#: One 3-node cluster shared by a module's tests (each test uses lock names of its own).
cluster = pytest.fixture(scope="module", name="cluster")(three_nodes)
#: A 3-node cluster for one test, which may kill its nodes.
own_cluster = pytest.fixture(name="own_cluster")(three_nodes)


@pytest.fixture
def client(cluster: Cluster) -> Iterator[holdfast.Client]:
    with holdfast.Client(cluster.endpoints, owner="pytest") as c:
        yield c


@pytest.fixture
def name() -> str:
    """A lock name no other test uses."""
    return f"t-{uuid.uuid4().hex[:12]}"


class HolderProc:
    """A holder.py process; its stdout lines are read on a thread and taken with bounded waits."""

    def __init__(self, name: str, lease: float, endpoints: List[str], limit: int = 1) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(HOLDER), name, str(lease), str(limit), *endpoints],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines: "queue.Queue[str]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def expect(self, prefix: str, timeout: float = 15.0) -> str:
        """The next line, which must start with `prefix` (fails after `timeout` seconds without one)."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"holder printed nothing within {timeout} s (wanted {prefix!r})") from None
        assert line.startswith(prefix), f"holder printed {line!r}, wanted {prefix!r}"
        return line

    def acquired(self, timeout: float = 15.0) -> Tuple[int, int]:
        """Waits for `acquired FENCE SESSION_ID`; returns (fence, session id)."""
        _, fence, session_id = self.expect("acquired", timeout).split()
        return int(fence), int(session_id)

    def release(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("release\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture
def holders() -> Iterator[list]:
    """Starts holder processes (`holders.append(HolderProc(...))`); every one is killed at teardown."""
    procs: List[HolderProc] = []
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
