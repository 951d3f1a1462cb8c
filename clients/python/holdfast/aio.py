"""`holdfast.aio`: the asyncio twin of the client, with the same semantics and names.

```
client = holdfast.aio.Client(["10.0.0.1:7070", "10.0.0.2:7070"])
async with client.lock("nightly-import", lease=2.0) as held:   # waits in the FIFO queue
    await run(held.fence)                                       # held.lost: an asyncio.Event

async with client.watch("nightly-import") as watch:
    async for state in watch:                                  # its state now, then after every change
        print(state.revision, state.holder)
```

It is built on the synchronous client: each blocking call runs on a thread of its own (never the loop's
default executor, which a few waiting locks would exhaust) and its outcome is handed back to the event
loop; a session's heartbeats run on the session's own thread, as in the sync client, so a busy event loop
never delays them. Cancelling an awaited acquire (or campaign) withdraws it: a session lock's session is
closed (leaving the queue), and a grant that raced with the cancellation is released at once. A watch reads
its stream on a thread per step; cancelling an awaited step loses nothing (the next step answers it).
"""

import asyncio
import contextlib
import functools
import threading
from typing import Any, AsyncIterator, Callable, Generic, Iterator, List, Optional, Sequence, TypeVar, Union

from . import client as sync
from .election import ELECTION_LEASE_S, Leaders, _Won
from .errors import HoldfastError, SessionLost
from .session import SessionLock
from .types import Leader, ListPage, LockInfo, WatchEvent
from .watch import Watch

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

    async def set_value(self, value: Union[bytes, str]) -> "Hold":
        """As `holdfast.Hold.set_value`."""
        await _in_thread(lambda: self._hold.set_value(value))
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

    @property
    def value(self) -> Union[bytes, str]:
        """What the lock publishes while held (the last value set)."""
        return self._lock.value

    async def set_value(self, value: Union[bytes, str]) -> None:
        """As `holdfast.SessionLock.set_value`."""
        await _in_thread(lambda: self._lock.set_value(value))

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


class AsyncLeadership(_Won):
    """This process leads an election (see `holdfast.Leadership`): `lost` is an `asyncio.Event`,
    `await proclaim(value)`, `await resign()`; `async with` resigns at exit."""

    def __init__(self, lock: AsyncSessionLock) -> None:
        super().__init__(lock)

    @property
    def lost(self) -> asyncio.Event:
        """Set the moment leadership is no longer confirmed, or this leader resigned."""
        return self._lock.lost

    def is_lost(self) -> bool:
        return not self._lock.locked()

    async def proclaim(self, value: Union[bytes, str]) -> None:
        """As `holdfast.Leadership.proclaim`."""
        if self.is_lost():
            raise SessionLost(f"the leadership of {self.name!r} (fence {self._fence}) is over")
        await self._lock.set_value(value)

    async def resign(self) -> None:
        """As `holdfast.Leadership.resign`: resigning again does nothing."""
        if self._resigned:
            return
        self._resigned = True
        await self._lock.release()

    async def __aenter__(self) -> "AsyncLeadership":
        return self

    async def __aexit__(self, *exc: object) -> None:
        with contextlib.suppress(SessionLost):
            await self.resign()


_END = object()
Item = TypeVar("Item")
StepsT = TypeVar("StepsT", bound="_Steps[Any]")


class _Steps(Generic[Item]):
    """An async iterator over a blocking iterator that `cancel()` ends (a watch): each step runs on a thread
    of its own. A step whose awaiting task was cancelled goes on, and the next `__anext__` answers it, so
    nothing is lost."""

    def __init__(self, source: Iterator[Item], cancel: Callable[[], None]) -> None:
        self._source = source
        self._cancel = cancel
        self._pending: "Optional[asyncio.Future[Any]]" = None

    def __aiter__(self: StepsT) -> StepsT:
        return self

    async def __anext__(self) -> Item:
        if self._pending is None:
            self._pending = _in_thread(lambda: next(self._source, _END))
        try:
            item = await asyncio.shield(self._pending)
        except asyncio.CancelledError:
            raise  # the step goes on; the next __anext__ awaits it
        except BaseException:
            self._pending = None
            raise
        self._pending = None
        if item is _END:
            raise StopAsyncIteration
        return item  # type: ignore[no-any-return]

    def cancel(self) -> None:
        """Ends the iteration (from any thread)."""
        self._cancel()

    async def aclose(self) -> None:
        self.cancel()

    async def __aenter__(self: StepsT) -> StepsT:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cancel()


