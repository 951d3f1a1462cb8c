"""holdfast: the Python client of holdfast, a replicated lock service.

```
import holdfast

client = holdfast.Client(["10.0.0.1:7070", "10.0.0.2:7070", "10.0.0.3:7070"])
with client.lock("nightly-import", lease=2.0) as held:   # a session: waits in the FIFO queue
    run(held.fence)                                       # held.lost: a threading.Event

hold = client.acquire("report-42", ttl=60)               # one-shot: a TTL hold with a token
hold.renew()
hold.release()
```

Layout: `client` (endpoints, retries, one-shot calls), `session` (session locks), `aio` (the asyncio
twin, `holdfast.aio.Client`), `errors` (the exceptions and the one mapping from gRPC statuses to them),
`types` (what reads answer), `_wire` (durations, endpoints, retry bounds), `v1` (generated from
proto/holdfast/v1/locks.proto; do not edit).
"""

from .client import Client, Hold
from .errors import (
    Expired,
    HoldfastError,
    InvalidArgument,
    LimitMismatch,
    LimitReached,
    LockBusy,
    LockTimeout,
    NotFound,
    NotHolder,
    ProtocolError,
    SessionLost,
    Unauthenticated,
    Unavailable,
)
from .session import SessionLock
from .types import Holder, LockInfo, Waiter

__all__ = [
    "Client",
    "Expired",
    "Hold",
    "Holder",
    "HoldfastError",
    "InvalidArgument",
    "LimitMismatch",
    "LimitReached",
    "LockBusy",
    "LockInfo",
    "LockTimeout",
    "NotFound",
    "NotHolder",
    "ProtocolError",
    "SessionLock",
    "SessionLost",
    "Unauthenticated",
    "Unavailable",
    "Waiter",
]
