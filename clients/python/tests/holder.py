"""A holder process for the tests: takes a session lock, reports on stdout, releases when told.

Usage: python holder.py NAME LEASE_S LIMIT ENDPOINT...

Prints `acquired FENCE SESSION_ID` once granted, `lost` if the lock is lost, and `released` after the line
`release` arrives on stdin (then exits).
"""

import sys

import holdfast


def main() -> None:
    name, lease, limit, endpoints = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
    client = holdfast.Client(endpoints, owner=f"holder-{name}")
    lock = client.lock(name, lease=lease, limit=limit, on_lost=lambda _: print("lost", flush=True))
    lock.acquire()
    print(f"acquired {lock.fence} {lock.session_id}", flush=True)
    for line in sys.stdin:
        if line.strip() == "release":
            lock.release()
            print("released", flush=True)
            return


if __name__ == "__main__":
    main()
