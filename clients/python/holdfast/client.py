"""`Client`: endpoints, channels and retries, the one-shot calls (TTL holds with a token) and reads, and the
doors to session locks, watches and elections."""

import os
import socket
import threading
import time
from typing import Callable, Iterator, List, Optional, Sequence, Tuple, TypeVar, Union

import grpc

from ._wire import MAX_ATTEMPTS, REQUEST_TIMEOUT_S, RETRY_TIMEOUT_S, pause
from ._wire import ms as _ms
from ._wire import target as _target
from ._wire import value_bytes
from .election import ELECTION_LEASE_S, Leaders, Leadership, campaign
from .errors import HoldfastError, InvalidArgument, NotFound, Unavailable, error_from_rpc
from .session import SessionLock
from .types import Leader, ListPage, LockInfo
from .v1 import locks_pb2, locks_pb2_grpc
from .watch import Watch

T = TypeVar("T")


class Hold:
    """A one-shot TTL hold, as granted (or last renewed). Usable as a context manager that releases it."""

    def __init__(self, client: "Client", hold: locks_pb2.Hold) -> None:
        self._client = client
        self._update(hold)

    def _update(self, hold: locks_pb2.Hold) -> None:
        self.name: str = hold.name
        self.owner: str = hold.owner
        #: The secret that renews and releases the hold.
        self.token: str = hold.token
        #: Grows with every grant: pass it to the protected resource.
        self.fence: int = hold.fence
        #: Leader wall-clock times, ms since the Unix epoch: for people and logs. Count the TTL from when
        #: you sent the acquire or renew, by your own clock.
        self.granted_at_ms: int = hold.granted_at_ms
        self.expires_at_ms: int = hold.expires_at_ms
        self.ttl_ms: int = hold.ttl_ms
        self.value: bytes = hold.value

    def renew(self, ttl: Optional[float] = None) -> "Hold":
        """Extends the hold to now + `ttl` seconds (None: its current TTL); the fence stays.
        Raises `Expired` or `NotHolder` if the hold has ended."""
        request = locks_pb2.RenewRequest(name=self.name, token=self.token, ttl_ms=0 if ttl is None else _ms(ttl, "ttl"))
        self._update(self._client._call(lambda stub, kw: stub.Renew(request, **kw)))
        return self

    def set_value(self, value: Union[bytes, str]) -> "Hold":
        """Publishes `value` (at most 1 KiB; a str as UTF-8) in place of the hold's value: one log entry, the
        fence and expiry stay, watchers see it. Raises `NotHolder` or `Expired` if the hold has ended."""
        self._update(self._client._set_value(self.name, self.token, value_bytes(value)))
        return self

    def release(self) -> int:
        """Lets go of the hold (the next waiter is granted at once); returns its fence. Raises `NotHolder` if
        the token does not hold the lock any more (after a retried release: it has ended either way)."""
        request = locks_pb2.ReleaseRequest(name=self.name, token=self.token)
        return self._client._call(lambda stub, kw: stub.Release(request, **kw)).fence

    def __enter__(self) -> "Hold":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"Hold(name={self.name!r}, owner={self.owner!r}, fence={self.fence}, expires_at_ms={self.expires_at_ms})"


