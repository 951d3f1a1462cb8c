"""Fixtures: real 3-node clusters (see cluster.py), holder processes (see holder.py), and collectors of
watches and leaders."""

import queue
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

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
    """A holder.py process (`options`: `--campaign VALUE`, `--lock-delay S`); its stdout lines are read on a
    thread and taken with bounded waits."""

    def __init__(
        self, name: str, lease: float, endpoints: List[str], limit: int = 1, options: Sequence[str] = ()
    ) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(HOLDER), *options, name, str(lease), str(limit), *endpoints],
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


_END = object()


class Collector:
    """Iterates `source` (a watch, or an election's leaders) on a thread of its own, so that the test takes
    its items with bounded waits; `stop` cancels it and waits for the thread."""

    def __init__(self, source: Any) -> None:
        self.source = source
        self.items: "queue.Queue[Any]" = queue.Queue()
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._run, name="collector", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for item in self.source:
                self.items.put(item)
        except BaseException as error:  # handed to the test by `next`
            self.error = error
        self.items.put(_END)

    def next(self, timeout: float = 10.0) -> Any:
        """The next item; fails if none came within `timeout` seconds, or if the iteration ended."""
        try:
            item = self.items.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"nothing came within {timeout} s") from None
        if item is _END:
            raise AssertionError(f"the iteration ended ({self.error!r})")
        return item

    def until(self, what: str, done: Callable[[Any], bool], timeout: float = 10.0) -> List[Any]:
        """Items up to and including the first for which `done` is true (all within `timeout` seconds)."""
        deadline = time.monotonic() + timeout
        seen: List[Any] = []
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}; saw {seen}")
            seen.append(self.next(remaining))
            if done(seen[-1]):
                return seen

    def stop(self) -> None:
        """Cancels the source; its thread must end promptly."""
        self.source.cancel()
        self.thread.join(timeout=10)
        assert not self.thread.is_alive(), "the iteration did not end after cancel()"


@pytest.fixture
def collectors() -> Iterator[Callable[[Any], Collector]]:
    """`collect(source)` starts a `Collector`; every one is stopped at teardown."""
    started: List[Collector] = []

    def collect(source: Any) -> Collector:
        started.append(Collector(source))
        return started[-1]

    try:
        yield collect
    finally:
        for collector in started:
            collector.stop()
