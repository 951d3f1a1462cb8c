"""Watches: a lock's states (or those of every lock under a prefix) from the server's `Watch` stream, resumed
through another node from the last revision answered when the stream ends or its node fails, as the Rust
client's watch.rs does.

A watch is an iterator on the calling thread: each `next` reads the stream (no thread of its own, no
buffer beyond the gRPC call's), so a consumer that falls behind holds the server back until it ends the
stream with `watch-behind`, and the watch resumes.
"""

import threading
from typing import TYPE_CHECKING, Iterator, Optional

import grpc

from ._wire import MAX_ATTEMPTS, pause, revision
from .errors import HoldfastError, InvalidArgument, ProtocolError, Unavailable, error_from_rpc
from .types import WatchEvent
from .v1 import locks_pb2

if TYPE_CHECKING:
    from .client import Client


class Watch:
    """The states of one lock (or, with `prefix`, of every lock whose name starts with `name`) as the cluster
    changes them: an iterator of `WatchEvent`s.

    ```
    with client.watch("service-leader") as watch:
        for state in watch:                  # first as it is now (state.initial), then after each change
            print(state.revision, state.holder)
    ```

    The first state is the lock as it is now (`initial`); then one state after every log entry that
    changed it (grant, release, expiry, hand-over, value change, renewal, a waiter joining or leaving), in
    log order, none skipped while the stream lasts. A prefix's watch begins with every lock under it changed
    since `after` (0: every lock held, and those freed in the last 10 minutes), in revision order.

    When the node it reads from goes away, or the server ends the stream (it fell behind), the watch
    resumes through the next endpoint from the last revision answered: if the lock changed meanwhile, the
    next state is the lock as it is then (`initial`, the changes in between not replayed); if it did not,
    nothing is answered twice. Iteration raises `Unavailable` when no endpoint answered `MAX_ATTEMPTS`
    streams in a row, `Compacted` when a prefix watch cannot resume after `after`, and the server's refusal
    (`InvalidArgument`, `LimitReached`, `Unauthenticated`) as it comes; after an error, or `cancel()`
    (from any thread), iteration ends.
    """

    def __init__(self, client: "Client", name: str, *, prefix: bool, after: int) -> None:
        if not isinstance(name, str):
            raise TypeError(f"a lock's name or prefix is a str, got {type(name).__name__}")
        if not prefix and not name:
            raise InvalidArgument("a lock's name is needed (or prefix=True to watch every lock)")
        self._client = client
        #: The lock watched, or the prefix.
        self.name = name
        self.prefix = prefix
        self._after = revision(after)
        self._answered = False
        self._resumes = 0
        self._index = client._preferred
        self._guard = threading.Lock()
        self._call: Optional[Iterator[locks_pb2.WatchEvent]] = None
        self._cancelled = False
        self._ended = False

    @property
    def revision(self) -> int:
        """The revision of the last state answered (or the `after` the watch began with): what a new watch
        would resume after."""
        return self._after

    @property
    def resumes(self) -> int:
        """How many times the watch resumed through a new stream after its first: between two states answered
        on either side of a resume there may have been more than one change."""
        return self._resumes

    def __iter__(self) -> "Watch":
        return self

    def __next__(self) -> WatchEvent:
        if self._ended:
            raise StopIteration
        try:
            return self._next()
        except BaseException:
            self._ended = True
            self.cancel()
            raise

    def _next(self) -> WatchEvent:
        # Streams that ended without answering anything, in a row: bounded, so that nodes that end every
        # watch at once (or are all down) cannot keep this loop going.
        fruitless = 0
        n = len(self._client._targets)
        while True:
            call = self._stream()
            try:
                event = next(call)
            except StopIteration:
                error: HoldfastError = Unavailable("the node ended the watch")
            except grpc.RpcError as rpc_error:
                if self._cancelled:
                    raise StopIteration from None
                error = error_from_rpc(rpc_error)
            else:
                state = self._accept(event)
                if state is not None:
                    return state
                continue
            with self._guard:
                self._call = None
            if not isinstance(error, Unavailable) or fruitless >= MAX_ATTEMPTS:
                raise error
            fruitless += 1
            self._index = (self._index + 1) % n
            if fruitless % n == 0:
                pause(fruitless // n)

    def _accept(self, event: locks_pb2.WatchEvent) -> Optional[WatchEvent]:
        """The state to answer for `event`, recording its revision; None for a resumed lock's first state
        that shows nothing new."""
        if not event.HasField("lock"):
            raise ProtocolError("a watch event without a lock")
        state = WatchEvent.from_event(event)
        # A lock's watch resumed and found the lock as it was last answered: nothing was missed. (A
        # prefix's watch resumes with the locks changed since, none of them answered before.)
        if not self.prefix and state.initial and self._answered and state.revision == self._after:
            return None
        self._answered = True
        self._after = max(self._after, state.revision) if self.prefix else state.revision
        return state

    def _stream(self) -> Iterator[locks_pb2.WatchEvent]:
        """The current stream, opened from `after` on the current endpoint if there is none (the call has no
        deadline: it lasts as long as the watch)."""
        with self._guard:
            if self._cancelled:
                raise StopIteration
            if self._call is None:
                request = locks_pb2.WatchRequest(after=self._after)
                if self.prefix:
                    request.prefix = self.name
                else:
                    request.name = self.name
                self._call = self._client._stub(self._index).Watch(request, metadata=self._client._metadata)
                if self._answered:
                    self._resumes += 1
            return self._call

    def cancel(self) -> None:
        """Ends the watch (from any thread): a `next` waiting on the stream, and every one after, ends the
        iteration."""
        with self._guard:
            self._cancelled = True
            call = self._call
        if isinstance(call, grpc.RpcContext):
            call.cancel()

    close = cancel

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()

    def __repr__(self) -> str:
        kind = "prefix" if self.prefix else "name"
        return f"Watch({kind}={self.name!r}, revision={self._after}, resumes={self._resumes})"
