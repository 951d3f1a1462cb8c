"""The client's exceptions, and the one place that maps the server's gRPC statuses and session errors to them.

The mapping is the Rust client's (crates/holdfast-client/src/error.rs): the problem type from the
`holdfast-problem` metadata entry (`urn:holdfast:<slug>`) wins where it is known; otherwise the gRPC code
decides, so a server with slugs this client does not know still maps sensibly.
"""

import contextlib
from typing import Dict, Optional, Union

import grpc
from google.protobuf.message import DecodeError

from .types import Holder
from .v1 import locks_pb2

#: The gRPC metadata entry in which the server puts an error's problem type.
PROBLEM_METADATA = "holdfast-problem"
#: The binary metadata entry in which a busy answer names the holder (an encoded `Holder`).
HOLDER_METADATA = "holdfast-holder-bin"
_PROBLEM_PREFIX = "urn:holdfast:"


class HoldfastError(Exception):
    """Base of every error this client raises."""

    #: Whether the cluster could not serve the call at the time, rather than answer it: true only for
    #: `Unavailable` and `Overloaded`. The same call, unchanged, may succeed after a pause or through another
    #: node; after `Unavailable` a write's outcome is unknown, so send it again only if doing it twice is
    #: harmless, or check first. Every other error is an answer about the request or the lock.
    transient: bool = False


class LockBusy(HoldfastError):
    """The lock is held by someone else (a try-lock, or a one-shot acquire whose wait ran out)."""

    def __init__(self, holder: Optional[Holder] = None, detail: str = "") -> None:
        #: Who holds it, when the server said.
        self.holder = holder
        if holder is None:
            text = detail or "the lock is held"
        elif holder.free_at_ms is not None:
            text = (
                f"the lock is in its lock-delay until {holder.free_at_ms} ms (leader time): "
                f"the hold of {holder.owner!r} (fence {holder.fence}) expired"
            )
        else:
            text = f"the lock is held by {holder.owner!r} (fence {holder.fence})"
        super().__init__(text)


class NotHolder(HoldfastError):
    """The token does not hold the lock: it is wrong, or its hold already ended."""


class Expired(HoldfastError):
    """The hold ran out before the renew arrived; acquire the lock again."""


class NotFound(HoldfastError):
    """Nobody holds the lock (or the named thing does not exist)."""


class InvalidArgument(HoldfastError, ValueError):
    """The request was refused as malformed (name, owner, TTL, lease, wait, limit, token); nothing changed."""


class LimitReached(HoldfastError):
    """A server limit was reached (queue full, too many locks, sessions or claims); nothing changed."""


class Overloaded(HoldfastError):
    """The node, or the leader, refused new load (a session, a one-shot acquire) while it served the sessions
    it has late, or (a new session) while its workers had no room to spare; nothing changed. Unlike a limit,
    it passes: try again after a pause, or through another node. Not retried by this client."""

    transient = True


class LimitMismatch(HoldfastError):
    """The lock is held or waited for under another limit than the acquire gave; nothing changed."""


class Unavailable(HoldfastError):
    """No endpoint answered within the retry bounds, or the cluster had no leader in time. For a write the
    outcome is unknown: it may or may not have happened."""

    transient = True


class LockTimeout(HoldfastError):
    """A session lock was not granted within the timeout the caller gave (the wait was withdrawn)."""


class SessionLost(HoldfastError):
    """The session is over (its lease ran out by the client's clock, or the server expired or closed it), so
    it holds nothing any more."""


class Compacted(HoldfastError):
    """A prefix watch cannot resume after the revision given: a lock freed since may have been forgotten.
    List the prefix again (`Client.list`) and watch after the page's `revision`."""


class Unauthenticated(HoldfastError):
    """No API key, or an unknown or revoked one."""


class ProtocolError(HoldfastError):
    """The server answered something this client does not understand, or failed internally."""


def error_from_problem(code: Optional[grpc.StatusCode], problem: Optional[str], detail: str) -> HoldfastError:
    """Maps an answer from the server to an exception: the gRPC `code` of a failed call (None for an error
    event inside a session stream, which has only a problem type), the problem type if there is one, and the
    human-readable detail."""
    slug = problem[len(_PROBLEM_PREFIX) :] if problem and problem.startswith(_PROBLEM_PREFIX) else problem
    if slug == "busy":
        return LockBusy(None, detail)
    if slug == "not-holder":
        return NotHolder(detail)
    if slug == "expired":
        return Expired(detail)
    if slug == "not-found":
        return NotFound(detail)
    if slug == "session-gone":
        return SessionLost(detail)
    if slug in ("unavailable", "watch-behind"):
        return Unavailable(detail)
    if slug in ("queue-full", "too-many-locks", "too-many-sessions", "too-many-claims", "too-many-changes"):
        return LimitReached(detail)
    if slug == "overloaded":
        return Overloaded(detail)
    if slug is not None and (slug.startswith("invalid-") or slug == "session-hold"):
        return InvalidArgument(detail)
    if slug == "unauthenticated":
        return Unauthenticated(detail)
    if slug == "limit-mismatch":
        return LimitMismatch(detail)
    if slug == "compacted":
        return Compacted(detail)
    by_code = {
        grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
        grpc.StatusCode.FAILED_PRECONDITION: NotHolder,
        grpc.StatusCode.NOT_FOUND: NotFound,
        grpc.StatusCode.RESOURCE_EXHAUSTED: LimitReached,
        grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
        grpc.StatusCode.UNAVAILABLE: Unavailable,
        grpc.StatusCode.DEADLINE_EXCEEDED: Unavailable,
    }
    if code == grpc.StatusCode.ALREADY_EXISTS:
        return LockBusy(None, detail)
    if code in by_code:
        return by_code[code](detail)
    if code is not None:
        return ProtocolError(f"{code.name}: {detail}")
    return ProtocolError(f"{problem or 'unknown problem'}: {detail}")


def error_from_rpc(error: grpc.RpcError) -> HoldfastError:
    """Maps a failed gRPC call, reading its status code, message and trailing metadata.

    A status without a problem type did not come from holdfast's handlers: a transport failure (connection
    refused or reset, a stream torn down by a dying node) or a deadline this client set. Those say nothing
    about the request, so they are `Unavailable` (retried on the next endpoint; a write's outcome unknown).
    """
    code: Optional[grpc.StatusCode] = error.code() if isinstance(error, grpc.Call) else None
    detail: str = (error.details() if isinstance(error, grpc.Call) else None) or str(error)
    metadata: Dict[str, Union[str, bytes]] = (
        dict(error.trailing_metadata() or ()) if isinstance(error, grpc.Call) else {}
    )
    problem = metadata.get(PROBLEM_METADATA)
    if isinstance(problem, bytes):
        problem = problem.decode("utf-8", "replace")
    if problem is None and code in (
        None,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.CANCELLED,
    ):
        return Unavailable(detail)
    mapped = error_from_problem(code, problem, detail)
    if isinstance(mapped, LockBusy):
        holder_bytes = metadata.get(HOLDER_METADATA)
        if isinstance(holder_bytes, bytes):
            with contextlib.suppress(DecodeError):  # undecodable bytes: still busy, holder unknown
                mapped = LockBusy(Holder.from_proto(locks_pb2.Holder.FromString(holder_bytes)), detail)
    return mapped
