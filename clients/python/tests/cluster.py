"""A real holdfast cluster for the tests: `holdfast server` processes on free ports of 127.0.0.1, in a
temporary directory, as tests/common/mod.rs starts them (with extra server flags: TLS, `--auth`). Every wait
is bounded; every process is killed at `stop`."""

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parents[3]
START_BOUND_S = 30.0
POLL_S = 0.05
# A proxy from the environment must not see requests to 127.0.0.1.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def holdfast_binary() -> Path:
    """$HOLDFAST_BIN, else target/debug/holdfast, else target/release/holdfast (the runner builds one)."""
    if os.environ.get("HOLDFAST_BIN"):
        return Path(os.environ["HOLDFAST_BIN"])
    for profile in ("debug", "release"):
        path = REPO / "target" / profile / "holdfast"
        if path.exists():
            return path
    raise RuntimeError("no holdfast binary: run `cargo build -p holdfast` or set HOLDFAST_BIN")


def wait_for(what: str, check: Any, bound_s: float = 10.0) -> Any:
    """Polls `check()` until it returns something truthy (returned), failing after `bound_s` seconds."""
    deadline = time.monotonic() + bound_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {bound_s} s waiting for {what}")
        time.sleep(POLL_S)


def _free_ports(n: int) -> List[int]:
    """n distinct free ports (every probe held until all are chosen)."""
    probes = [socket.socket() for _ in range(n)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()


class Cluster:
    """n nodes with ids 1..n; `client_addr(id)` is the gRPC and HTTP address of node `id`. `extra_args` go to
    every `holdfast server`; `tls` is the context the harness's HTTP requests use when they speak TLS."""

    def __init__(self, n: int = 3, extra_args: Sequence[str] = (), tls: Optional[ssl.SSLContext] = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="holdfast-py-test-"))
        self.binary = holdfast_binary()
        self.extra_args = list(extra_args)
        self.scheme = "https" if tls is not None else "http"
        self._http = (
            urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=tls))
            if tls is not None
            else _HTTP
        )
        ports = _free_ports(2 * n)
        self.client_ports = {i: ports[2 * (i - 1)] for i in range(1, n + 1)}
        self.peer_ports = {i: ports[2 * (i - 1) + 1] for i in range(1, n + 1)}
        self.members = ",".join(f"{i}=127.0.0.1:{p}" for i, p in self.peer_ports.items())
        self.procs: Dict[int, subprocess.Popen] = {}
        for i in self.client_ports:
            self.start_node(i)
        self.wait_ready(list(self.client_ports))

    def client_addr(self, i: int) -> str:
        return f"127.0.0.1:{self.client_ports[i]}"

    @property
    def endpoints(self) -> List[str]:
        return [self.client_addr(i) for i in sorted(self.client_ports)]

    def start_node(self, i: int) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HOLDFAST_")}
        env.setdefault("RUST_LOG", "info,openraft=warn")
        env["NO_COLOR"] = "1"
        data = self.dir / f"node{i}" / "data"
        data.mkdir(parents=True, exist_ok=True)
        with open(self.dir / f"node{i}.log", "ab") as log:
            self.procs[i] = subprocess.Popen(
                [
                    str(self.binary),
                    "server",
                    "--id",
                    str(i),
                    "--members",
                    self.members,
                    "--client-addr",
                    self.client_addr(i),
                    "--peer-addr",
                    f"127.0.0.1:{self.peer_ports[i]}",
                    "--data-dir",
                    str(data),
                    *self.extra_args,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
            )

    def wait_ready(self, ids: List[int]) -> None:
        """Waits until every node in `ids` answers GET /readyz with 200 (failing at once if one exits)."""

        def ready() -> bool:
            for i in ids:
                if self.procs[i].poll() is not None:
                    raise AssertionError(f"node {i} exited while starting:\n{self.log_tail(i)}")
            return all(self._status(i, "/readyz") == 200 for i in ids)

        wait_for(f"nodes {ids} ready", ready, START_BOUND_S)

    def _status(self, i: int, path: str) -> int:
        try:
            with self._http.open(f"{self.scheme}://{self.client_addr(i)}{path}", timeout=2) as response:
                return response.status
        except urllib.error.HTTPError as error:
            return error.code
        except OSError:  # refused, reset, or a TLS handshake not done yet
            return 0

    def http_get(self, i: int, path: str) -> Optional[Dict[str, Any]]:
        """GET `path` on node `i` as JSON; None for a 404."""
        try:
            with self._http.open(f"{self.scheme}://{self.client_addr(i)}{path}", timeout=5) as response:
                return json.load(response)
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return None
            raise

    def http_post(self, i: int, path: str) -> Dict[str, Any]:
        """POST `path` (no body) on node `i`; its JSON answer."""
        request = urllib.request.Request(f"{self.scheme}://{self.client_addr(i)}{path}", data=b"", method="POST")
        with self._http.open(request, timeout=5) as response:
            return json.load(response)  # type: ignore[no-any-return]

    def read_lock(self, name: str, i: Optional[int] = None) -> Optional[Dict[str, Any]]:
        """The cluster's read of a lock (GET /v1/locks/NAME on a running node), None if nobody holds it."""
        node = i if i is not None else next(j for j, p in self.procs.items() if p.poll() is None)
        return self.http_get(node, f"/v1/locks/{name}")

    def leader(self) -> int:
        """The leader's id, as a running node sees it (waits for one)."""

        def find() -> int:
            for i, proc in self.procs.items():
                if proc.poll() is None:
                    try:
                        leader = int(self.http_get(i, "/v1/cluster").get("leader") or 0)  # type: ignore[union-attr]
                    except OSError:
                        continue
                    if leader:
                        return leader
            return 0

        return wait_for("a leader", find)

    def kill(self, i: int) -> None:
        """kill -9 of node `i`."""
        proc = self.procs[i]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def log_tail(self, i: int, lines: int = 30) -> str:
        path = self.dir / f"node{i}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def stop(self) -> None:
        """Kills every node and deletes the directory (kept, with its logs, if $HOLDFAST_KEEP_TEST_DIRS)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        if not os.environ.get("HOLDFAST_KEEP_TEST_DIRS"):
            shutil.rmtree(self.dir, ignore_errors=True)