class AsyncWatch(_Steps[WatchEvent]):
    """A watch (see `holdfast.Watch`): `async for state in watch`, `cancel()`, `async with`."""

    def __init__(self, watch: Watch) -> None:
        super().__init__(watch, watch.cancel)
        self._watch = watch

    @property
    def revision(self) -> int:
        """As `holdfast.Watch.revision`."""
        return self._watch.revision

    @property
    def resumes(self) -> int:
        """As `holdfast.Watch.resumes`."""
        return self._watch.resumes


class AsyncLeaders(_Steps[Optional[Leader]]):
    """The leaders of an election (see `holdfast.Leaders`): `async for leader in leaders` (None: nobody
    leads), `cancel()`, `async with`."""

    def __init__(self, leaders: Leaders) -> None:
        super().__init__(leaders, leaders.cancel)


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

    async def list(self, prefix: str = "", *, after: Optional[str] = None, limit: int = 0) -> ListPage:
        """As `holdfast.Client.list`: one page."""
        return await _in_thread(lambda: self._client.list(prefix, after=after, limit=limit))

    async def locks(self, prefix: str = "", *, page_size: int = 0) -> AsyncIterator[LockInfo]:
        """As `holdfast.Client.locks`: every held lock under `prefix`, page after page."""
        after: Optional[str] = None
        while True:
            page = await self.list(prefix, after=after, limit=page_size)
            for lock in page.locks:
                yield lock
            if page.next is None:
                return
            after = page.next

    def watch(self, name: str, *, prefix: bool = False, after: int = 0) -> AsyncWatch:
        """As `holdfast.Client.watch`: `async for state in client.watch(name)`."""
        return AsyncWatch(self._client.watch(name, prefix=prefix, after=after))

    async def campaign(
        self,
        name: str,
        value: Union[bytes, str],
        *,
        lease: float = ELECTION_LEASE_S,
        timeout: Optional[float] = None,
        owner: Optional[str] = None,
        on_lost: Optional[Callable[[AsyncLeadership], None]] = None,
    ) -> AsyncLeadership:
        """As `holdfast.Client.campaign`; `on_lost(leadership)` is called on the event loop. Cancelling it
        leaves the queue (a grant that raced with the cancellation is resigned at once)."""
        leadership: Optional[AsyncLeadership] = None

        def lost(_: AsyncSessionLock) -> None:
            if on_lost is not None and leadership is not None:
                on_lost(leadership)

        lock = self.lock(name, lease, value=value, timeout=timeout, owner=owner, on_lost=lost)
        leadership = AsyncLeadership(lock)
        await lock._take(lock._lock.__enter__)
        leadership._won()
        return leadership

    async def leader(self, name: str) -> Optional[Leader]:
        """As `holdfast.Client.leader`: None if nobody leads."""
        return await _in_thread(lambda: self._client.leader(name))

    def observe(self, name: str) -> AsyncLeaders:
        """As `holdfast.Client.observe`: `async for leader in client.observe(name)`."""
        return AsyncLeaders(self._client.observe(name))

    def lock(
        self,
        name: str,
        lease: float = 2.0,
        *,
        on_lost: Optional[Callable[[AsyncSessionLock], None]] = None,
        **options: Any,
    ) -> AsyncSessionLock:
        """As `holdfast.Client.lock` (`blocking`, `timeout`, `value`, `limit`, `lock_delay`, `owner`);
        `on_lost(lock)` is called on the event loop."""
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


__all__ = ["AsyncLeaders", "AsyncLeadership", "AsyncSessionLock", "AsyncWatch", "Client", "Hold"]
