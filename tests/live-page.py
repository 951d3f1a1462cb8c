"""The live page (GET /) in a real headless browser, against a 3-node cluster with --auth.

    python tests/live-page.py HOLDFAST_BINARY ARTIFACT_DIR

Run by tests/live-page, which installs chromium, its driver and selenium. Starts three nodes on free ports
of 127.0.0.1 (with --auth and an admin key), signs up two tenants, opens the page on a follower and checks,
each wait bounded:

- the cluster: three members, the leader named, this node's readiness;
- it asks for an API key, and with tenant A's shows A's locks only (never tenant B's, taken before);
- a lock taken by curl shows within a second, with its owner, fence and value (as text, never as HTML),
  and its countdown moves;
- a waiter shows in the queue, a semaphore's holders show, and a release hands the lock over and then
  removes it;
- filtering by prefix and paging through more locks than a page holds;
- through the leader's kill, the page goes on showing changes;
- nothing is loaded from anywhere but the node, and the browser logs no script error or CSP violation.

Saves a screenshot (ARTIFACT_DIR/live-page.png). Exits non-zero at the first check that fails.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

BINARY, ARTIFACTS = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
ADMIN_KEY = "live-page-admin-key-0123456789"
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def wait_for(what, check, bound_s):
    """Polls `check()` until it returns something truthy (returned), failing after `bound_s` seconds."""
    deadline = time.monotonic() + bound_s
    while True:
        try:
            result = check()
        except StaleElementReferenceException:  # the row was re-rendered between finding and reading it
            result = None
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {bound_s} s waiting for {what}")
        time.sleep(0.02)


class Cluster:
    """Three nodes with --auth; node i's client port is `url(i)`."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="holdfast-live-page-"))
        probes = [socket.socket() for _ in range(6)]
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        ports = [probe.getsockname()[1] for probe in probes]
        for probe in probes:
            probe.close()
        self.client = {i: ports[2 * i - 2] for i in (1, 2, 3)}
        peers = {i: ports[2 * i - 1] for i in (1, 2, 3)}
        members = ",".join(f"{i}=127.0.0.1:{p}" for i, p in peers.items())
        self.procs = {}
        for i in (1, 2, 3):
            (self.dir / f"node{i}").mkdir()
            args = [str(BINARY), "server", "--id", str(i), "--members", members,
                    "--client-addr", f"127.0.0.1:{self.client[i]}", "--peer-addr", f"127.0.0.1:{peers[i]}",
                    "--data-dir", str(self.dir / f"node{i}"), "--auth", "--admin-key", ADMIN_KEY]
            env = {k: v for k, v in os.environ.items() if not k.startswith("HOLDFAST_")}
            with open(self.dir / f"node{i}.log", "ab") as log:
                self.procs[i] = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env)
        wait_for("three ready nodes", lambda: all(self.status(i, "/readyz") == 200 for i in (1, 2, 3)), 30)

    def url(self, i):
        return f"http://127.0.0.1:{self.client[i]}"

    def status(self, i, path):
        try:
            with _HTTP.open(self.url(i) + path, timeout=2) as response:
                return response.status
        except urllib.error.HTTPError as error:
            return error.code
        except OSError:
            return 0

    def call(self, i, method, path, key, body=None, timeout=10):
        """The JSON answer of `method path` on node i with `key`; raises on an error status."""
        request = urllib.request.Request(self.url(i) + path, method=method, data=body)
        request.add_header("Authorization", f"Bearer {key}")
        with _HTTP.open(request, timeout=timeout) as response:
            return json.load(response)

    def leader(self):
        def find():
            for i, proc in self.procs.items():
                if proc.poll() is None:
                    try:
                        with _HTTP.open(self.url(i) + "/v1/cluster", timeout=2) as response:
                            leader = json.load(response)["leader"]
                    except OSError:
                        continue
                    if leader and self.procs[leader].poll() is None:
                        return leader
            return None

        return wait_for("a leader", find, 15)

    def stop(self):
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=10)
        if not os.environ.get("HOLDFAST_KEEP_TEST_DIRS"):
            shutil.rmtree(self.dir, ignore_errors=True)


def curl(*args):
    """curl -sf ARGS: its output as JSON (the recipe a user would run)."""
    return json.loads(subprocess.run(["curl", "-sf", "--noproxy", "*", *args], check=True,
                                     capture_output=True, timeout=30).stdout)


