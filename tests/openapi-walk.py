"""Walks a running node through the HTTP API's happy paths and checks every answer against the OpenAPI
document: the answers a fuzzer seldom reaches because they need state (a token that holds, a semaphore, a
lock in its lock-delay, a watch that sees a change, a watch stream's first event), and the live page.

    python tests/openapi-walk.py SPEC http://HOST:PORT

Run by tests/openapi-fuzz with the tools' virtualenv (it needs `jsonschema`, which schemathesis brings).
For each call: the status must be the one expected and one the document lists for the operation, the
content type the document's, the body valid against the document's schema, and a documented required
header present. Exits non-zero on the first difference.
"""

import json
import sys
import time
import urllib.error
import urllib.request

import jsonschema

spec_path, base = sys.argv[1], sys.argv[2].rstrip("/")
with open(spec_path) as f:
    doc = json.load(f)


def deref(node):
    """The object a `$ref` names, or the node itself."""
    if isinstance(node, dict) and "$ref" in node:
        target = doc
        for part in node["$ref"].lstrip("#/").split("/"):
            target = target[part.replace("~1", "/").replace("~0", "~")]
        return deref(target)
    return node


def call(method, template, path, status, query="", body=None, content_type=None):
    url = base + path + (("?" + query) if query else "")
    request = urllib.request.Request(url, method=method, data=body)
    if content_type:
        request.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(request, timeout=20) as r:
            got, headers, data = r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        got, headers, data = e.code, e.headers, e.read()
    what = f"{method} {path}?{query}"
    if got != status:
        fail(what, f"answered {got}, expected {status}: {data[:300]!r}")
    body_json = json.loads(data) if data and "json" in headers.get("Content-Type", "") else None
    if template is None:  # not an operation: the router's own answers (404 no-route, 405)
        return got, headers, body_json
    op = doc["paths"][template][method.lower()]
    response = op["responses"].get(str(status))
    if response is None:
        fail(what, f"status {status} is not documented for {method} {template}")
    response = deref(response)
    ctype = headers.get("Content-Type", "").split(";")[0].strip()
    content = response.get("content", {})
    if ctype not in content:
        fail(what, f"content type {ctype!r} is not documented ({sorted(content)})")
    schema = content[ctype].get("schema")
    if schema is not None and body_json is not None:
        root = dict(doc)
        root.update(schema)
        errors = list(jsonschema.Draft202012Validator(root).iter_errors(body_json))
        if errors:
            fail(what, f"the body does not match the document: {errors[0].message}\n{json.dumps(body_json)}")
    for name, header in response.get("headers", {}).items():
        header = deref(header)
        if header.get("required") and name not in headers:
            fail(what, f"the documented header {name} is missing")
    print(f"ok    {method} {path}?{query} -> {status}")
    return got, headers, body_json


def fail(what, why):
    print(f"FAIL  {what}: {why}")
    sys.exit(1)


def first_watch_event(prefix):
    """The first event of GET /v1/watch?prefix=PREFIX, checked against the document, the stream then closed."""
    what = f"GET /v1/watch?prefix={prefix}"
    with urllib.request.urlopen(f"{base}/v1/watch?prefix={prefix}&after=0", timeout=10) as r:
        content = doc["paths"]["/v1/watch"]["get"]["responses"]["200"]["content"]
        ctype = r.headers.get("Content-Type", "").split(";")[0].strip()
        if r.status != 200 or ctype not in content:
            fail(what, f"answered {r.status} {ctype!r}, expected 200 and one of {sorted(content)}")
        fields = {}
        for line in r:  # the first event: lines up to a blank one, comments skipped
            line = line.decode().rstrip("\r\n")
            if not line and fields:
                break
            if line and not line.startswith(":"):
                key, _, value = line.partition(":")
                fields[key] = value.removeprefix(" ")
    if fields.get("event") != "lock":
        fail(what, f"the first event is not a lock: {fields}")
    event = json.loads(fields["data"])
    root = dict(doc)
    root.update(deref(content[ctype]["x-itemSchema"]))
    errors = list(jsonschema.Draft202012Validator(root).iter_errors(event))
    if errors:
        fail(what, f"the event does not match WatchEvent: {errors[0].message}\n{fields['data']}")
    if fields.get("id") != str(event["revision"]):
        fail(what, f"the event's id is not its revision: {fields}")
    print(f"ok    {what} -> an event")
    return event


