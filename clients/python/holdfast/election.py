"""Leader election on session locks, values and watches, in the shape of etcd's `concurrency.Election`, kazoo's
`Election` and the Rust client's election.rs: `Client.campaign` waits its turn in the lock's FIFO queue and
answers a `Leadership`; `Client.leader` and `Client.observe` tell everyone else who leads. No mechanism of
its own: the leader is the session that holds the election's lock, its value is the lock's value, and its
fence is the grant's, which only grows from one leader to the next.
"""

import contextlib
import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from .errors import SessionLost
from .session import SessionLock
from .types import Leader
from .watch import Watch

if TYPE_CHECKING:
    from .client import Client

#: The session lease `Client.campaign` keeps a leadership with, in seconds: a leader whose process dies is
#: replaced this long after its last acknowledged heartbeat (plus the cluster's failover, if its node died).
ELECTION_LEASE_S = 10.0


class _Won:
    """What a leadership shows whichever way it is waited on (`Leadership`, `holdfast.aio.AsyncLeadership`):
    the election, the fence and session it was won under, and the value published. `lock` is the session
    lock that holds the election's lock (a `SessionLock` or its asyncio twin)."""

    def __init__(self, lock: Any) -> None:
        self._lock = lock
        # Set when the campaign is won; kept after the leadership ends.
        self._fence = 0
        self._session_id = 0
        self._resigned = False

    def _won(self) -> None:
        self._fence, self._session_id = self._lock.fence, self._lock.session_id

    @property
    def name(self) -> str:
        """The election (its lock's name)."""
        return str(self._lock.name)

    @property
    def fence(self) -> int:
        """The fence of this leadership: it grows from one leader to the next."""
        return self._fence

    @property
    def value(self) -> bytes:
        """What this leader publishes."""
        value = self._lock.value
        return value.encode("utf-8") if isinstance(value, str) else bytes(value)

    @property
    def session_id(self) -> int:
        """The public id of the session that leads."""
        return self._session_id


class Leadership(_Won):
    """This process leads an election, for as long as its session keeps the lease. Watch `lost` (a
    `threading.Event`): once it is set, someone else may lead.

    ```
    with client.campaign("service-leader", "10.0.0.1:8080") as leadership:   # waits its turn
        serve_as_leader(leadership.fence, stop=leadership.lost)
    ```

    As a context manager it resigns at exit. `fence` and `value` stay readable after it ended.
    """

    def __init__(self, lock: SessionLock) -> None:
        super().__init__(lock)

    @property
    def lost(self) -> threading.Event:
        """Set the moment leadership is no longer confirmed (the lease ran out by this client's clock, the
        server reported the lock lost) or this leader resigned."""
        return self._lock.lost

    def is_lost(self) -> bool:
        """Whether leadership is no longer confirmed."""
        return self._lock.lost.is_set()

    def proclaim(self, value: Union[bytes, str]) -> None:
        """Publishes `value` (at most 1 KiB; a str as UTF-8) in place of this leader's value (observers see
        it); the fence stays. Raises `SessionLost` if leadership is over (lost or resigned)."""
        if self.is_lost():
            raise SessionLost(f"the leadership of {self.name!r} (fence {self._fence}) is over")
        self._lock.set_value(value)

    def resign(self) -> None:
        """Steps down: `lost` is set, the session closes, and the next candidate in line leads at once.
        Raises `SessionLost` if leadership had been lost before; resigning again does nothing."""
        if self._resigned:
            return
        self._resigned = True
        self._lock.release()

    def __enter__(self) -> "Leadership":
        return self

    def __exit__(self, *exc: object) -> None:
        # The work has seen `lost` if it mattered: leadership lost meanwhile is not an error at exit.
        with contextlib.suppress(SessionLost):
            self.resign()

    def __repr__(self) -> str:
        return f"Leadership(name={self.name!r}, fence={self._fence}, lost={self.is_lost()})"


def campaign(
    client: "Client",
    name: str,
    value: Union[bytes, str],
    *,
    lease: float,
    timeout: Optional[float],
    owner: Optional[str],
    on_lost: Optional[Callable[[Leadership], None]],
) -> Leadership:
    """`Client.campaign`: a session lock on `name` publishing `value`, waited for in the FIFO queue."""
    # The lock refers to its Leadership only weakly, so that a Leadership dropped without a resign is
    # collected and its session closed (as a resign would), like a dropped SessionLock.
    ref: "Optional[weakref.ReferenceType[Leadership]]" = None

    def lost(_: SessionLock) -> None:
        leadership = ref() if ref is not None else None
        if on_lost is not None and leadership is not None:
            on_lost(leadership)

    lock = client.lock(name, lease, value=value, owner=owner, on_lost=lost)
    leadership = Leadership(lock)
    ref = weakref.ref(leadership)
    lock._acquire(True, timeout)
    leadership._won()
    return leadership


class Leaders:
    """The leaders of an election as a watch of its lock sees them (`Client.observe`): an iterator that
    answers the leader now, then each new leader or new value (`None` when nobody leads, also during a
    lock-delay). States that do not touch the leader (candidates joining the queue) are left out. Closable
    as a `Watch` is (`cancel()`, a context manager)."""

    def __init__(self, watch: Watch) -> None:
        self._watch = watch
        self._last: Optional[Leader] = None
        self._answered = False

    @property
    def watch(self) -> Watch:
        """The watch underneath (its `revision` and `resumes`)."""
        return self._watch

    def __iter__(self) -> "Leaders":
        return self

    def __next__(self) -> Optional[Leader]:
        while True:
            leader = Leader.of(next(self._watch))
            if self._answered and leader == self._last:
                continue
            self._answered, self._last = True, leader
            return leader

    def cancel(self) -> None:
        """Ends the iteration (from any thread)."""
        self._watch.cancel()

    close = cancel

    def __enter__(self) -> "Leaders":
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()
