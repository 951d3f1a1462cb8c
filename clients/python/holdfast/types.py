"""What the cluster answers about locks: holders, waiters, a lock's state, watch events, list pages and
leaders, as plain dataclasses."""

from dataclasses import dataclass, field, fields
from typing import List, Optional

from .v1 import locks_pb2


@dataclass(frozen=True)
class Holder:
    """Who holds a lock (or, with `free_at_ms`, whose expired hold keeps it in its lock-delay)."""

    owner: str
    fence: int
    granted_at_ms: int
    #: Set for a TTL hold; None for a session's hold (its session keeps it).
    expires_at_ms: Optional[int]
    ttl_ms: Optional[int]
    #: Set for a session's hold.
    session_id: Optional[int]
    value: bytes
    #: Set when nobody holds the lock: the hold shown expired with a lock-delay, and nobody is granted the
    #: lock before this time (leader time, ms since the Unix epoch).
    free_at_ms: Optional[int]

    @classmethod
    def from_proto(cls, holder: locks_pb2.Holder) -> "Holder":
        """Converts the wire message (0 meaning "not set")."""
        return cls(
            owner=holder.owner,
            fence=holder.fence,
            granted_at_ms=holder.granted_at_ms,
            expires_at_ms=holder.expires_at_ms or None,
            ttl_ms=holder.ttl_ms or None,
            session_id=holder.session_id or None,
            value=holder.value,
            free_at_ms=holder.free_at_ms or None,
        )

    @property
    def is_live(self) -> bool:
        """Whether this holder holds the lock now (False during a lock-delay)."""
        return self.free_at_ms is None


@dataclass(frozen=True)
class Waiter:
    """One place in a lock's FIFO queue."""

    owner: str
    queued_at_ms: int
    #: Set for a session's wait; None for a one-shot waiter.
    session_id: Optional[int]


@dataclass(frozen=True)
class LockInfo:
    """A lock's state, as `Client.get` reads it (a linearizable read)."""

    name: str
    #: The first of `holders`.
    holder: Optional[Holder]
    #: Every holder, ordered by fence: one for a lock, up to `limit` for a semaphore.
    holders: List[Holder] = field(default_factory=list)
    #: How many may hold it at once: 1 for a lock.
    limit: int = 1
    #: Next in line first.
    waiters: List[Waiter] = field(default_factory=list)
    #: The log index of the lock's last change.
    revision: int = 0

    @classmethod
    def from_proto(cls, lock: locks_pb2.Lock) -> "LockInfo":
        """Converts the wire message."""
        return cls(
            name=lock.name,
            holder=Holder.from_proto(lock.holder) if lock.HasField("holder") else None,
            holders=[Holder.from_proto(h) for h in lock.holders],
            limit=lock.limit or 1,
            waiters=[Waiter(w.owner, w.queued_at_ms, w.session_id or None) for w in lock.waiters],
            revision=lock.revision,
        )


@dataclass(frozen=True)
class WatchEvent(LockInfo):
    """A lock's state as a watch answers it: after one change, or (`initial`) as it was when a stream of the
    watch began. `holder` is None when nobody holds the lock."""

    #: The state when a stream of the watch began, not one change: the first event, and the first after a
    #: resume that found the lock changed (the changes in between are not replayed; compare revisions).
    initial: bool = False

    @classmethod
    def from_event(cls, event: locks_pb2.WatchEvent) -> "WatchEvent":
        """Converts the wire message (which must carry a lock)."""
        lock = LockInfo.from_proto(event.lock)
        return cls(**{f.name: getattr(lock, f.name) for f in fields(LockInfo)}, initial=event.initial)


@dataclass(frozen=True)
class ListPage:
    """One page of `Client.list`: held locks by name."""

    locks: List[LockInfo]
    #: Pass as `after` for the next page; None when this page was the last.
    next: Optional[str]
    #: The log index the page was read at: a prefix watch with `after=revision` misses nothing since.
    revision: int

    @classmethod
    def from_proto(cls, page: locks_pb2.ListResponse) -> "ListPage":
        """Converts the wire message (an empty `next` meaning the last page)."""
        return cls([LockInfo.from_proto(lock) for lock in page.locks], page.next or None, page.revision)


@dataclass(frozen=True)
class Leader:
    """Who leads an election: the live holder of its lock."""

    #: What the leader published (its address, say).
    value: bytes
    #: The fence of its leadership: it grows from one leader to the next. Pass it to what the leader
    #: writes, so that a deposed leader's late writes are turned away.
    fence: int
    #: The leader's owner description.
    owner: str

    @classmethod
    def of(cls, lock: Optional[LockInfo]) -> "Optional[Leader]":
        """The leader a lock's state shows: its holder, or None if nobody holds it or it is in a lock-delay
        (the last leader's lease ran out)."""
        if lock is None or lock.holder is None or not lock.holder.is_live:
            return None
        return cls(value=lock.holder.value, fence=lock.holder.fence, owner=lock.holder.owner)
