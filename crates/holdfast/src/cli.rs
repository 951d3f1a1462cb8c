//! `holdfast lock …`, `holdfast elect --observe` and `holdfast cluster status`: one-shot calls and watches,
//! as a readable table or as JSON.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use holdfast_client::{
    AcquireOptions, Client, ClusterStatus, Error as ClientError, Hold, HolderInfo, Leader, LockInfo,
};
use serde_json::{json, Value};
use tokio_stream::StreamExt;

use crate::run::{EXIT_BUSY, EXIT_UNREACHABLE, EXIT_USAGE};

/// What a `lock` subcommand asks for.
pub enum LockCommand {
    Acquire { name: String, ttl: Duration, wait: Duration, options: AcquireOptions },
    SetValue { name: String, token: String, value: Vec<u8> },
    Watch { name: String, prefix: bool, after: u64 },
    Release { name: String, token: String },
    Renew { name: String, token: String, ttl: Option<Duration> },
    Get { name: String },
    List { prefix: String, after: Option<String>, limit: u32 },
}

/// Runs a `lock` subcommand; answers the exit code.
pub async fn lock(client: &Client, command: LockCommand, as_json: bool) -> u8 {
    let result = match command {
        LockCommand::Acquire { name, ttl, wait, options } => {
            client.acquire_with(&name, ttl, wait, options).await.map(|h| hold_out(&h))
        }
        LockCommand::SetValue { name, token, value } => {
            client.set_value(&name, &token, value).await.map(|h| hold_out(&h))
        }
        LockCommand::Watch { name, prefix, after } => return watch(client, &name, prefix, after, as_json).await,
        LockCommand::Renew { name, token, ttl } => client.renew(&name, &token, ttl).await.map(|h| hold_out(&h)),
        LockCommand::Release { name, token } => client.release(&name, &token).await.map(|r| Out {
            json: json!({"name": r.name, "fence": r.fence, "released": true}),
            table: format!("released {} (fence {})", r.name, r.fence),
        }),
        LockCommand::Get { name } => match client.get(&name).await {
            Ok(Some(lock)) => Ok(locks_out(std::slice::from_ref(&lock), None)),
            Ok(None) => Err(ClientError::NotFound),
            Err(e) => Err(e),
        },
        LockCommand::List { prefix, after, limit } => {
            client.list(&prefix, after.as_deref(), limit).await.map(|page| locks_out(&page.locks, page.next.as_deref()))
        }
    };
    finish(result, as_json)
}

/// Prints lock `name` (or with `prefix`, every lock under it) now and after each change (one line each)
/// until the watch fails; answers the exit code then.
async fn watch(client: &Client, name: &str, prefix: bool, after: u64, as_json: bool) -> u8 {
    let mut watch = match prefix {
        true => client.watch_prefix_after(name, after),
        false => client.watch_after(name, after),
    };
    loop {
        let lock = match watch.next().await {
            Ok(lock) => lock,
            Err(e) => return finish(Err(e), as_json),
        };
        let line = match (&lock.holder, as_json) {
            (_, true) => lock_json(&lock).to_string(),
            (Some(HolderInfo { free_at_ms: Some(free_at_ms), owner, fence, .. }), false) => format!(
                "revision {} {} free at {} (lock-delay: the hold of {owner} fence {fence} expired) waiters {}",
                lock.revision,
                lock.name,
                when(*free_at_ms),
                lock.waiters.len()
            ),
            (Some(h), false) => format!(
                "revision {} {} held by {} fence {} value {:?} waiters {}",
                lock.revision,
                lock.name,
                h.owner,
                h.fence,
                String::from_utf8_lossy(&h.value),
                lock.waiters.len()
            ),
            (None, false) => format!("revision {} {} free", lock.revision, lock.name),
        };
        println!("{line}");
    }
}

/// Prints the leader of election `name` now and each new one (one line each) until the watch fails;
/// answers the exit code then.
pub async fn observe(client: &Client, name: &str, as_json: bool) -> u8 {
    let mut leaders = client.observe(name);
    while let Some(leader) = leaders.next().await {
        let leader: Option<Leader> = match leader {
            Ok(leader) => leader,
            Err(e) => return finish(Err(e), as_json),
        };
        let line = match (&leader, as_json) {
            (Some(l), true) => {
                json!({"fence": l.fence, "owner": l.owner, "value": String::from_utf8_lossy(&l.value)}).to_string()
            }
            (None, true) => json!(null).to_string(),
            (Some(l), false) => format!("{} {} {}", l.fence, l.owner, String::from_utf8_lossy(&l.value)),
            (None, false) => "none".to_owned(),
        };
        println!("{line}");
    }
    0
}

