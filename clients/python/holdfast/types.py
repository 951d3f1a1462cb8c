"""What the cluster answers about locks: holders, waiters and a lock's state, as plain dataclasses."""

from dataclasses import dataclass, field
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
