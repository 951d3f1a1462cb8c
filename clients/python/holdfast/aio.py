"""`holdfast.aio`: the asyncio twin of the client, with the same semantics and names.

```
client = holdfast.aio.Client(["10.0.0.1:7070", "10.0.0.2:7070"])
async with client.lock("nightly-import", lease=2.0) as held:   # waits in the FIFO queue
    await run(held.fence)                                       # held.lost: an asyncio.Event
```

It is built on the synchronous client: each blocking call runs on a thread of its own (never the loop's
default executor, which a few waiting locks would exhaust) and its outcome is handed back to the event
loop; a session's heartbeats run on the session's own thread, as in the sync client, so a busy event loop
never delays them. Cancelling an awaited acquire withdraws it: a session lock's session is closed (leaving
the queue), and a grant that raced with the cancellation is released at once.
"""

import asyncio
import contextlib
import functools
import threading
from typing import Any, Callable, List, Optional, Sequence, TypeVar, Union

from . import client as sync
from .errors import HoldfastError
from .session import SessionLock
from .types import LockInfo

T = TypeVar("T")


def _in_thread(call: Callable[[], T], orphan: Optional[Callable[[T], None]] = None) -> "asyncio.Future[T]":
    """Runs `call` on a new thread; the future answers its outcome on the running loop. If the future was
    cancelled before the outcome arrived, `orphan(result)` runs on a thread (to undo a grant nobody awaits)."""
    loop = asyncio.get_running_loop()
    future: "asyncio.Future[T]" = loop.create_future()

    def deliver(outcome: Callable[[], None], result: Any) -> None:
        if not future.cancelled():
            outcome()
        elif orphan is not None and result is not None:
            threading.Thread(target=orphan, args=(result,), name="holdfast-aio-orphan", daemon=True).start()

    def run() -> None:
        try:
            result = call()
        except BaseException as error:  # handed to the awaiting task, as a direct call would raise it
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody awaits any more
                loop.call_soon_threadsafe(deliver, functools.partial(future.set_exception, error), None)
        else:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(deliver, functools.partial(future.set_result, result), result)

    threading.Thread(target=run, name="holdfast-aio", daemon=True).start()
    return future


class Hold:
    """A one-shot TTL hold (see `holdfast.Hold`), with awaitable `renew` and `release`; `async with`
    releases it."""

    def __init__(self, hold: sync.Hold) -> None:
        self._hold = hold

    name = property(lambda self: self._hold.name, doc="The lock's name.")
    owner = property(lambda self: self._hold.owner, doc="Who holds it.")
    token = property(lambda self: self._hold.token, doc="The secret that renews and releases the hold.")
    fence = property(lambda self: self._hold.fence, doc="The grant's fence: pass it to the protected resource.")
    granted_at_ms = property(lambda self: self._hold.granted_at_ms, doc="Leader time of the grant.")
    expires_at_ms = property(lambda self: self._hold.expires_at_ms, doc="Leader time of the hold's end.")
    ttl_ms = property(lambda self: self._hold.ttl_ms, doc="The hold's TTL.")
    value = property(lambda self: self._hold.value, doc="What the hold publishes.")

    async def renew(self, ttl: Optional[float] = None) -> "Hold":
        """As `holdfast.Hold.renew`."""
        await _in_thread(lambda: self._hold.renew(ttl))
        return self

    async def release(self) -> int:
        """As `holdfast.Hold.release`: returns the hold's fence."""
        return await _in_thread(self._hold.release)

    async def __aenter__(self) -> "Hold":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release()

    def __repr__(self) -> str:
        return f"aio.{self._hold!r}"


