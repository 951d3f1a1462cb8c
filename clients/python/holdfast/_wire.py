"""Small conversions between the Python API and the wire: durations, values and endpoints."""

import random
import time
from typing import Union

from .errors import InvalidArgument

#: Attempts of one call over all endpoints, and how long after the first no new attempt starts.
MAX_ATTEMPTS = 10
RETRY_TIMEOUT_S = 10.0
#: The pause after each round over all endpoints: doubling from the first to the second, with jitter.
BACKOFF_S = (0.05, 2.0)
#: One attempt of a call (a waiting acquire adds its wait).
REQUEST_TIMEOUT_S = 5.0
#: The longest value a lock publishes, in bytes (the proto's bound).
VALUE_LEN_MAX = 1024


def pause(rounds: int) -> None:
    """Sleeps after `rounds` full rounds over the endpoints: the backoff doubles from its minimum up to its
    maximum, each pause 50 to 100 % of that (jitter), so that clients that lost the same node do not come
    back in step."""
    backoff = min(BACKOFF_S[0] * 2 ** (rounds - 1), BACKOFF_S[1])
    time.sleep(backoff * random.uniform(0.5, 1.0))


def ms(seconds: float, what: str) -> int:
    """Seconds to whole milliseconds for the wire. A negative duration is refused here; the server checks
    the bounds (and refuses a bad value with `InvalidArgument`, changing nothing)."""
    if seconds < 0:
        raise InvalidArgument(f"{what} must not be negative, got {seconds}")
    return int(round(seconds * 1000))


def value_bytes(value: Union[bytes, str]) -> bytes:
    """A value to publish, as bytes: a `str` is sent as UTF-8. Longer than `VALUE_LEN_MAX` bytes is refused
    here, before anything is sent."""
    if isinstance(value, str):
        value = value.encode("utf-8")
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"a value is bytes or str, got {type(value).__name__}")
    data = bytes(value)
    if len(data) > VALUE_LEN_MAX:
        raise InvalidArgument(f"a value is at most {VALUE_LEN_MAX} bytes, got {len(data)}")
    return data


def revision(after: int, what: str = "after") -> int:
    """A revision to resume after: a whole number, 0 for none."""
    if isinstance(after, bool) or not isinstance(after, int) or after < 0:
        raise InvalidArgument(f"{what} is a revision: a whole number, 0 or more, got {after!r}")
    return after


def target(endpoint: str, tls: bool) -> str:
    """`host:port`, `host` (port 7070) or either after `http://` (`https://` with TLS) to a gRPC target."""
    scheme = "https://" if tls else "http://"
    rest = endpoint[len(scheme) :] if endpoint.startswith(scheme) else endpoint
    if "://" in rest or "/" in rest or "@" in rest or not rest:
        raise ValueError(f"bad endpoint {endpoint!r}: want host:port, or {scheme}host:port")
    if rest.startswith("["):  # [::1] or [::1]:7070
        return rest if "]:" in rest else rest + ":7070"
    return rest if ":" in rest else rest + ":7070"
