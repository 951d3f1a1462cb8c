//! API keys and tenants (`--auth`) on real clusters: no key, a wrong key, signup off and on, each key its
//! own namespace (another tenant's lock by name does not exist), per-key limits and rate, revocation on
//! every node, and the same over gRPC with the Rust client.

use std::time::Duration;

use serde_json::Value;

use crate::common::{wait_for, Cluster, Grant, Reply, READY_BOUND};

const ADMIN_KEY: &str = "auth-test-admin-key-0123";

async fn signup(cluster: &Cluster, id: usize, bearer: Option<&str>) -> Reply {
    let mut request = cluster.http().post(format!("{}/v1/signup", cluster.client_url(id)));
    if let Some(key) = bearer {
        request = request.bearer_auth(key);
    }
    cluster.send(request, "signup").await
}

/// A new key, made by the admin.
async fn new_key(cluster: &Cluster) -> (String, String) {
    let reply = signup(cluster, 1, Some(ADMIN_KEY)).await;
    let body = reply.ok("signup by the admin");
    (body["api_key"].as_str().unwrap().to_owned(), body["tenant"].as_str().unwrap().to_owned())
}

async fn call(cluster: &Cluster, method: reqwest::Method, id: usize, path: &str, key: Option<&str>) -> Reply {
    let mut request = cluster.http().request(method.clone(), format!("{}{path}", cluster.client_url(id)));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    cluster.send(request, &format!("{method} {path}")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_api_key_is_its_own_namespace_with_limits_and_revocation() {
    use reqwest::Method;
    let args = ["--auth", "--admin-key", ADMIN_KEY, "--key-locks-max", "3"];
    let cluster = Cluster::start_with(3, &args).await;

    // No key, a wrong key: 401, nothing changes.
    let path = "/v1/locks/job?ttl=60s&owner=nobody";
    call(&cluster, Method::POST, 1, path, None).await.assert_problem(401, "unauthenticated", "no key");
    call(&cluster, Method::POST, 2, path, Some("hf_0000")).await.assert_problem(401, "unauthenticated", "wrong key");
    call(&cluster, Method::GET, 3, "/v1/locks", None).await.assert_problem(401, "unauthenticated", "list, no key");

    // Signup is off: only the admin makes keys.
    signup(&cluster, 2, None).await.assert_problem(403, "signup-off", "anonymous signup");
    let (key_a, _) = new_key(&cluster).await;
    let (key_b, tenant_b) = new_key(&cluster).await;
    assert_ne!(key_a, key_b);
    assert!(key_a.starts_with("hf_"), "{key_a}");

    // Both tenants hold their own "job" at once.
    let a = Grant::from_reply(
        &call(&cluster, Method::POST, 1, "/v1/locks/job?ttl=60s&owner=a-worker", Some(&key_a)).await,
        "a",
    );
    let b = Grant::from_reply(
        &call(&cluster, Method::POST, 2, "/v1/locks/job?ttl=60s&owner=b-worker", Some(&key_b)).await,
        "b",
    );
    assert_eq!((a.name.as_str(), a.owner.as_str(), b.name.as_str()), ("job", "a-worker", "job"));
    assert_ne!(a.fence, b.fence);
    // To b, a's lock does not exist: not by name, not in a list, not with a's token.
    let only_a = call(&cluster, Method::POST, 1, "/v1/locks/only-a?ttl=60s", Some(&key_a)).await;
    let only_a = Grant::from_reply(&only_a, "a's second lock");
    call(&cluster, Method::GET, 3, "/v1/locks/only-a", Some(&key_b)).await.assert_problem(
        404,
        "not-found",
        "a's lock to b",
    );
    let seen = call(&cluster, Method::GET, 3, "/v1/locks/job", Some(&key_b)).await;
    assert_eq!(seen.ok("b's job")["holder"]["owner"], "b-worker", "{seen:?}");
    let listed = call(&cluster, Method::GET, 2, "/v1/locks", Some(&key_b)).await;
    let names: Vec<&str> =
        listed.ok("b's list")["locks"].as_array().unwrap().iter().map(|l| l["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["job"], "b sees only its own lock: {listed:?}");
    let steal = format!("/v1/locks/job?token={}", a.token);
    call(&cluster, Method::DELETE, 2, &steal, Some(&key_b)).await.assert_problem(
        409,
        "not-holder",
        "a's token on b's job",
    );
    let page = call(&cluster, Method::GET, 1, "/v1/locks", Some(&key_a)).await;
    assert!(!page.body.to_string().contains("b-worker") && !page.body.to_string().contains('/'), "{page:?}");

    // Limits: b may have 3 locks.
    for name in ["l1", "l2"] {
        call(&cluster, Method::POST, 1, &format!("/v1/locks/{name}?ttl=60s"), Some(&key_b)).await.ok("b's locks");
    }
    let over = call(&cluster, Method::POST, 1, "/v1/locks/l3?ttl=60s", Some(&key_b)).await;
    over.assert_problem(429, "too-many-locks", "b's fourth lock");
    assert_eq!(over.retry_after.as_deref(), Some("1"), "{over:?}");
    let l3 = call(&cluster, Method::POST, 1, "/v1/locks/l3?ttl=60s", Some(&key_a)).await;
    let l3 = Grant::from_reply(&l3, "a has its own budget");
    // a lets two go, to make room for its gRPC locks below.
    for lock in [&only_a, &l3] {
        let path = format!("/v1/locks/{}?token={}", lock.name, lock.token);
        call(&cluster, Method::DELETE, 2, &path, Some(&key_a)).await.ok("a releases");
    }

    // b's Rust client opens its stream of one-shot calls before the revocation below.
    let endpoints: Vec<String> = cluster.ids().map(|id| cluster.client_addr(id).to_string()).collect();
    let client_b = holdfast_client::Client::builder(endpoints.clone()).api_key(&key_b).connect().await.unwrap();
    assert_eq!(client_b.get("nothing-here").await, Ok(None));

    // The admin lists and revokes keys; a tenant's key is not an admin key.
    call(&cluster, Method::GET, 1, "/v1/keys", Some(&key_a)).await.assert_problem(401, "unauthenticated", "a lists");
    let keys = call(&cluster, Method::GET, 2, "/v1/keys", Some(ADMIN_KEY)).await;
    let tenants: Vec<&Value> =
        keys.ok("the admin lists keys")["keys"].as_array().unwrap().iter().map(|k| &k["tenant"]).collect();
    assert_eq!(tenants.len(), 2, "{keys:?}");
    call(&cluster, Method::DELETE, 3, &format!("/v1/keys/{tenant_b}"), Some(ADMIN_KEY)).await.ok("revoke b");
    for id in cluster.ids() {
        wait_for(READY_BOUND, &format!("node {id} to refuse the revoked key"), async || {
            let reply = call(&cluster, Method::GET, id, "/v1/locks", Some(&key_b)).await;
            if reply.status == 401 {
                Ok(())
            } else {
                Err(format!("{reply:?}"))
            }
        })
        .await;
    }
    call(&cluster, Method::DELETE, 1, &format!("/v1/keys/{tenant_b}"), Some(ADMIN_KEY)).await.assert_problem(
        404,
        "not-found",
        "revoking twice",
    );
    call(&cluster, Method::GET, 1, "/v1/locks/job", Some(&key_a)).await.ok("a is untouched");

    // A call on the stream b opened before the revocation is refused too.
    let refused = client_b.acquire("after-revocation", Duration::from_secs(30), Duration::ZERO).await;
    assert!(matches!(refused, Err(holdfast_client::Error::Unauthenticated(_))), "{refused:?}");

    // gRPC, through the Rust client: the key goes in the metadata; none, or a revoked one, is refused.
    let client = holdfast_client::Client::builder(endpoints.clone()).api_key(&key_a).connect().await.unwrap();
    let held = client.acquire("grpc-job", Duration::from_secs(30), Duration::ZERO).await.unwrap();
    assert_eq!(held.name, "grpc-job");
    let view = client.get("job").await.unwrap().expect("a's job is held");
    assert_eq!(view.holder.map(|h| h.owner).as_deref(), Some("a-worker"));
    let session = client.session(Duration::from_secs(5)).await.unwrap();
    let lock = session.lock("session-job", Some(Duration::from_secs(5))).await.unwrap();
    assert!(lock.fence() > 0);
    let anonymous = holdfast_client::Client::builder(endpoints.clone()).connect().await.unwrap();
    let refused = anonymous.acquire("x", Duration::from_secs(30), Duration::ZERO).await;
    assert!(matches!(refused, Err(holdfast_client::Error::Unauthenticated(_))), "{refused:?}");
    let revoked = holdfast_client::Client::builder(endpoints).api_key(&key_b).connect().await.unwrap();
    assert!(matches!(revoked.session(Duration::from_secs(5)).await, Err(holdfast_client::Error::Unauthenticated(_))));
    session.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_signup_gives_anyone_a_key_and_each_key_a_request_budget() {
    let cluster = Cluster::start_with(1, &["--auth", "--open-signup", "--key-rate", "5"]).await;
    let reply = signup(&cluster, 1, None).await;
    let key = reply.ok("open signup")["api_key"].as_str().unwrap().to_owned();
    // Without an admin key, admin calls are off under --auth.
    let keys = cluster.send(cluster.http().get(format!("{}/v1/keys", cluster.client_url(1))), "list keys").await;
    keys.assert_problem(403, "no-admin-key", "list keys without an admin key set");

    let mut limited = None;
    for _ in 0..20 {
        let reply = call(&cluster, reqwest::Method::GET, 1, "/v1/locks", Some(&key)).await;
        if reply.status == 429 {
            limited = Some(reply);
            break;
        }
        reply.ok("within the budget");
    }
    let limited = limited.expect("20 requests at once exceed a budget of 5 per second");
    limited.assert_problem(429, "rate-limited", "over the budget");
    assert_eq!(limited.retry_after.as_deref(), Some("1"));
    // The budget refills: within a bound, the key works again.
    wait_for(READY_BOUND, "the budget to refill", async || {
        let reply = call(&cluster, reqwest::Method::GET, 1, "/v1/locks", Some(&key)).await;
        if reply.status == 200 {
            Ok(())
        } else {
            Err(format!("{reply:?}"))
        }
    })
    .await;

    // The Rust client's one-shot calls travel on one stream; each call spends from the budget all the same.
    // A new key, with a full budget: the stream's opening takes one request of it, each call one more.
    let key = signup(&cluster, 1, None).await.ok("a second signup")["api_key"].as_str().unwrap().to_owned();
    let client = holdfast_client::Client::builder([cluster.client_addr(1).to_string()]).api_key(&key).build().unwrap();
    let mut answers = Vec::new();
    for _ in 0..20 {
        let answer = client.get("anything").await;
        let over = matches!(answer, Err(holdfast_client::Error::LimitReached(_)));
        answers.push(answer);
        if over {
            break;
        }
    }
    assert!(matches!(answers.last(), Some(Err(holdfast_client::Error::LimitReached(_)))), "{answers:?}");
    let within = &answers[..answers.len() - 1];
    assert!(!within.is_empty() && within.iter().all(|a| a == &Ok(None)), "within the budget first: {answers:?}");
}

/// A key is acknowledged once the leader applied its entry; a follower that has not applied it yet catches
/// up before it refuses the key, so a key made through the leader works through every follower at once.
/// (Without the catch-up, most rounds were refused by a follower: the leader answers as soon as it applied
/// the entry, and tells the followers of the commit with its next entries.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_made_through_one_node_works_through_the_others_at_once() {
    use reqwest::Method;
    let cluster = Cluster::start_with(3, &["--auth", "--admin-key", ADMIN_KEY]).await;
    let leader = cluster.leader().await;
    let followers: Vec<usize> = cluster.ids().filter(|id| *id != leader).collect();
    for round in 0..10 {
        let reply = signup(&cluster, leader, Some(ADMIN_KEY)).await;
        let key = reply.ok("signup through the leader")["api_key"].as_str().unwrap().to_owned();
        for node in &followers {
            let what = format!("round {round}: a new key through follower {node}");
            call(&cluster, Method::GET, *node, "/v1/locks", Some(&key)).await.ok(&what);
        }
    }
    // A key nobody made is still refused, after the catch-up.
    call(&cluster, Method::GET, followers[0], "/v1/locks", Some("hf_0000")).await.assert_problem(
        401,
        "unauthenticated",
        "a made-up key",
    );
}
