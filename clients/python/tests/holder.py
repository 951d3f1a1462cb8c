"""A holder process for the tests: takes a session lock (or campaigns in an election), reports on stdout,
releases when told. Killing it with -9 leaves its lock to its lease.

Usage: python holder.py [--campaign VALUE] [--lock-delay S] NAME LEASE_S LIMIT ENDPOINT...

Prints `acquired FENCE SESSION_ID` once granted (or leading), `lost` if the lock is lost, and `released`
after the line `release` arrives on stdin (then exits).
"""

import argparse
import sys
from typing import Callable

import holdfast


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--campaign", metavar="VALUE", help="campaign in election NAME, publishing VALUE")
    parser.add_argument("--lock-delay", type=float, default=0.0, metavar="S")
    parser.add_argument("name")
    parser.add_argument("lease", type=float)
    parser.add_argument("limit", type=int)
    parser.add_argument("endpoints", nargs="+")
    args = parser.parse_args()
    client = holdfast.Client(args.endpoints, owner=f"holder-{args.name}")
    release: Callable[[], None]
    if args.campaign is not None:
        leadership = client.campaign(
            args.name, args.campaign, lease=args.lease, on_lost=lambda _: print("lost", flush=True)
        )
        fence, session_id, release = leadership.fence, leadership.session_id, leadership.resign
    else:
        lock = client.lock(
            args.name,
            lease=args.lease,
            limit=args.limit,
            lock_delay=args.lock_delay,
            on_lost=lambda _: print("lost", flush=True),
        )
        lock.acquire()
        fence, session_id, release = lock.fence, lock.session_id, lock.release
    print(f"acquired {fence} {session_id}", flush=True)
    for line in sys.stdin:
        if line.strip() == "release":
            release()
            print("released", flush=True)
            return


if __name__ == "__main__":
    main()
