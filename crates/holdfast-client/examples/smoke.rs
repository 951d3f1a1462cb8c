//! A smoke test of the client against a running cluster: every call once, a hand-over between two sessions,
//! a queue timeout and `with_lock`.
//!
//! ```text
//! cargo run -p holdfast-client --example smoke -- 127.0.0.1:7070 127.0.0.1:7170 127.0.0.1:7270
//! ```
//!
//! With `--hold SECONDS` it instead holds one lock in a session (lease `--lease SECONDS`, default 2) for that
//! long, printing the session's state every second: kill the node it talks to (`cluster/cluster.sh kill N`)
//! to watch it resume elsewhere. The lease must outlast the new leader's election for the lock to survive.
//! Logs go to stderr; set `RUST_LOG=holdfast_client=debug` for more.

use std::time::Duration;

use holdfast_client::{Client, Error};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "holdfast_client=info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let hold = take_seconds(&mut args, "--hold")?;
    let lease = take_seconds(&mut args, "--lease")?.unwrap_or(Duration::from_secs(2));
    if args.is_empty() {
        args.push("127.0.0.1:7070".into());
    }
    let client = Client::builder(&args).owner("smoke").connect().await?;
    println!("connected; preferred endpoint {}", client.preferred_endpoint());
    match hold {
        Some(duration) => hold_for(&client, duration, lease).await,
        None => smoke(&client).await,
    }
}

async fn smoke(client: &Client) -> Result<()> {
    let status = client.cluster_status().await?;
    println!("cluster status: {status:?}");

    // One-shot calls.
    let name = format!("smoke-oneshot-{}", std::process::id());
    let hold = client.acquire(&name, Duration::from_secs(5), Duration::ZERO).await?;
    println!("acquired {name}: fence {} expires_at_ms {}", hold.fence, hold.expires_at_ms);
    let busy = client.acquire(&name, Duration::from_secs(5), Duration::ZERO).await;
    println!("second acquire: {busy:?}");
    assert!(matches!(busy, Err(Error::Busy { .. })), "{busy:?}");
    println!("get: {:?}", client.get(&name).await?);
    println!("list: {:?}", client.list("smoke-oneshot-", None, 10).await?);
    let renewed = client.renew(&name, &hold.token, Some(Duration::from_secs(10))).await?;
    println!("renewed: ttl_ms {} expires_at_ms {}", renewed.ttl_ms, renewed.expires_at_ms);
    let wrong = client.renew(&name, "not-a-token", None).await;
    println!("renew with a wrong token: {wrong:?}");
    println!("released: {:?}", client.release(&name, &hold.token).await?);
    let again = client.release(&name, &hold.token).await;
    println!("released again: {again:?}");
    assert!(matches!(again, Err(Error::NotHolder)), "{again:?}");
    assert_eq!(client.get(&name).await?, None);
    let bad = client.acquire("bad/name", Duration::from_secs(5), Duration::ZERO).await;
    println!("bad name: {bad:?}");
    assert!(matches!(bad, Err(Error::InvalidArgument(_))), "{bad:?}");

    // Sessions: a hand-over from one session to the next in the queue.
    let name = format!("smoke-session-{}", std::process::id());
    let lease = Duration::from_secs(2);
    let first = client.session(lease).await?;
    let second = client.session(lease).await?;
    println!("sessions {} and {} (lease {:?})", first.id(), second.id(), first.lease());
    let held = first.lock(&name, Some(Duration::from_secs(1))).await?;
    println!("first holds {name}: fence {}", held.fence());
    println!("second try_lock: {:?}", second.try_lock(&name).await?.map(|h| h.fence()));
    let timeout = second.lock(&name, Some(Duration::from_millis(300))).await;
    println!("second lock with 300 ms wait: {timeout:?}");
    assert!(matches!(timeout, Err(Error::Timeout)), "{timeout:?}");
    let zero = second.lock(&name, Some(Duration::ZERO)).await;
    println!("second lock with zero wait: {zero:?}");
    let waiter = {
        let second = second.clone();
        let name = name.clone();
        tokio::spawn(async move { second.lock(name, Some(Duration::from_secs(10))).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    println!("get while one waits: {:?}", client.get(&name).await?);
    // Held past a few leases: the heartbeats keep it.
    tokio::time::sleep(lease * 2).await;
    assert!(!held.is_lost(), "the lock was lost while heartbeating");
    let first_fence = held.fence();
    let lost = held.lost();
    held.release().await?;
    assert!(lost.is_cancelled());
    let handed = tokio::time::timeout(Duration::from_secs(5), waiter).await???;
    println!("second got it after the release: fence {} (first had {first_fence})", handed.fence());
    assert!(handed.fence() > first_fence);
    // Closing the holder's session hands the lock over at once.
    let third = client.session(lease).await?;
    let third_wait = {
        let third = third.clone();
        let name = name.clone();
        tokio::spawn(async move { third.lock(name, Some(Duration::from_secs(10))).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let handed_lost = handed.lost();
    second.close().await?;
    assert!(handed_lost.is_cancelled());
    let third_held = tokio::time::timeout(Duration::from_secs(5), third_wait).await???;
    println!("third got it after the close: fence {}", third_held.fence());
    drop(third_held);
    tokio::time::sleep(Duration::from_millis(300)).await;
    println!("get after the drop: {:?}", client.get(&name).await?);
    third.close().await?;
    first.close().await?;

    // with_lock.
    let fence = client
        .with_lock(format!("smoke-with-{}", std::process::id()), lease, |held| async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert!(!held.is_lost());
            held.fence()
        })
        .await?;
    println!("with_lock ran with fence {fence}");
    println!("smoke: ok");
    Ok(())
}

/// Removes `flag SECONDS` from `args`.
fn take_seconds(args: &mut Vec<String>, flag: &str) -> Result<Option<Duration>> {
    let Some(i) = args.iter().position(|a| a == flag) else { return Ok(None) };
    let seconds: u64 = args.get(i + 1).ok_or(format!("{flag} needs seconds"))?.parse()?;
    args.drain(i..=i + 1);
    Ok(Some(Duration::from_secs(seconds)))
}

async fn hold_for(client: &Client, duration: Duration, lease: Duration) -> Result<()> {
    let session = client.session(lease).await?;
    let held = session.lock(format!("smoke-hold-{}", std::process::id()), Some(Duration::from_secs(5))).await?;
    println!("session {} holds {} with fence {}", session.id(), held.name(), held.fence());
    let lost = held.lost();
    let start = std::time::Instant::now();
    while start.elapsed() < duration {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = lost.cancelled() => {}
        }
        println!(
            "t={:>4.1}s lost={} preferred={}",
            start.elapsed().as_secs_f64(),
            held.is_lost(),
            client.preferred_endpoint()
        );
        if held.is_lost() {
            return Err("the lock was lost".into());
        }
    }
    held.release().await?;
    session.close().await?;
    println!("held for {duration:?} and released");
    Ok(())
}
