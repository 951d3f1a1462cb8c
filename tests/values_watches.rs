//! Values on locks, watches and elections against real 3-process clusters: a value published with a grant
//! and changed by its holder, through any node and both interfaces; a long poll through a follower woken by
//! a change made through another node; the Rust client's watch seeing every change in order; three
//! `holdfast elect` processes whose leader is killed with -9, replaced, and observed in fence order. Each
//! test starts its own cluster (see `common`); every wait is bounded.

use std::time::Duration;

use serde_json::Value;

use crate::common::{wait_for, wait_for_file, ClientProc, Cluster, Grant, Reply, ELECTION_BOUND};

/// Three nodes, as in the smallest production deployment.
const NODES: usize = 3;

/// A lock's revision as a read or watch showed it.
fn revision(reply: &Reply, what: &str) -> u64 {
    reply.ok(what)["revision"].as_u64().unwrap_or_else(|| panic!("{what}: no revision in {reply:#?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_is_published_with_its_grant_changed_by_its_holder_and_bad_ones_change_nothing() {
    let cluster = Cluster::start(NODES).await;
    let leader = cluster.leader().await;
    let follower = cluster.other_than(&[leader]);
    let other = cluster.other_than(&[leader, follower]);

    // Taken through a follower with a value in the query.
    let taken = cluster.post(follower, "/v1/locks/leader?ttl=60&owner=node-a&value=10.0.0.1%3A7070").await;
    let grant = Grant::from_reply(&taken, "the acquire with a value");
    assert_eq!(taken.body["value"], "10.0.0.1:7070", "{taken:#?}");
    let read = cluster.lock(leader, "leader").await;
    assert_eq!(read.ok("read")["holder"]["value"], "10.0.0.1:7070");
    let granted_at = revision(&read, "read");
    assert_eq!(granted_at, grant.fence, "the grant is the lock's last change");

    // Whoever finds it held is told the value.
    let busy = cluster.post(other, "/v1/locks/leader?ttl=60&owner=node-b&value=10.0.0.2%3A7070").await;
    busy.assert_problem(409, "busy", "a second acquire");
    assert_eq!(busy.body["holder"]["value"], "10.0.0.1:7070", "{busy:#?}");

    // The holder changes it through the third node: same fence, a later revision.
    let path = format!("/v1/locks/leader/value?token={}&value=10.0.0.9%3A7070", grant.token);
    let changed = cluster.post(other, &path).await;
    assert_eq!(changed.ok("the value change")["fence"].as_u64(), Some(grant.fence));
    assert_eq!(changed.body["value"], "10.0.0.9:7070");
    let read = cluster.lock(follower, "leader").await;
    assert_eq!(read.ok("read after the change")["holder"]["value"], "10.0.0.9:7070");
    let changed_at = revision(&read, "read after the change");
    assert!(changed_at > granted_at, "the change moved the revision: {granted_at} -> {changed_at}");

    // A binary value as the body: shown as base64.
    let url = format!("{}/v1/locks/leader/value?token={}", cluster.client_url(leader), grant.token);
    let request = cluster.http().post(&url).header("content-type", "application/octet-stream").body(vec![0xff, 0, 1]);
    let binary = cluster.send(request, "a binary value").await;
    assert_eq!(binary.ok("a binary value")["value_base64"], "/wAB", "{binary:#?}");
    let after_good = cluster.lock(leader, "leader").await;
    let state = after_good.ok("read before the refusals").clone();

    // Refused, each with its problem, and nothing changes: a value too long (query or body), a value given
    // twice, a body of another type, another's token.
    let long = "v".repeat(1025);
    let refusals: Vec<(reqwest::RequestBuilder, u16, &str)> = vec![
        (cluster.http().post(format!("{url}&value={long}")), 400, "invalid-value"),
        (cluster.http().post(&url).header("content-type", "text/plain").body(long.clone()), 400, "invalid-value"),
        (
            cluster.http().post(format!("{url}&value=x")).header("content-type", "text/plain").body("y"),
            400,
            "invalid-value",
        ),
        (
            cluster.http().post(&url).header("content-type", "application/x-www-form-urlencoded").body("value=z"),
            400,
            "invalid-value",
        ),
        (
            cluster.http().post(format!(
                "{}/v1/locks/leader/value?token=0123456789abcdef0123456789abcdef&value=mine",
                cluster.client_url(follower)
            )),
            409,
            "not-holder",
        ),
        (
            cluster.http().post(format!("{}/v1/locks/fresh?value={long}", cluster.client_url(other))),
            400,
            "invalid-value",
        ),
    ];
    for (i, (request, status, slug)) in refusals.into_iter().enumerate() {
        let what = format!("refusal {i}");
        cluster.send(request, &what).await.assert_problem(status, slug, &what);
    }
    let after = cluster.lock(leader, "leader").await;
    assert_eq!(after.ok("read after the refusals"), &state, "a refused request changed the lock");
    cluster.lock(leader, "fresh").await.assert_problem(404, "not-found", "the refused acquire of fresh");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_through_a_follower_answers_at_the_change_another_node_makes() {
    let cluster = std::sync::Arc::new(Cluster::start(NODES).await);
    let leader = cluster.leader().await;
    let follower = cluster.other_than(&[leader]);
    let other = cluster.other_than(&[leader, follower]);

    // A lock that never existed: revision 0, and a poll after 0 that times out says so.
    let quiet = cluster.get(follower, "/v1/locks/job?after=0&wait=200ms").await;
    let body = quiet.ok("a poll of a lock nobody took");
    assert_eq!((body["revision"].as_u64(), body["changed"].as_bool()), (Some(0), Some(false)), "{body}");
    assert!(body["holder"].is_null(), "{body}");

    let grant = Grant::from_reply(&cluster.acquire(other, "job", "w1", "60").await, "the acquire");
    let held = cluster.get(follower, "/v1/locks/job?after=0&wait=30s").await;
    let body = held.ok("a poll after 0 of a held lock");
    assert_eq!(body["changed"], true, "answered at once: {body}");
    assert_eq!(body["holder"]["owner"], "w1");
    let rev = body["revision"].as_u64().expect("revision");

    // A poll after the current revision waits; a release through another node wakes it.
    let poll = {
        let cluster = cluster.clone();
        tokio::spawn(async move { cluster.get(follower, &format!("/v1/locks/job?after={rev}&wait=30s")).await })
    };
    cluster.release(other, "job", &grant.token).await.ok("the release");
    let woken = tokio::time::timeout(Duration::from_secs(25), poll)
        .await
        .expect("the poll answered before its wait ran out")
        .expect("the poll task");
    let body = woken.ok("the woken poll");
    assert_eq!(body["changed"], true, "{body}");
    assert!(body["holder"].is_null(), "freed: {body}");
    let freed_at = body["revision"].as_u64().expect("revision");
    assert!(freed_at > rev, "the release is a later revision: {rev} -> {freed_at}");

    // The freed lock remembers the release's revision: a poll after it waits, one after the old answers.
    let unchanged = cluster.get(leader, &format!("/v1/locks/job?after={freed_at}&wait=100ms")).await;
    assert_eq!(unchanged.ok("a poll after the release")["changed"], false);
    let stale = cluster.get(other, &format!("/v1/locks/job?after={rev}&wait=30s")).await;
    assert_eq!(stale.ok("a poll after the grant")["revision"].as_u64(), Some(freed_at));

    // Bad input is refused.
    cluster.get(follower, "/v1/locks/job?after=x").await.assert_problem(400, "invalid-query", "after=x");
    cluster.get(follower, "/v1/locks/job?wait=1s").await.assert_problem(400, "invalid-query", "wait without after");
    cluster.get(follower, "/v1/locks/job?after=0&wait=2d").await.assert_problem(400, "invalid-wait", "a long wait");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_watch_sees_every_change_in_order_and_the_holders_value() {
    let cluster = Cluster::start(NODES).await;
    let leader = cluster.leader().await;
    let follower = cluster.other_than(&[leader]);
    // The watch talks to a follower; the changes are made through the leader.
    let watcher = holdfast_client::Client::builder([cluster.client_addr(follower).to_string()]).build().unwrap();
    let client = holdfast_client::Client::builder([cluster.client_addr(leader).to_string()]).build().unwrap();
    let mut watch = watcher.watch("svc");
    let first = watch.next().await.expect("the first state");
    assert_eq!((first.holder.clone(), first.revision), (None, 0), "{first:?}");

    let session = client.session(Duration::from_secs(5)).await.expect("a session");
    let mut held = session.lock_with_value("svc", None, "addr-1").await.expect("the lock");
    assert_eq!(held.value(), b"addr-1");
    let other = client.session(Duration::from_secs(5)).await.expect("a second session");
    let waiting = {
        let other = other.clone();
        tokio::spawn(async move { other.lock_with_value("svc", None, "addr-2").await })
    };
    let mut seen = Vec::new();
    // Granted; a waiter joined; the value changed; handed over to the waiter with its own value.
    let granted = watch.next().await.expect("the grant");
    seen.push(granted.clone());
    let holder = granted.holder.clone().expect("held");
    assert_eq!((holder.fence, holder.value.as_slice()), (held.fence(), &b"addr-1"[..]));
    let joined = watch.next().await.expect("the waiter joining");
    assert_eq!(joined.waiters.len(), 1, "{joined:?}");
    held.set_value("addr-1b").await.expect("the value change");
    let changed = watch.next().await.expect("the value change");
    let holder = changed.holder.clone().expect("held");
    assert_eq!((holder.fence, holder.value.as_slice()), (held.fence(), &b"addr-1b"[..]));
    held.release().await.expect("the release");
    let handed = watch.next().await.expect("the hand-over");
    let next = waiting.await.expect("the waiting task").expect("the second session's lock");
    let holder = handed.holder.clone().expect("handed over");
    assert_eq!((holder.fence, holder.value.as_slice(), handed.waiters.len()), (next.fence(), &b"addr-2"[..], 0));
    seen.extend([joined, changed, handed]);
    for pair in seen.windows(2) {
        assert!(pair[0].revision < pair[1].revision, "revisions grow: {seen:#?}");
    }
    other.close().await.expect("close");
    let freed = watch.next().await.expect("the close");
    assert!(freed.holder.is_none() && freed.revision > seen[3].revision, "{freed:?}");
    session.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_elect_processes_follow_each_other_and_observers_see_the_leaders_in_fence_order() {
    let cluster = Cluster::start(NODES).await;
    let work = tempfile::tempdir().expect("a work directory");
    let dir = work.path();
    let endpoints = cluster.endpoints();
    let observe = |label: &str| {
        let args = ["elect", "e", "--observe", "--json", "--endpoints", &endpoints];
        ClientProc::start(dir, label, &args.map(str::to_owned))
    };
    let mut observer = observe("observer");
    let candidate = |i: usize| {
        let label = format!("candidate-{i}");
        let script = format!("echo $$ > {label}.pid; echo $HOLDFAST_FENCE > {label}.leading; sleep 120");
        let args = [
            "elect",
            "e",
            "--value",
            &format!("10.0.0.{i}:7070"),
            "--ttl",
            "2s",
            "--endpoints",
            &endpoints,
            "--",
            "sh",
            "-c",
            &script,
        ];
        ClientProc::start(dir, &label, &args.map(str::to_owned))
    };
    let mut candidates: Vec<ClientProc> = (1..=3).map(candidate).collect();
    let leading = |i: usize| dir.join(format!("candidate-{i}.leading"));
    let first = wait_for(ELECTION_BOUND, "a first leader", async || {
        (1..=3).find(|i| leading(*i).exists()).ok_or_else(|| "nobody leads yet".to_string())
    })
    .await;
    let first_fence: u64 = wait_for_file(&leading(first), ELECTION_BOUND, "its fence").await.trim().parse().unwrap();
    let led = |cluster_reply: &Reply| cluster_reply.body["holder"]["value"].clone();
    let read = cluster.lock(cluster.leader().await, "e").await;
    assert_eq!(led(&read), Value::from(format!("10.0.0.{first}:7070")), "{read:#?}");

    // The leader's process dies with -9: its session's lease runs out and the next candidate leads.
    candidates[first - 1].kill();
    let second = wait_for(Duration::from_secs(30), "a second leader", async || {
        (1..=3).find(|i| *i != first && leading(*i).exists()).ok_or_else(|| "nobody took over yet".to_string())
    })
    .await;
    let second_fence: u64 = wait_for_file(&leading(second), ELECTION_BOUND, "its fence").await.trim().parse().unwrap();
    assert!(second_fence > first_fence, "fences grow from leader to leader: {first_fence} -> {second_fence}");
    let read = cluster.lock(cluster.leader().await, "e").await;
    assert_eq!(led(&read), Value::from(format!("10.0.0.{second}:7070")), "{read:#?}");
    assert!(!leading(6 - first - second).exists(), "the third candidate still waits");

    // The observer printed both leaders, in fence order; a late observer starts from the leader now.
    let mut late = observe("late");
    let lines = |label: &str| -> Vec<Value> {
        let text = std::fs::read_to_string(dir.join(format!("{label}.out"))).unwrap_or_default();
        text.lines().filter_map(|line| serde_json::from_str(line).ok()).collect()
    };
    let fences = |label: &str| -> Vec<u64> { lines(label).iter().filter_map(|l| l["fence"].as_u64()).collect() };
    wait_for(ELECTION_BOUND, "the observers to print the second leader", async || {
        let (seen, late_seen) = (fences("observer"), fences("late"));
        if seen.contains(&second_fence) && late_seen == [second_fence] {
            Ok(())
        } else {
            Err(format!("observer {seen:?}, late {late_seen:?}"))
        }
    })
    .await;
    let seen = fences("observer");
    assert!(seen.contains(&first_fence), "the observer saw the first leader: {:?}", lines("observer"));
    assert!(seen.windows(2).all(|pair| pair[0] < pair[1]), "in fence order: {seen:?}");
    observer.kill();
    late.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_watch_begins_with_the_locks_under_it_and_resumes_through_another_node_when_its_node_dies() {
    let mut cluster = Cluster::start(NODES).await;
    let leader = cluster.leader().await;
    let follower = cluster.other_than(&[leader]);
    let other = cluster.other_than(&[leader, follower]);
    let a = Grant::from_reply(&cluster.acquire(leader, "job-a", "w1", "60").await, "job-a");
    let b = Grant::from_reply(&cluster.acquire(leader, "job-b", "w2", "60").await, "job-b");
    cluster.acquire(leader, "other", "w3", "60").await.ok("other");
    // Through the follower first, the third node next.
    let endpoints = [cluster.client_addr(follower).to_string(), cluster.client_addr(other).to_string()];
    let client = holdfast_client::Client::builder(endpoints).build().unwrap();
    let mut watch = client.watch_prefix("job-");
    let first = watch.next().await.expect("job-a");
    let second = watch.next().await.expect("job-b");
    assert_eq!((first.name.as_str(), first.revision), ("job-a", a.fence), "{first:?}");
    assert_eq!((second.name.as_str(), second.revision), ("job-b", b.fence), "{second:?}");

    // Changes under the prefix come in log order; one outside it does not come.
    cluster.release(other, "job-a", &a.token).await.ok("release job-a");
    cluster.acquire(other, "other-2", "w4", "60").await.ok("other-2");
    let c = Grant::from_reply(&cluster.acquire(other, "job-c", "w5", "60").await, "job-c");
    let freed = watch.next().await.expect("job-a freed");
    assert_eq!((freed.name.as_str(), freed.holder.is_none()), ("job-a", true), "{freed:?}");
    let taken = watch.next().await.expect("job-c taken");
    assert_eq!((taken.name.as_str(), taken.revision), ("job-c", c.fence), "{taken:?}");

    // A list gives a revision to watch after: nothing before it comes again.
    let page = client.list("job-", None, 100).await.expect("a list");
    assert_eq!(page.locks.iter().map(|l| l.name.as_str()).collect::<Vec<_>>(), ["job-b", "job-c"]);
    let mut after_list = client.watch_prefix_after("job-", page.revision);

    // The watch's node dies; a change made meanwhile comes after the resume through the third node.
    cluster.kill(follower);
    cluster.release(other, "job-b", &b.token).await.ok("release job-b");
    let resumed = tokio::time::timeout(ELECTION_BOUND, watch.next()).await.expect("in time").expect("job-b freed");
    assert_eq!((resumed.name.as_str(), resumed.holder.is_none()), ("job-b", true), "{resumed:?}");
    assert!(watch.resumes() >= 1, "the watch resumed");
    let listed =
        tokio::time::timeout(ELECTION_BOUND, after_list.next()).await.expect("in time").expect("after the list");
    assert_eq!((listed.name.as_str(), listed.holder.is_none()), ("job-b", true), "{listed:?}");
}

/// One server-sent event of `GET /v1/watch`: its `id` and the lock its data shows.
#[derive(Debug)]
struct SseLock {
    id: u64,
    lock: Value,
}

/// A `GET /v1/watch` stream, read event by event.
struct SseStream {
    response: reqwest::Response,
    buffer: String,
}

impl SseStream {
    async fn open(cluster: &Cluster, id: usize, query: &str) -> SseStream {
        let url = format!("{}/v1/watch?{query}", cluster.client_url(id));
        let response = cluster.http().get(&url).send().await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
        assert_eq!(response.status(), 200, "GET {url}");
        let content_type = response.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("");
        assert!(content_type.starts_with("text/event-stream"), "GET {url}: {content_type}");
        SseStream { response, buffer: String::new() }
    }

    /// The next `lock` event (comments skipped), within 10 s.
    async fn next(&mut self) -> SseLock {
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if let Some(end) = self.buffer.find("\n\n") {
                    let block: String = self.buffer.drain(..end + 2).collect();
                    let field = |name: &str| {
                        block.lines().find_map(|l| l.strip_prefix(name).map(|v| v.trim_start().to_owned()))
                    };
                    let Some(data) = field("data:") else { continue };
                    assert_eq!(field("event:").as_deref(), Some("lock"), "{block}");
                    let id = field("id:").and_then(|id| id.parse().ok()).unwrap_or_else(|| panic!("an id: {block}"));
                    return SseLock { id, lock: serde_json::from_str(&data).expect("the data is JSON") };
                }
                let chunk = self.response.chunk().await.expect("the stream reads").expect("the stream goes on");
                self.buffer.push_str(std::str::from_utf8(&chunk).expect("UTF-8"));
            }
        })
        .await
        .expect("an event within 10 s")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_prefix_watch_through_a_follower_streams_each_change_in_log_order_and_resumes_after_an_id() {
    let cluster = Cluster::start(NODES).await;
    let leader = cluster.leader().await;
    let follower = cluster.other_than(&[leader]);
    let other = cluster.other_than(&[leader, follower]);

    let listed = revision(&cluster.get(follower, "/v1/locks?prefix=job-").await, "the list");
    let mut stream = SseStream::open(&cluster, follower, &format!("prefix=job-&after={listed}")).await;
    let a = Grant::from_reply(&cluster.acquire(other, "job-a", "w1", "60").await, "job-a");
    cluster.acquire(leader, "elsewhere", "w9", "60").await.ok("a lock outside the prefix");
    Grant::from_reply(&cluster.acquire(leader, "job-b", "w2", "60").await, "job-b");
    cluster.release(other, "job-a", &a.token).await.ok("job-a's release");

    let events = [stream.next().await, stream.next().await, stream.next().await];
    let seen: Vec<(&str, Option<&str>, bool)> = events
        .iter()
        .map(|e| (e.lock["name"].as_str().unwrap(), e.lock["holder"]["owner"].as_str(), e.lock["initial"] == true))
        .collect();
    assert_eq!(seen, [("job-a", Some("w1"), false), ("job-b", Some("w2"), false), ("job-a", None, false)]);
    assert_eq!(events[0].lock["holder"]["fence"].as_u64(), Some(a.fence), "{:?}", events[0]);
    assert!(events.windows(2).all(|w| w[0].id < w[1].id), "ids grow in log order: {events:?}");
    assert!(events.iter().all(|e| e.lock["revision"].as_u64() == Some(e.id)), "an id is its revision");
    drop(stream);

    // Resumed after the second event's id (through another node): the change after it, and nothing before.
    let mut resumed = SseStream::open(&cluster, other, &format!("prefix=job-&after={}", events[1].id)).await;
    let first = resumed.next().await;
    assert_eq!(
        (first.id, first.lock["name"].as_str(), first.lock["initial"].as_bool()),
        (events[2].id, Some("job-a"), Some(true))
    );
    assert!(first.lock["holder"].is_null(), "{first:?}");

    cluster.get(follower, "/v1/watch?after=x").await.assert_problem(400, "invalid-query", "after=x");
    cluster.get(follower, "/v1/watch?prefx=job-").await.assert_problem(400, "invalid-query", "an unknown parameter");
}
