"""The Python holder of tests/cross-language: holds a session lock with clients/python's API.

Usage: python python-holder.py NAME LEASE_S LOG RELEASE_FILE BOUND_S ENDPOINT...

Waits in NAME's queue (owner "xlang-python"); once granted, appends "python start FENCE" to LOG; holds
until RELEASE_FILE exists, then appends "python end FENCE" and releases (exit 0). If the lock is lost, it
appends "python lost FENCE" and exits 3. Gives up (exit 4) if not granted or not told to release within
BOUND_S seconds.
"""

import os
import sys
import time

import holdfast


def log(path: str, line: str) -> None:
    # One write of one short line with O_APPEND: lines of the three holders never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def main() -> int:
    name, lease, log_path, release_file = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
    bound, endpoints = float(sys.argv[5]), sys.argv[6:]
    deadline = time.monotonic() + bound
    client = holdfast.Client(endpoints, owner="xlang-python")
    lock = client.lock(name, lease=lease)
    if not lock.acquire(timeout=bound):
        print("python-holder: not granted in time", file=sys.stderr, flush=True)
        return 4
    fence = lock.fence
    log(log_path, f"python start {fence}")
    while not os.path.exists(release_file):
        if lock.lost.wait(0.05):
            log(log_path, f"python lost {fence}")
            return 3
        if time.monotonic() > deadline:
            print("python-holder: never told to release", file=sys.stderr, flush=True)
            lock.release()
            return 4
    if lock.lost.is_set():
        log(log_path, f"python lost {fence}")
        return 3
    log(log_path, f"python end {fence}")
    lock.release()
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
