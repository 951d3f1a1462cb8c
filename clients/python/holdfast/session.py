"""Session locks: `SessionLock` (what `Client.lock` returns) on a `_Session` (one Session stream and its lease).

Each acquisition of a `SessionLock` opens a session of its own, holding that one lock, and its release
closes it: a clean close hands the lock to the next waiter in the same log entry, and withdraws a wait that
timed out. The session's lease is kept by this client's monotonic clock, counted from the SEND instant of
each acknowledged heartbeat (the first from the send of `Open`): when the confirmed span ends with no newer
ack, the lock is lost at once, whatever the network does, and a late ack never revives it
(docs/client.md, "The lease and losing it").

Threads: a reader per stream (turns events into state, under one condition variable) and a keeper per
session (heartbeats every lease/4, declares the lease lost at its end, and resumes the session through
another endpoint when the stream breaks or no ack came for half a lease).
"""

import contextlib
import queue
import threading
import time
import weakref
from typing import TYPE_CHECKING, Callable, Dict, Iterator, Optional, Set, Union

import grpc

from ._wire import MAX_ATTEMPTS, RETRY_TIMEOUT_S, ms, pause, value_bytes
from .errors import (
    HoldfastError,
    LockBusy,
    LockTimeout,
    SessionLost,
    Unavailable,
    error_from_problem,
    error_from_rpc,
)
from .types import Holder
from .v1 import locks_pb2

if TYPE_CHECKING:
    from .client import Client

_UNAVAILABLE_SLUG = "urn:holdfast:unavailable"


class _Stream:
    """One Session stream: a queue of requests the gRPC call reads, and the call."""

    def __init__(self, client: "Client", index: int) -> None:
        self.index = index
        self._requests: "queue.Queue[Optional[locks_pb2.SessionRequest]]" = queue.Queue()
        self.call = client._stub(index).Session(self._iterate(), metadata=client._metadata)

    def _iterate(self) -> Iterator[locks_pb2.SessionRequest]:
        while True:
            request = self._requests.get()
            if request is None:
                return
            yield request

    def send(self, request: locks_pb2.SessionRequest) -> None:
        """Queues `request` for sending (never blocks)."""
        self._requests.put(request)

    def end(self) -> None:
        """Ends the client's side and tears the call down."""
        self._requests.put(None)
        self.call.cancel()