def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1000",
                "--disable-gpu", "--no-first-run", "--disable-background-networking"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


def row(driver, name):
    rows = driver.find_elements(By.CSS_SELECTOR, f'#lock-table tr[data-lock="{name}"]')
    return rows[0] if rows else None


def seconds_left(driver, name):
    """The countdown of lock `name`'s first holder, in seconds (None if not shown)."""
    shown = row(driver, name)
    if shown is None:
        return None
    text = shown.find_element(By.CSS_SELECTOR, "span.left").text
    return float(text.split(" s ")[0]) if " s " in text else None


def check(ok, why):
    if not ok:
        raise AssertionError(why)


def main():
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    cluster = Cluster()
    driver = None
    try:
        driver = browser()
        run(cluster, driver)
        print("live-page: every check passed")
    except BaseException:
        if driver is not None:
            driver.save_screenshot(str(ARTIFACTS / "live-page-failed.png"))
            print("live-page: the page's text at the failure:\n" + driver.find_element(By.TAG_NAME, "body").text)
            for entry in driver.get_log("browser"):
                print("browser:", entry)
        for i in (1, 2, 3):
            log = (cluster.dir / f"node{i}.log").read_text(errors="replace").splitlines()[-15:]
            print(f"node {i}'s log, last lines:\n" + "\n".join(log))
        raise
    finally:
        if driver is not None:
            driver.quit()
        cluster.stop()


