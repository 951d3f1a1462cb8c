"""holdfast: the Python client of holdfast, a replicated lock service.

```
import holdfast

client = holdfast.Client(["10.0.0.1:7070", "10.0.0.2:7070", "10.0.0.3:7070"])
with client.lock("nightly-import", lease=2.0) as held:   # a session: waits in the FIFO queue
    run(held.fence)                                       # held.lost: a threading.Event

hold = client.acquire("report-42", ttl=60)               # one-shot: a TTL hold with a token
hold.renew()
hold.release()

for state in client.watch("nightly-import"):             # its state now, then after every change
    print(state.revision, state.holder)

with client.campaign("service-leader", "10.0.0.1:8080") as leadership:   # an election
    serve(leadership.fence, stop=leadership.lost)
```

Layout: `client` (endpoints, retries, one-shot calls and reads; the doors to the rest), `session` (session
locks), `watch` (watches), `election` (campaigns and leaders, on session locks and watches), `aio` (the
asyncio twin, `holdfast.aio.Client`), `errors` (the exceptions and the one mapping from gRPC statuses to
them), `types` (what reads and watches answer), `_wire` (durations, values, endpoints, retry bounds), `v1`
(generated from proto/holdfast/v1/locks.proto; do not edit).
"""

from .client import Client, Hold
from .election import ELECTION_LEASE_S, Leaders, Leadership
from .errors import (
    Compacted,
    Expired,
    HoldfastError,
    InvalidArgument,
    LimitMismatch,
    LimitReached,
    LockBusy,
    LockTimeout,
    NotFound,
    NotHolder,
    Overloaded,
    ProtocolError,
    SessionLost,
    Unauthenticated,
    Unavailable,
)
from .session import SessionLock
from .types import Holder, Leader, ListPage, LockInfo, Waiter, WatchEvent
from .watch import Watch

__all__ = [
    "ELECTION_LEASE_S",
    "Client",
    "Compacted",
    "Expired",
    "Hold",
    "Holder",
    "HoldfastError",
    "InvalidArgument",
    "Leader",
    "Leaders",
    "Leadership",
    "LimitMismatch",
    "LimitReached",
    "ListPage",
    "LockBusy",
    "LockInfo",
    "LockTimeout",
    "NotFound",
    "NotHolder",
    "Overloaded",
    "ProtocolError",
    "SessionLock",
    "SessionLost",
    "Unauthenticated",
    "Unavailable",
    "Waiter",
    "Watch",
    "WatchEvent",
]