class _Session:
    """A session holding (or waiting for) one lock: its stream, its lease, and what the server answered."""

    def __init__(self, client: "Client", lease: float, owner: str, on_lost: Callable[[], None]) -> None:
        self._client = client
        self._lease_s = lease
        self._owner = owner
        self._on_lost = on_lost
        self._cond = threading.Condition()
        self.lost = threading.Event()
        self.lost_reason = ""
        self.id = 0
        self._secret = ""
        self._stream: Optional[_Stream] = None
        self._stream_error: Optional[HoldfastError] = None
        self._opened = False
        self._confirmed_until = 0.0
        # When the current stream started, or last brought an ack: no ack for half a lease means a hung node.
        self._alive_at = 0.0
        self._seq = 0
        self._heartbeats_sent: Dict[int, float] = {}
        self._closing = False
        # The one claim of this session: the acquire last sent, and what answered it.
        self._acquire: Optional[locks_pb2.SessionAcquire] = None
        self._answered = False
        self._held: Optional[locks_pb2.Acquired] = None
        self._busy: Optional[LockBusy] = None
        self._failed: Optional[HoldfastError] = None
        # After a resume: the heartbeat whose ack closes the server's report, and what it re-reported.
        self._resume_seq: Optional[int] = None
        self._reported: Set[str] = set()

    # ----- opening -----

    def open(self) -> None:
        """Opens the session through the first endpoint that answers, within the client's retry bounds
        (`MAX_ATTEMPTS`, `RETRY_TIMEOUT_S`); raises `Unavailable` if none did, or if the open took more
        than half the lease, and the server's refusal (`InvalidArgument`, `LimitReached`, `Overloaded`) as
        it comes."""
        lease_ms = ms(self._lease_s, "lease")
        start = time.monotonic()
        first = self._client._preferred
        n = len(self._client._targets)
        attempt = 0
        while True:
            if attempt and attempt % n == 0:
                pause(attempt // n)
            index = (first + attempt) % n
            attempt += 1
            sent = time.monotonic()
            with self._cond:
                self._start_stream(index)
                assert self._stream is not None
                self._stream.send(locks_pb2.SessionRequest(open=locks_pb2.Open(owner=self._owner, lease_ms=lease_ms)))
                deadline = sent + self._client.request_timeout
                while not self._opened and self._stream_error is None and time.monotonic() < deadline:
                    self._cond.wait(deadline - time.monotonic())
                if self._opened:
                    break
                error = self._stream_error or Unavailable("no answer to Open in time")
                self._stream.end()
            if (
                not isinstance(error, Unavailable)
                or attempt >= MAX_ATTEMPTS
                or time.monotonic() - start > RETRY_TIMEOUT_S
            ):
                raise error
        with self._cond:
            self._confirmed_until = sent + self._lease_s
        if time.monotonic() - sent > self._lease_s / 2:
            self.close()
            raise Unavailable("the session opened too slowly (more than half its lease): open another")
        threading.Thread(target=self._keep, name=f"holdfast-session-{self.id}", daemon=True).start()

    def _start_stream(self, index: int) -> None:
        """Starts a stream on endpoint `index` and its reader thread (caller holds the condition)."""
        self._stream = _Stream(self._client, index)
        self._stream_error = None
        self._alive_at = time.monotonic()
        threading.Thread(target=self._read, args=(self._stream,), name="holdfast-session-reader", daemon=True).start()

    # ----- reading -----

    def _read(self, stream: _Stream) -> None:
        """Turns the stream's events into state until it ends; then records how it ended."""
        error: HoldfastError
        try:
            for event in stream.call:
                with self._cond:
                    if stream is self._stream:
                        self._handle(event)
                        self._cond.notify_all()
            error = Unavailable("the session stream ended")
        except grpc.RpcError as rpc_error:
            error = error_from_rpc(rpc_error)
        with self._cond:
            if stream is self._stream:
                self._stream_error = error
                if isinstance(error, SessionLost):
                    self._declare_lost("the session is gone (expired or closed on the cluster)")
                self._cond.notify_all()

    def _handle(self, event: locks_pb2.SessionEvent) -> None:
        """Applies one event (caller holds the condition)."""
        kind = event.WhichOneof("kind")
        if kind == "opened":
            self._opened = True
            if event.opened.secret:  # empty in the Opened that answers a Resume
                self.id, self._secret = event.opened.session_id, event.opened.secret
            if event.opened.lease_ms:  # a different lease granted: count with the shorter
                self._lease_s = min(self._lease_s, event.opened.lease_ms / 1000)
        elif kind == "acquired":
            self._held, self._answered = event.acquired, True
            self._reported.add(event.acquired.name)
        elif kind == "waiting":
            self._answered = True
            self._reported.add(event.waiting.name)
        elif kind == "busy":
            holder = Holder.from_proto(event.busy.holder) if event.busy.HasField("holder") else None
            self._busy, self._answered = LockBusy(holder), True
        elif kind == "heartbeat_ack":
            sent = self._heartbeats_sent.pop(event.heartbeat_ack.seq, None)
            # Older heartbeats still unanswered confirm nothing this ack does not (it was sent later).
            for seq in [s for s in self._heartbeats_sent if s < event.heartbeat_ack.seq]:
                del self._heartbeats_sent[seq]
            self._alive_at = time.monotonic()
            if sent is not None and not self.lost.is_set():
                self._confirmed_until = max(self._confirmed_until, sent + self._lease_s)
            if event.heartbeat_ack.seq == self._resume_seq:
                self._resume_seq = None
                if self._held is not None and self._held.name not in self._reported:
                    self._declare_lost("the lock was not re-reported after a resume")
        elif kind == "lost":
            self._declare_lost(f"the server reported the lock lost ({event.lost.reason})")
        elif kind == "error":
            self._handle_error(event.error)
        # released, value_set: nothing to do; a release is a close here.

    def _handle_error(self, error: locks_pb2.SessionError) -> None:
        """A failed request: an acquire's failure answers it; `unavailable` means "no answer yet", so the
        acquire is sent again (with the next heartbeat); a heartbeat's `unavailable` confirms nothing."""
        if not error.name or self._acquire is None or error.name != self._acquire.name:
            return
        if error.type == _UNAVAILABLE_SLUG:
            self._answered = False
            return
        self._failed, self._answered = error_from_problem(None, error.type, error.detail), True

    def _declare_lost(self, reason: str) -> None:
        """Marks the session lost for good (caller holds the condition); `on_lost` runs on its own thread."""
        if self.lost.is_set():
            return
        self.lost_reason = reason
        self.lost.set()
        self._cond.notify_all()
        if not self._closing:
            threading.Thread(target=self._on_lost, name="holdfast-on-lost", daemon=True).start()

    # ----- keeping the lease -----

    def _keep(self) -> None:
        """Heartbeats every lease/4 and watches the lease, until the session is lost or closed."""
        next_heartbeat = time.monotonic()
        with self._cond:
            while not self.lost.is_set() and not self._closing:
                now = time.monotonic()
                if now >= self._confirmed_until:
                    self._declare_lost("the lease ran out by the client's clock (no heartbeat acknowledged in time)")
                    break
                # A broken stream, or no ack for half a lease (a hung node): resume elsewhere.
                if self._stream_error is not None or now - self._alive_at >= self._lease_s / 2:
                    self._resume()
                    next_heartbeat = time.monotonic()
                    continue
                if now >= next_heartbeat:
                    self._heartbeat()
                    if self._acquire is not None and not self._answered:
                        self._send(locks_pb2.SessionRequest(acquire=self._acquire))
                    next_heartbeat = now + self._lease_s / 4
                self._cond.wait(max(0.0, min(next_heartbeat, self._confirmed_until) - time.monotonic()))
            if self._stream is not None and not self._closing:
                self._stream.end()

    def _heartbeat(self) -> int:
        """Sends a heartbeat, recording its send instant (caller holds the condition)."""
        self._seq += 1
        self._heartbeats_sent[self._seq] = time.monotonic()
        self._send(locks_pb2.SessionRequest(heartbeat=locks_pb2.Heartbeat(seq=self._seq)))
        return self._seq

    def _send(self, request: locks_pb2.SessionRequest) -> None:
        assert self._stream is not None
        self._stream.send(request)

    def _resume(self) -> None:
        """Moves the session to the next endpoints in turn with `Resume`, while the lease lasts by this
        client's clock (caller holds the condition; it is released while waiting)."""
        assert self._stream is not None
        old = self._stream
        old.end()
        n = len(self._client._targets)
        attempt = 1
        while not self.lost.is_set() and not self._closing:
            if time.monotonic() >= self._confirmed_until:
                self._declare_lost("the lease ran out before the session could be resumed")
                return
            self._opened = False
            self._reported = set()
            self._start_stream((old.index + attempt) % n)
            attempt += 1
            self._send(locks_pb2.SessionRequest(resume=locks_pb2.Resume(session_id=self.id, secret=self._secret)))
            deadline = min(self._confirmed_until, time.monotonic() + self._client.request_timeout)
            while not self._opened and self._stream_error is None and time.monotonic() < deadline:
                self._cond.wait(deadline - time.monotonic())
            if self._opened:
                # Resuming does not extend the lease: heartbeat at once; its ack closes the re-report.
                self._resume_seq = self._heartbeat()
                if self._acquire is not None and not self._answered:
                    self._send(locks_pb2.SessionRequest(acquire=self._acquire))
                return
            assert self._stream is not None
            self._stream.end()
            if self._stream_error is not None and not isinstance(self._stream_error, Unavailable):
                # session-gone, a wrong secret, ...: this session cannot be resumed anywhere.
                self._declare_lost(f"the session could not be resumed: {self._stream_error}")
            if self.lost.is_set():
                return
            if attempt % n == 1:
                self._cond.wait(0.05)

    # ----- the claim -----

    def acquire(
        self, name: str, *, wait: bool, value: bytes, limit: int, lock_delay_ms: int, timeout: Optional[float]
    ) -> locks_pb2.Acquired:
        """Asks for `name`; returns the grant. Raises `LockBusy` (a try-lock found it held), `LockTimeout`
        (not granted within `timeout` seconds), `SessionLost`, or the error the server answered."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._acquire = locks_pb2.SessionAcquire(
                name=name, wait=wait, value=value, limit=limit, lock_delay_ms=lock_delay_ms
            )
            self._send(locks_pb2.SessionRequest(acquire=self._acquire))
            while True:
                if self._held is not None:
                    return self._held
                if self._busy is not None:
                    raise self._busy
                if self._failed is not None:
                    raise self._failed
                if self.lost.is_set():
                    raise SessionLost(self.lost_reason)
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise LockTimeout(f"lock {name!r} was not granted within {timeout} s")
                self._cond.wait(remaining)

    def close(self) -> None:
        """Ends the session cleanly: `lost` is set first, then `Close` hands the lock to the next waiter
        and withdraws any wait, in one log entry. If the cluster cannot be reached within the request
        timeout, the session ends when its lease runs out."""
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self.lost_reason = self.lost_reason or "released"
            self.lost.set()
            self._cond.notify_all()
            stream = self._stream
            if stream is None:
                return
            stream.send(locks_pb2.SessionRequest(close=locks_pb2.Close()))
            deadline = time.monotonic() + self._client.request_timeout
            while self._stream_error is None and time.monotonic() < deadline:
                self._cond.wait(deadline - time.monotonic())
        stream.end()


class SessionLock:
    """A lock held through a session, in the manner of `threading.Lock` and redis-py's `Lock`.

    ```
    with client.lock("nightly-import", lease=2.0) as held:   # waits in the FIFO queue
        run(held.fence)                                       # held.lost: a threading.Event
    ```

    Each `acquire` opens a session of its own with a lease of `lease` seconds (heartbeats every lease/4
    on a background thread), and `release` closes it, handing the lock to the next waiter at once.
    `lost` is set the moment ownership can no longer be confirmed (the lease ran out by this client's
    clock, the server reported the lock or session lost, or it was released); `on_lost(lock)` is then
    called on a thread of its own (not when the lock is released). Pass `fence` to the protected resource.

    As a context manager it acquires with the `blocking` and `timeout` given to `Client.lock`, raising
    `LockBusy` (a non-blocking lock that is taken) or `LockTimeout` (the timeout ran out) instead of
    returning False, and releases at exit.

    `value` is what the lock publishes while held (reads, busy answers and watches show it; `set_value`
    publishes another). `lock_delay` (seconds): if the session's lease runs out while it holds the lock,
    nobody is granted the lock for that long after (a release frees it at once).
    """

    def __init__(
        self,
        client: "Client",
        name: str,
        *,
        lease: float,
        blocking: bool,
        timeout: Optional[float],
        value: Union[bytes, str],
        limit: int,
        lock_delay: float,
        owner: str,
        on_lost: Optional[Callable[["SessionLock"], None]],
    ) -> None:
        self._client = client
        self.name = name
        self.lease = lease
        self.blocking = blocking
        self.timeout = timeout
        #: What the lock publishes while held (the last value set).
        self.value: Union[bytes, str] = value
        self.limit = limit
        self.lock_delay = lock_delay
        self.owner = owner
        self._on_lost = on_lost
        self._session: Optional[_Session] = None
        self._grant: Optional[locks_pb2.Acquired] = None
        self._close_session: Optional[weakref.finalize] = None
        # An acquire in progress, which `_abandon` (another thread) may close: the asyncio twin's cancellation.
        self._pending_lock = threading.Lock()
        self._pending: Optional[_Session] = None
        self._abandoned = False
        #: Set when the lock is lost or released; a fresh (unset) Event after each acquire.
        self.lost = threading.Event()

    @property
    def fence(self) -> int:
        """The grant's fence: pass it to the protected resource so it can turn away stale holders."""
        return self._require_grant().fence

    @property
    def token(self) -> str:
        """The grant's secret token (for `SetValue`; a session's hold is released through its session)."""
        return self._require_grant().token

    @property
    def session_id(self) -> int:
        """The public id of the session that holds the lock (reads show it beside the holder)."""
        if self._session is None:
            raise RuntimeError(f"lock {self.name!r} is not acquired")
        return self._session.id

    def _require_grant(self) -> locks_pb2.Acquired:
        if self._grant is None:
            raise RuntimeError(f"lock {self.name!r} is not acquired")
        return self._grant

    def locked(self) -> bool:
        """Whether this object holds the lock and ownership is still confirmed."""
        return self._grant is not None and not self.lost.is_set()

    def acquire(self, blocking: Optional[bool] = None, timeout: Optional[float] = None) -> bool:
        """Takes the lock: True when held. `blocking=False`: a try-lock, False at once if someone else
        holds it. `timeout` (seconds): wait in the queue at most that long, then False (the session is
        closed, which withdraws the wait). Either left None: the value given to `Client.lock`. Raises
        `InvalidArgument` (bad name, lease, value or limit), `LimitMismatch`, `Unavailable` (no endpoint
        answered), `SessionLost`."""
        try:
            self._acquire(self.blocking if blocking is None else blocking, self.timeout if timeout is None else timeout)
        except (LockBusy, LockTimeout):
            return False
        return True

    def _acquire(self, blocking: bool, timeout: Optional[float]) -> None:
        if self._session is not None:
            raise RuntimeError(f"lock {self.name!r} is already acquired by this object: release it first")
        if timeout is not None and timeout < 0:
            raise ValueError("timeout must not be negative")
        # Checked before the session opens: a bad argument sends nothing.
        value = value_bytes(self.value)
        lock_delay_ms = ms(self.lock_delay, "lock_delay")
        # The session refers to this object only weakly, so that a lock dropped without a release is
        # collected, and its finalizer closes the session (as a release would; also at interpreter exit).
        me = weakref.ref(self)
        on_lost = self._on_lost

        def lost_callback() -> None:
            lock = me()
            if on_lost is not None and lock is not None:
                on_lost(lock)

        session = _Session(self._client, self.lease, self.owner, lost_callback)
        session.open()
        with self._pending_lock:
            abandoned, self._pending = self._abandoned, session
        try:
            if abandoned:
                raise SessionLost("the acquire was abandoned")
            self._grant = session.acquire(
                self.name, wait=blocking, value=value, limit=self.limit, lock_delay_ms=lock_delay_ms, timeout=timeout
            )
        except BaseException:
            session.close()
            raise
        finally:
            with self._pending_lock:
                self._pending = None
        self._session = session
        self.lost = session.lost
        self._close_session = weakref.finalize(self, session.close)

    def _abandon(self) -> None:
        """Gives up the acquire in progress on another thread: its session is closed, which withdraws its
        wait, and it raises `SessionLost`; an acquire not yet started gives up when it starts."""
        with self._pending_lock:
            self._abandoned = True
            pending = self._pending
        if pending is not None:
            pending.close()

    def set_value(self, value: Union[bytes, str]) -> None:
        """Publishes `value` (at most 1 KiB; a str as UTF-8) in place of the lock's value: one log entry, the
        fence stays, watchers see it. Raises `SessionLost` if the lock is already lost, `NotHolder` if the
        cluster says the grant no longer holds it; `Unavailable` leaves it unknown (setting it again is
        harmless)."""
        data = value_bytes(value)
        grant = self._require_grant()
        if self.lost.is_set():
            reason = self._session.lost_reason if self._session is not None else "lost"
            raise SessionLost(f"lock {self.name!r} is lost ({reason})")
        self._client._set_value(self.name, grant.token, data)
        self.value = data

    def release(self) -> None:
        """Lets go: `lost` is set, then the session is closed and the next waiter granted at once. Raises
        `SessionLost` if the lock had already been lost (someone else may have had it since)."""
        session, close_session = self._session, self._close_session
        if session is None or close_session is None:
            raise RuntimeError(f"lock {self.name!r} is not acquired")
        was_lost = session.lost.is_set()
        self._session, self._grant, self._close_session = None, None, None
        close_session()
        if was_lost:
            raise SessionLost(session.lost_reason)

    def __enter__(self) -> "SessionLock":
        self._acquire(self.blocking, self.timeout)
        return self

    def __exit__(self, *exc: object) -> None:
        # The work has seen `lost` if it mattered: a lock lost meanwhile is not an error at exit.
        with contextlib.suppress(SessionLost):
            self.release()

    def __repr__(self) -> str:
        state = f"fence={self._grant.fence}" if self._grant is not None else "not acquired"
        return f"SessionLock(name={self.name!r}, lease={self.lease}, {state})"