class Client:
    """A connection to a holdfast cluster through any of its nodes.

    `endpoints` are `host:port` of the nodes' client ports (any node serves any call: followers forward to
    the leader). A call starts at the endpoint that answered last and falls through the list when a node
    does not answer or answers UNAVAILABLE, pausing with backoff after each round, for at most
    `MAX_ATTEMPTS` attempts and `RETRY_TIMEOUT_S`; every other error is raised at once.

    TLS: `ca_cert` (PEM bytes of the CA that signed the nodes' certificates; endpoints then use `https://`),
    with `client_cert` and `client_key` (PEM bytes) for mutual TLS. `api_key`: sent as
    `authorization: Bearer KEY` (a server started with `--auth`). `owner`: shown in the lock table
    (default `hostname/pid`).
    """

    def __init__(
        self,
        endpoints: Union[str, Sequence[str]],
        *,
        ca_cert: Optional[bytes] = None,
        client_cert: Optional[bytes] = None,
        client_key: Optional[bytes] = None,
        api_key: Optional[str] = None,
        owner: Optional[str] = None,
        request_timeout: float = REQUEST_TIMEOUT_S,
    ) -> None:
        if isinstance(endpoints, str):
            endpoints = [endpoints]
        if not endpoints:
            raise ValueError("at least one endpoint is needed")
        tls = ca_cert is not None or client_cert is not None
        self._targets: List[str] = [_target(e, tls) for e in endpoints]
        self._credentials = (
            grpc.ssl_channel_credentials(
                root_certificates=ca_cert, private_key=client_key, certificate_chain=client_cert
            )
            if tls
            else None
        )
        self._metadata: Tuple[Tuple[str, str], ...] = (("authorization", f"Bearer {api_key}"),) if api_key else ()
        self.owner: str = owner if owner is not None else f"{socket.gethostname()}/{os.getpid()}"
        self.request_timeout = request_timeout
        self._lock = threading.Lock()
        self._channels: List[Optional[grpc.Channel]] = [None] * len(self._targets)
        self._preferred = 0

    # ----- plumbing -----

    @property
    def endpoints(self) -> List[str]:
        """The gRPC targets, in the order given."""
        return list(self._targets)

    def _stub(self, index: int) -> locks_pb2_grpc.LocksStub:
        """The stub of endpoint `index`, its channel made on first use (it reconnects by itself)."""
        with self._lock:
            channel = self._channels[index]
            if channel is None:
                target = self._targets[index]
                channel = (
                    grpc.secure_channel(target, self._credentials)
                    if self._credentials is not None
                    else grpc.insecure_channel(target)
                )
                self._channels[index] = channel
        return locks_pb2_grpc.LocksStub(channel)

    def _call(self, attempt: Callable[[locks_pb2_grpc.LocksStub, dict], T], extra_timeout: float = 0.0) -> T:
        """Runs `attempt(stub, call_kwargs)` on the preferred endpoint, then the next ones while it fails with
        `Unavailable`, within the retry bounds; maps every failure to a `HoldfastError`."""
        start = time.monotonic()
        last: Optional[HoldfastError] = None
        n = len(self._targets)
        with self._lock:
            first = self._preferred
        for number in range(MAX_ATTEMPTS):
            if number and number % n == 0:
                pause(number // n)
            if number and time.monotonic() - start > RETRY_TIMEOUT_S:
                break
            index = (first + number) % n
            kwargs = {"timeout": self.request_timeout + extra_timeout, "metadata": self._metadata}
            try:
                result = attempt(self._stub(index), kwargs)
            except grpc.RpcError as error:
                last = error_from_rpc(error)
                if not isinstance(last, Unavailable):
                    raise last from None
                continue
            with self._lock:
                self._preferred = index
            return result
        raise Unavailable(f"no endpoint answered after {number + 1} attempts: {last}") from None

    def close(self) -> None:
        """Closes the channels (sessions running on them break)."""
        with self._lock:
            channels, self._channels = self._channels, [None] * len(self._targets)
        for channel in channels:
            if channel is not None:
                channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- session locks -----

    def lock(
        self,
        name: str,
        lease: float = 2.0,
        *,
        blocking: bool = True,
        timeout: Optional[float] = None,
        value: Union[bytes, str] = b"",
        limit: int = 1,
        lock_delay: float = 0.0,
        owner: Optional[str] = None,
        on_lost: Optional[Callable[[SessionLock], None]] = None,
    ) -> SessionLock:
        """A session lock on `name` with a lease of `lease` seconds (nothing is sent until it is acquired):
        see `SessionLock`."""
        return SessionLock(
            self,
            name,
            lease=lease,
            blocking=blocking,
            timeout=timeout,
            value=value,
            limit=limit,
            lock_delay=lock_delay,
            owner=self.owner if owner is None else owner,
            on_lost=on_lost,
        )

    # ----- one-shot calls -----

    def acquire(
        self,
        name: str,
        *,
        ttl: float = 30.0,
        wait: float = 0.0,
        owner: Optional[str] = None,
        value: Union[bytes, str] = b"",
        limit: int = 1,
        lock_delay: float = 0.0,
    ) -> Hold:
        """Takes `name` with a TTL of `ttl` seconds. `wait` 0: raise `LockBusy` at once if held; otherwise
        wait in the lock's FIFO queue up to `wait` seconds, then `LockBusy`. `limit` above 1: one place of a
        semaphore of that many. `lock_delay`: if the hold expires unrenewed, nobody gets the lock for that
        long after.

        Caveat (as the Rust client's): an acquire retried after a lost answer may have been granted to a
        token nobody knows; the retry then answers `LockBusy` naming your own owner, until that TTL ends."""
        request = locks_pb2.AcquireRequest(
            name=name,
            owner=self.owner if owner is None else owner,
            ttl_ms=_ms(ttl, "ttl"),
            wait_ms=_ms(wait, "wait"),
            value=value_bytes(value),
            lock_delay_ms=_ms(lock_delay, "lock_delay"),
            limit=limit,
        )
        return Hold(self, self._call(lambda stub, kw: stub.Acquire(request, **kw), extra_timeout=wait + 10.0))

    def _set_value(self, name: str, token: str, value: bytes) -> locks_pb2.Hold:
        """One-shot `SetValue` (also what a session lock's `set_value` uses: any hold's token may)."""
        request = locks_pb2.SetValueRequest(name=name, token=token, value=value)
        hold: locks_pb2.Hold = self._call(lambda stub, kw: stub.SetValue(request, **kw))
        return hold

    # ----- reads -----

    def get(self, name: str) -> Optional[LockInfo]:
        """Who holds `name` and who waits for it (a linearizable read); None if nobody holds it."""
        try:
            return LockInfo.from_proto(self._call(lambda stub, kw: stub.Get(locks_pb2.GetRequest(name=name), **kw)))
        except NotFound:
            return None

    def list(self, prefix: str = "", *, after: Optional[str] = None, limit: int = 0) -> ListPage:
        """One page of the held locks whose names start with `prefix`, by name, after `after` (the previous
        page's `next`; None for the first page). `limit`: at most that many (1 to 1000; 0: 100). Each page
        is a linearizable read of its own."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit <= 1000:
            raise InvalidArgument(f"limit is 0 (the server's default) to 1000, got {limit!r}")
        request = locks_pb2.ListRequest(prefix=prefix, after=after or "", limit=limit)
        return ListPage.from_proto(self._call(lambda stub, kw: stub.List(request, **kw)))

    def locks(self, prefix: str = "", *, page_size: int = 0) -> Iterator[LockInfo]:
        """Every held lock whose name starts with `prefix`, by name: `list` page after page (each page a read
        of its own, so locks that change meanwhile may be seen on either side of the change)."""
        after: Optional[str] = None
        while True:
            page = self.list(prefix, after=after, limit=page_size)
            yield from page.locks
            if page.next is None:
                return
            after = page.next

    # ----- watches and elections -----

    def watch(self, name: str, *, prefix: bool = False, after: int = 0) -> Watch:
        """The states of lock `name` (with `prefix=True`: of every lock whose name starts with `name`; ""
        is every lock) as the cluster changes them: see `Watch`. `after`: the revision last seen (a
        `LockInfo.revision`, or a `ListPage.revision` for a prefix), to resume from. Nothing is sent until
        the first `next`."""
        return Watch(self, name, prefix=prefix, after=after)

    def campaign(
        self,
        name: str,
        value: Union[bytes, str],
        *,
        lease: float = ELECTION_LEASE_S,
        timeout: Optional[float] = None,
        owner: Optional[str] = None,
        on_lost: Optional[Callable[[Leadership], None]] = None,
    ) -> Leadership:
        """Campaigns in election `name` (a lock) with a session of `lease` seconds: waits its turn behind the
        candidates before it (at most `timeout` seconds, then `LockTimeout`, leaving the queue), then leads,
        publishing `value` (its address, say; a str as UTF-8), until it resigns or its lease is lost. A
        leader whose process dies is replaced one lease after its last acknowledged heartbeat; one that
        resigns, at once. `on_lost(leadership)` is called on a thread of its own when leadership is lost
        (not when it resigns). See `Leadership`."""
        return campaign(self, name, value, lease=lease, timeout=timeout, owner=owner, on_lost=on_lost)

    def leader(self, name: str) -> Optional[Leader]:
        """Who leads election `name` now (a linearizable read); None if nobody does."""
        return Leader.of(self.get(name))

    def observe(self, name: str) -> Leaders:
        """The leaders of election `name` as they change, starting with the one now (None: nobody leads):
        see `Leaders`."""
        return Leaders(self.watch(name))