/// Runs `cluster status`; answers the exit code.
pub async fn cluster_status(client: &Client, as_json: bool) -> u8 {
    finish(client.cluster_status().await.map(|s| status_out(&s)), as_json)
}

/// A membership change: `cluster add` or `cluster remove`.
pub enum MemberCommand {
    Add { id: u64, peer_addr: String },
    Remove { id: u64 },
}

/// Runs `cluster add|remove`; prints the cluster afterwards and answers the exit code.
pub async fn cluster_member(client: &Client, command: MemberCommand, admin_key: Option<&str>, as_json: bool) -> u8 {
    let result = match command {
        MemberCommand::Add { id, peer_addr } => client.add_member(id, &peer_addr, admin_key).await,
        MemberCommand::Remove { id } => client.remove_member(id, admin_key).await,
    };
    finish(result.map(|s| status_out(&s)), as_json)
}

/// Runs `cluster snapshot`; prints what the node stored and answers the exit code.
pub async fn cluster_snapshot(client: &Client, admin_key: Option<&str>, as_json: bool) -> u8 {
    let result = client.snapshot(admin_key).await.map(|s| Out {
        json: json!({"id": s.id, "endpoint": s.endpoint, "snapshot_index": s.index, "snapshot_bytes": s.bytes}),
        table: format!("node {} at {}: snapshot up to index {}, {} bytes", s.id, s.endpoint, s.index, s.bytes),
    });
    finish(result, as_json)
}

/// What a command prints: a table for people, JSON for scripts.
struct Out {
    json: Value,
    table: String,
}

fn finish(result: Result<Out, ClientError>, as_json: bool) -> u8 {
    match result {
        Ok(out) if as_json => {
            println!("{}", out.json);
            0
        }
        Ok(out) => {
            println!("{}", out.table.trim_end());
            0
        }
        Err(e) => {
            eprintln!("holdfast: {e}");
            match e {
                ClientError::Busy { .. } => EXIT_BUSY,
                e if e.is_transient() => EXIT_UNREACHABLE,
                ClientError::NotFound
                | ClientError::NotHolder
                | ClientError::Expired
                | ClientError::Refused(_)
                | ClientError::Unauthenticated(_) => 1,
                _ => EXIT_USAGE,
            }
        }
    }
}

fn hold_out(h: &Hold) -> Out {
    Out {
        json: json!({
            "name": h.name, "owner": h.owner, "token": h.token, "fence": h.fence,
            "granted_at_ms": h.granted_at_ms, "expires_at_ms": h.expires_at_ms, "ttl_ms": h.ttl_ms,
            "value": String::from_utf8_lossy(&h.value),
        }),
        table: table(
            &["NAME", "OWNER", "FENCE", "EXPIRES", "TOKEN"],
            &[vec![h.name.clone(), h.owner.clone(), h.fence.to_string(), when(h.expires_at_ms), h.token.clone()]],
        ),
    }
}

fn holder_json(h: &HolderInfo) -> Value {
    json!({
        "owner": h.owner, "fence": h.fence, "granted_at_ms": h.granted_at_ms,
        "expires_at_ms": h.expires_at_ms, "ttl_ms": h.ttl_ms, "session_id": h.session_id,
        "value": String::from_utf8_lossy(&h.value), "free_at_ms": h.free_at_ms,
    })
}

fn lock_json(l: &LockInfo) -> Value {
    let waiters: Vec<Value> = l
        .waiters
        .iter()
        .map(|w| json!({"owner": w.owner, "queued_at_ms": w.queued_at_ms, "session_id": w.session_id}))
        .collect();
    let holders: Vec<Value> = l.holders.iter().map(holder_json).collect();
    json!({
        "name": l.name,
        "holder": l.holder.as_ref().map(holder_json),
        "holders": holders,
        "limit": l.limit,
        "waiters": waiters,
        "revision": l.revision,
    })
}