class AsyncSessionLock:
    """A session lock (see `holdfast.SessionLock`): `await lock.acquire(...)`, `await lock.release()`,
    `async with`; `lost` is an `asyncio.Event`, and `on_lost(lock)` is called on the event loop."""

    def __init__(self, lock: SessionLock, on_lost: Optional[Callable[["AsyncSessionLock"], None]]) -> None:
        self._lock = lock
        self._on_lost = on_lost
        self._lost: Optional[asyncio.Event] = None

    @property
    def lost(self) -> asyncio.Event:
        """Set when the lock is lost or released; a fresh (unset) Event after each acquire. (Made on first
        use, on the running loop.)"""
        if self._lost is None:
            self._lost = asyncio.Event()
        return self._lost

    @property
    def name(self) -> str:
        return self._lock.name

    @property
    def fence(self) -> int:
        """The grant's fence: pass it to the protected resource."""
        return self._lock.fence

    @property
    def token(self) -> str:
        return self._lock.token

    @property
    def session_id(self) -> int:
        return self._lock.session_id

    def locked(self) -> bool:
        """Whether this object holds the lock and ownership is still confirmed."""
        return self._lock.locked()

    async def acquire(self, blocking: Optional[bool] = None, timeout: Optional[float] = None) -> bool:
        """As `holdfast.SessionLock.acquire` (False for busy or timed out)."""
        return await self._take(lambda: self._lock.acquire(blocking, timeout))

    async def _take(self, take: Callable[[], Any]) -> Any:
        """Runs a blocking acquire on a thread; on cancellation, withdraws it (or releases a raced grant)."""
        loop = asyncio.get_running_loop()
        if self._on_lost is not None:
            on_lost = self._on_lost

            def on_lost_in_loop(_: SessionLock) -> None:
                loop.call_soon_threadsafe(on_lost, self)

            self._lock._on_lost = on_lost_in_loop
        self._lock._abandoned = False
        try:
            result = await _in_thread(take, orphan=lambda _: self._release_quietly())
        except asyncio.CancelledError:
            self._lock._abandon()
            raise
        self._lost = event = asyncio.Event()
        if self._lock.locked() or self._lock.lost.is_set():
            lost = self._lock.lost
            threading.Thread(
                target=lambda: (lost.wait(), loop.call_soon_threadsafe(event.set)),
                name="holdfast-aio-lost",
                daemon=True,
            ).start()
        return result

    def _release_quietly(self) -> None:
        with contextlib.suppress(HoldfastError, RuntimeError):
            self._lock.release()

    async def release(self) -> None:
        """As `holdfast.SessionLock.release`."""
        await _in_thread(self._lock.release)

    async def __aenter__(self) -> "AsyncSessionLock":
        """Acquires as `with holdfast.SessionLock` does: `LockBusy` or `LockTimeout` instead of False."""
        await self._take(self._lock.__enter__)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await _in_thread(lambda: self._lock.__exit__(*exc))


class Client:
    """The asyncio twin of `holdfast.Client`: the same endpoints and options, awaitable calls."""

    def __init__(self, endpoints: Union[str, Sequence[str]], **options: Any) -> None:
        self._client = sync.Client(endpoints, **options)

    @property
    def owner(self) -> str:
        return self._client.owner

    @property
    def endpoints(self) -> List[str]:
        return self._client.endpoints

    async def acquire(self, name: str, **options: Any) -> Hold:
        """As `holdfast.Client.acquire` (`ttl`, `wait`, `owner`, `value`, `limit`, `lock_delay`). A
        cancelled waiting acquire that is granted after all is released at once."""
        hold = await _in_thread(
            lambda: self._client.acquire(name, **options),
            orphan=lambda granted: _release_quietly(granted),
        )
        return Hold(hold)

    async def get(self, name: str) -> Optional[LockInfo]:
        """As `holdfast.Client.get`: None if nobody holds the lock."""
        return await _in_thread(lambda: self._client.get(name))

    def lock(
        self,
        name: str,
        lease: float = 2.0,
        *,
        on_lost: Optional[Callable[[AsyncSessionLock], None]] = None,
        **options: Any,
    ) -> AsyncSessionLock:
        """As `holdfast.Client.lock` (`blocking`, `timeout`, `value`, `limit`, `owner`); `on_lost(lock)` is
        called on the event loop."""
        return AsyncSessionLock(self._client.lock(name, lease, **options), on_lost)

    async def close(self) -> None:
        """Closes the channels."""
        self._client.close()

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _release_quietly(hold: sync.Hold) -> None:
    with contextlib.suppress(HoldfastError):
        hold.release()


__all__ = ["AsyncSessionLock", "Client", "Hold"]