def run(cluster, driver):
    key_a, key_b = (cluster.call(1, "POST", "/v1/signup", ADMIN_KEY)["api_key"] for _ in range(2))
    leader = cluster.leader()
    follower = next(i for i in (1, 2, 3) if i != leader)
    base = cluster.url(follower)

    # The cluster, and the key the page asks for.
    driver.get(base + "/")
    wait_for("the page to ask for an API key", lambda: driver.find_element(By.ID, "key").is_displayed(), 5)
    wait_for("three members", lambda: len(driver.find_elements(By.CSS_SELECTOR, "#members tbody tr")) == 3, 5)
    summary = wait_for("the leader named", lambda: (lambda t: f"Leader: node {leader}" in t and t)(
        driver.find_element(By.ID, "cluster-summary").text), 5)
    check("this node ready" in summary, f"the summary: {summary!r}")
    print(f"ok    the page on follower {follower} shows the cluster: {summary}")

    # Tenant B's lock, taken before anything of A's: if the page leaked B's, it would show before A's.
    curl("-X", "POST", "-H", f"Authorization: Bearer {key_b}", f"{base}/v1/locks/other-tenant-job?ttl=60s&owner=b")
    driver.find_element(By.ID, "key").send_keys(key_a)
    driver.find_element(By.CSS_SELECTOR, "#key-form button").click()
    wait_for("the watch to be live", lambda: driver.find_element(By.ID, "live").text == "live", 5)

    grant = curl("-X", "POST", "-H", f"Authorization: Bearer {key_a}", "-H", "Content-Type: text/plain",
                 "--data-binary", "<b>run-42</b>",
                 f"{base}/v1/locks/nightly-import?ttl=30s&owner=cron-host-1")
    taken = time.monotonic()
    shown = wait_for("the lock taken by curl", lambda: row(driver, "nightly-import"), 1.0)
    print(f"ok    a lock taken by curl shows after {time.monotonic() - taken:.3f} s")
    check(row(driver, "other-tenant-job") is None, "tenant B's lock shows on tenant A's page")
    text = shown.text
    check("cron-host-1" in text and f"fence {grant['fence']}" in text, f"the row: {text!r}")
    value = shown.find_element(By.CSS_SELECTOR, ".value")
    check(value.text == "<b>run-42</b>" and not value.find_elements(By.TAG_NAME, "b"),
          f"the value shows as text: {value.get_attribute('innerHTML')!r}")
    first = wait_for("a countdown", lambda: seconds_left(driver, "nightly-import"), 1)
    check(25 < first <= 30, f"the countdown starts near the TTL: {first}")
    later = wait_for("the countdown to move", lambda: (lambda s: s is not None and s <= first - 0.4 and s)(
        seconds_left(driver, "nightly-import")), 3)
    print(f"ok    owner, fence, value as text; the countdown moves ({first} s, then {later} s)")

    # A waiter in the queue, and a semaphore's holders.
    waiter = subprocess.Popen(
        ["curl", "-sf", "--noproxy", "*", "-X", "POST", "-H", f"Authorization: Bearer {key_a}",
         f"{base}/v1/locks/nightly-import?ttl=30s&wait=20s&owner=cron-host-2"], stdout=subprocess.PIPE)
    wait_for("the waiter in the queue", lambda: "cron-host-2" in row(driver, "nightly-import").find_element(
        By.CSS_SELECTOR, "td:nth-child(3)").text, 3)
    for owner in ("pool-worker-1", "pool-worker-2"):
        curl("-X", "POST", "-H", f"Authorization: Bearer {key_a}", f"{base}/v1/locks/pool?ttl=60s&limit=3&owner={owner}")
    wait_for("a semaphore's two holders", lambda: (lambda r: r is not None and "2 of 3" in r.text
                                                    and len(r.find_elements(By.CSS_SELECTOR, "li.holder")) == 2)(
        row(driver, "pool")), 2)
    print("ok    a waiter shows in the queue; a semaphore shows its holders and its limit")
    driver.save_screenshot(str(ARTIFACTS / "live-page.png"))

    # A release hands the lock over to the waiter, and the next release removes it.
    curl("-X", "DELETE", "-H", f"Authorization: Bearer {key_a}",
         f"{base}/v1/locks/nightly-import?token={grant['token']}")
    handed = json.loads(waiter.communicate(timeout=20)[0])
    wait_for("the hand-over", lambda: f"fence {handed['fence']}" in row(driver, "nightly-import").text, 2)
    curl("-X", "DELETE", "-H", f"Authorization: Bearer {key_a}",
         f"{base}/v1/locks/nightly-import?token={handed['token']}")
    wait_for("the released lock to go", lambda: row(driver, "nightly-import") is None, 2)
    print("ok    a release hands the lock to the waiter; the last release removes it")

    # More locks than a page holds (50), found by prefix and paged.
    for n in range(55):
        cluster.call(follower, "POST", f"/v1/locks/bulk-{n:02}?ttl=60s&owner=bulk", key_a)
    driver.find_element(By.ID, "prefix").send_keys("bulk-")
    info = lambda: driver.find_element(By.ID, "page-info").text  # noqa: E731
    wait_for("page 1 of the prefix", lambda: info() == "page 1 · 50 shown", 3)
    names = [r.get_attribute("data-lock") for r in driver.find_elements(By.CSS_SELECTOR, "#lock-table tbody tr")]
    check(names == [f"bulk-{n:02}" for n in range(50)], f"page 1: {names}")
    driver.find_element(By.ID, "next").click()
    wait_for("page 2", lambda: info() == "page 2 · 5 shown", 3)
    driver.find_element(By.ID, "prev").click()
    wait_for("page 1 again", lambda: info() == "page 1 · 50 shown", 3)
    print("ok    a prefix filters; 55 locks page as 50 and 5")

    # The leader's kill: the page, on a follower, goes on showing changes.
    cluster.procs[leader].send_signal(signal.SIGKILL)
    cluster.procs[leader].wait(timeout=10)
    new_leader = cluster.leader()
    wait_for("the new leader named", lambda: f"Leader: node {new_leader}" in driver.find_element(
        By.ID, "cluster-summary").text, 10)
    cluster.call(follower, "POST", "/v1/locks/bulk-00-after-failover?ttl=60s&owner=late", key_a, timeout=20)
    wait_for("a lock taken after the failover", lambda: row(driver, "bulk-00-after-failover"), 5)
    print(f"ok    after leader {leader}'s kill the page names {new_leader} and shows a lock taken since")

    # Forgetting the key asks for one again.
    driver.find_element(By.ID, "forget-key").click()
    wait_for("the key asked for again", lambda: driver.find_element(By.ID, "key").is_displayed(), 3)

    # Nothing came from outside the node; no script error, no CSP violation.
    loaded = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    foreign = [url for url in loaded if not url.startswith(base + "/")]
    check(not foreign, f"loaded from elsewhere: {foreign}")
    problems = [e["message"] for e in driver.get_log("browser")
                if "Content Security Policy" in e["message"] or "Uncaught" in e["message"]]
    check(not problems, f"the browser logged: {problems}")
    print(f"ok    {len(loaded)} resources, every one from the node; no CSP violation or script error")


if __name__ == "__main__":
    main()