/// One table row per holder (a semaphore has several), or one of dashes for a lock nobody holds.
fn locks_out(locks: &[LockInfo], next: Option<&str>) -> Out {
    let row = |l: &LockInfo, holder: Option<&HolderInfo>| {
        let (owner, fence, expires) = match holder {
            Some(h @ HolderInfo { free_at_ms: Some(free_at_ms), .. }) => {
                (h.owner.clone(), h.fence.to_string(), format!("lock-delay until {}", when(*free_at_ms)))
            }
            Some(h) => (
                h.owner.clone(),
                h.fence.to_string(),
                h.expires_at_ms.map(when).unwrap_or_else(|| format!("session {}", h.session_id.unwrap_or(0))),
            ),
            None => ("-".into(), "-".into(), "-".into()),
        };
        vec![l.name.clone(), owner, fence, expires, l.waiters.len().to_string()]
    };
    let rows: Vec<Vec<String>> = locks
        .iter()
        .flat_map(|l| match l.holders.is_empty() {
            true => vec![row(l, l.holder.as_ref())],
            false => l.holders.iter().map(|h| row(l, Some(h))).collect(),
        })
        .collect();
    let json_locks: Vec<Value> = locks.iter().map(lock_json).collect();
    let mut text = table(&["NAME", "OWNER", "FENCE", "EXPIRES", "WAITERS"], &rows);
    if let Some(next) = next {
        text.push_str(&format!("(more: --after {next})\n"));
    }
    Out { json: json!({"locks": json_locks, "next": next}), table: text }
}

fn status_out(s: &ClusterStatus) -> Out {
    let members: Vec<Vec<String>> = s
        .members
        .iter()
        .map(|(id, addr)| {
            let role = match (Some(*id) == s.leader, s.voters.contains(id)) {
                (true, _) => "leader",
                (false, true) => "voter",
                (false, false) => "learner",
            };
            vec![
                id.to_string(),
                addr.clone(),
                role.into(),
                if *id == s.id { "(answered)".into() } else { String::new() },
            ]
        })
        .collect();
    let mut text = format!(
        "node {} at {}: {}, term {}, leader {}, log {}, applied {}\n\n",
        s.id,
        s.endpoint,
        s.state,
        s.term,
        s.leader.map_or("unknown".into(), |l| l.to_string()),
        s.last_log_index,
        s.applied_index
    );
    text.push_str(&table(&["ID", "PEER ADDRESS", "ROLE", ""], &members));
    Out {
        json: json!({
            "endpoint": s.endpoint, "id": s.id, "leader": s.leader, "term": s.term, "state": s.state,
            "members": s.members, "voters": s.voters, "last_log_index": s.last_log_index,
            "applied_index": s.applied_index,
        }),
        table: text,
    }
}

/// `2026-11-30T15:20:06.715Z (in 41s)`.
fn when(ms: u64) -> String {
    let at = UNIX_EPOCH + Duration::from_millis(ms);
    let stamp = humantime::format_rfc3339_millis(at);
    match at.duration_since(SystemTime::now()) {
        Ok(left) => format!("{stamp} (in {}s)", left.as_secs()),
        Err(_) => format!("{stamp} (passed)"),
    }
}

/// Left-aligned columns separated by two spaces.
fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        padded.join("  ").trim_end().to_owned() + "\n"
    };
    let mut out = line(headers.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// `holdfast healthcheck`: GETs `url` (plain `http://HOST:PORT/PATH`) and succeeds on a 200. A plain
/// HTTP/1.0 request on a standard socket, so a container image needs nothing but this binary.
pub fn healthcheck(url: &str, timeout: Duration) -> anyhow::Result<()> {
    use std::io::{Read, Write};
    use std::net::ToSocketAddrs;

    let rest = url.strip_prefix("http://").ok_or_else(|| anyhow::anyhow!("{url:?}: only http:// URLs are probed"))?;
    let (authority, path) = match rest.find('/') {
        Some(at) => rest.split_at(at),
        None => (rest, "/"),
    };
    let addr = authority
        .to_socket_addrs()
        .map_err(|e| anyhow::anyhow!("{authority:?}: {e}"))?
        .next()
        .ok_or_else(|| anyhow::anyhow!("{authority:?} resolves to no address"))?;
    let mut stream = std::net::TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {authority}\r\nConnection: close\r\n\r\n")?;
    let mut answer = Vec::new();
    stream.take(64 * 1024).read_to_end(&mut answer)?;
    let answer = String::from_utf8_lossy(&answer);
    let status_line = answer.lines().next().unwrap_or_default();
    match status_line.split_whitespace().nth(1) {
        Some("200") => Ok(()),
        _ => {
            let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default().trim();
            anyhow::bail!("{url}: {status_line} {body}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns() {
        let t = table(&["A", "LONG"], &[vec!["xyz".into(), "1".into()], vec!["q".into(), "22".into()]]);
        assert_eq!(t, "A    LONG\nxyz  1\nq    22\n");
    }
}