LOCK, SEM, DELAYED = "/v1/locks/{name}", "/v1/locks/openapi-sem", "/v1/locks/openapi-delayed"
name = f"openapi-walk-{int(time.time() * 1000)}"
path = f"/v1/locks/{name}"

_, _, grant = call("POST", LOCK, path, 200, "ttl=2s&owner=walker&value=v1")
token = grant["token"]
_, headers, busy = call("POST", LOCK, path, 409, "owner=other")
assert busy["type"] == "urn:holdfast:busy" and busy["holder"]["owner"] == "walker", busy
assert int(headers["Retry-After"]) >= 1
call("POST", LOCK, path, 409, "limit=2")  # limit-mismatch
call("POST", LOCK + "/renew", path + "/renew", 200, f"token={token}&ttl=2")
_, _, valued = call("POST", LOCK + "/value", path + "/value", 200, f"token={token}", b"\xff\xfe",
                    "application/octet-stream")
assert valued["value_base64"] == "//4=", valued
_, _, lock = call("GET", LOCK, path, 200)
call("GET", LOCK, path, 200, f"after={lock['revision']}&wait=0.2")  # unchanged
call("GET", "/v1/locks", "/v1/locks", 200, "prefix=openapi-walk-&limit=1")
call("DELETE", LOCK, path, 200, f"token={token}")
call("DELETE", LOCK, path, 409, f"token={token}")  # not-holder
call("GET", LOCK, path, 404)
_, _, watched = call("GET", LOCK, path, 200, "after=0")
assert watched["holder"] is None, watched

sem = f"{SEM}-{name}"
for owner in ("a", "b"):
    call("POST", LOCK, sem, 200, f"limit=2&owner={owner}&ttl=2")
_, _, lock = call("GET", LOCK, sem, 200)
assert len(lock["holders"]) == 2 and lock["limit"] == 2, lock
# The semaphore's 2 s holds are still there: the watch of its name begins with them.
event = first_watch_event(sem[len("/v1/locks/"):])
assert event["initial"] and len(event["holders"]) == 2, event
call("GET", "/v1/watch", "/v1/watch", 400, "after=x")

delayed = f"{DELAYED}-{name}"
call("POST", LOCK, delayed, 200, "ttl=0.5&lock_delay=1s&owner=paused")
deadline = time.time() + 5
while True:  # the leader expires a hold within about 100 ms of its expires_at
    _, _, lock = call("GET", LOCK, delayed, 200)
    if "free_at" in lock["holder"] or time.time() > deadline:
        break
    time.sleep(0.1)
assert "free_at" in lock["holder"], lock
_, _, busy = call("POST", LOCK, delayed, 409)
assert "free_at_ms" in busy["holder"], busy



_, headers, _ = call("GET", "/", "/", 200)
assert "connect-src 'self'" in headers["Content-Security-Policy"], dict(headers)
call("GET", "/ui/page.js", "/ui/page.js", 200)
call("GET", "/ui/page.css", "/ui/page.css", 200)
call("GET", "/v1/cluster", "/v1/cluster", 200)
call("GET", "/readyz", "/readyz", 200)
call("GET", "/livez", "/livez", 200)
call("GET", "/metrics", "/metrics", 200)
call("GET", "/v1/openapi.json", "/v1/openapi.json", 200)
call("POST", "/v1/signup", "/v1/signup", 403)  # auth-off
call("POST", "/v1/cluster/snapshot", "/v1/cluster/snapshot", 401)  # the node has an admin key
# Not operations: the router's own answers, problems too.
_, headers, problem = call("PUT", None, path, 405)
assert problem["type"] == "urn:holdfast:method-not-allowed" and "Allow" in headers, (problem, dict(headers))
_, _, problem = call("GET", None, "/v1/no-such-thing", 404)
assert problem["type"] == "urn:holdfast:no-route", problem
print("openapi-walk: every answer matches the document")
