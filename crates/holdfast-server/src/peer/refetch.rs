//! A node whose stored snapshot is damaged fetches a peer's current snapshot in its place, before it
//! starts: piece by piece ([`Call::FetchSnapshot`]), from each member in turn, until one serves one that
//! covers at least the log the damaged one did; then holdfast-store's `replace_snapshot` checks and stores
//! it (and says why that is safe). Until then the node takes part in nothing: it has no Raft to vote or
//! answer with.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use holdfast_store::{NodeId, Replaced, SnapshotPiece, StoreError};
use openraft::{BasicNode, SnapshotMeta};

use super::client::Peers;
use super::codec::Call;
use super::protocol::{NodeError, SnapshotFetch};

/// How long one piece may take to arrive.
const PIECE_TIMEOUT: Duration = Duration::from_secs(10);
/// The pause after the first round in which no member's snapshot was stored; it doubles after each such
/// round, up to [`PAUSE_MAX`].
const PAUSE_MIN: Duration = Duration::from_millis(250);
/// The longest pause between rounds: a member whose snapshot cannot be stored here is not fetched from
/// more often.
const PAUSE_MAX: Duration = Duration::from_secs(10);
/// How many times a fetch from one member starts over because that member's snapshot changed meanwhile
/// (it builds one about every `--snapshot-every` entries) before the next member is asked.
const RESTARTS_MAX: u32 = 3;

/// A damaged snapshot, and the members to ask for one in its place.
pub struct Damaged {
    pub meta: SnapshotMeta<NodeId, BasicNode>,
    /// The members the damaged snapshot knew and those the node was started with, but the node itself.
    pub members: BTreeMap<NodeId, String>,
}

/// The snapshot recorded in `data_dir` and whom to ask for another, if `error` (the store's refusal to
/// open) says its bytes are damaged or its file is missing and the node (`own`, started with `members`)
/// has a member to ask. `None` for any other refusal.
pub fn damaged_snapshot(
    error: &anyhow::Error,
    data_dir: &Path,
    own: NodeId,
    members: &BTreeMap<NodeId, String>,
) -> Option<Damaged> {
    let snapshot = store_error(error).is_some_and(|e| match e {
        StoreError::SnapshotCorrupt(_) => true,
        StoreError::SnapshotFile(e) => e.kind() == std::io::ErrorKind::NotFound,
        _ => false,
    });
    let meta = snapshot.then(|| holdfast_store::recorded_snapshot(data_dir).ok().flatten()).flatten()?;
    let members = members_besides(own, members, Some(&meta));
    (!members.is_empty()).then_some(Damaged { meta, members })
}

/// Whether `error` (the store's refusal to open) says the Raft log is damaged, and the node (`own`, started
/// with `members`, its data in `data_dir`) has a member whose leader can fill its log again once it is cut
/// at the damage (holdfast-store's `cut_damaged_log`).
pub fn damaged_log(error: &anyhow::Error, data_dir: &Path, own: NodeId, members: &BTreeMap<NodeId, String>) -> bool {
    if !store_error(error).is_some_and(|e| matches!(e, StoreError::LogCorrupt(_))) {
        return false;
    }
    let recorded = holdfast_store::recorded_snapshot(data_dir).ok().flatten();
    !members_besides(own, members, recorded.as_ref()).is_empty()
}

/// The store's error in `error`'s chain, if any.
fn store_error(error: &anyhow::Error) -> Option<&StoreError> {
    error.chain().find_map(|cause| cause.downcast_ref::<StoreError>())
}

/// The members `snapshot`'s membership knew and those the node was started with (`members`), but the node
/// itself (`own`).
fn members_besides(
    own: NodeId,
    members: &BTreeMap<NodeId, String>,
    snapshot: Option<&SnapshotMeta<NodeId, BasicNode>>,
) -> BTreeMap<NodeId, String> {
    let known = snapshot.into_iter().flat_map(|meta| meta.last_membership.membership().nodes());
    let mut all: BTreeMap<NodeId, String> = known.map(|(id, node)| (*id, node.addr.clone())).collect();
    all.extend(members.iter().map(|(id, addr)| (*id, addr.clone())));
    all.remove(&own);
    all
}

/// Replaces the damaged snapshot in `data_dir` with a member's that covers at least as much of the log:
/// asks every member in turn, round after round (pausing longer after each round that stored none, up to
/// [`PAUSE_MAX`]), until one is fetched whole and stored. Runs until then; the caller bounds it (by the
/// node's shutdown).
pub async fn refetch(data_dir: &Path, damaged: &Damaged, peers: &Peers) -> (NodeId, Replaced) {
    let through = damaged.meta.last_log_id.map_or(0, |id| id.index);
    let mut pause = PAUSE_MIN;
    loop {
        for (&id, addr) in &damaged.members {
            let fetched = match fetch_from(peers, id, addr, through).await {
                Ok(piece) => piece,
                Err(why) => {
                    tracing::info!(peer = id, %why, "no snapshot from this member yet");
                    continue;
                }
            };
            let SnapshotPiece { meta, len, crc, bytes, .. } = fetched;
            match holdfast_store::replace_snapshot(data_dir, &meta, bytes, len, crc).await {
                Ok(replaced) => return (id, replaced),
                Err(e) => tracing::warn!(peer = id, error = %e, "a member's snapshot did not replace the damaged one"),
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(PAUSE_MAX);
    }
}

/// The whole of member `id`'s current snapshot, if it covers the log through `through`: its pieces, in
/// order, of one snapshot (started over if the member's changes meanwhile).
async fn fetch_from(peers: &Peers, id: NodeId, addr: &str, through: u64) -> Result<SnapshotPiece, String> {
    let mut restarts = 0;
    let mut whole: Option<SnapshotPiece> = None;
    loop {
        let offset = whole.as_ref().map_or(0, |whole| whole.bytes.len() as u64);
        let asked = SnapshotFetch { through, offset };
        let answer: Result<SnapshotPiece, NodeError> =
            peers.call(id, addr, Call::FetchSnapshot, &asked, PIECE_TIMEOUT).await.map_err(|e| e.to_string())?;
        let piece = answer.map_err(|e| e.to_string())?;
        match &mut whole {
            Some(whole) if whole.meta.snapshot_id == piece.meta.snapshot_id && piece.offset == offset => {
                if piece.bytes.is_empty() {
                    return Err(format!("an empty piece at byte {offset} of {}", whole.len));
                }
                whole.bytes.extend_from_slice(&piece.bytes);
            }
            Some(_) if restarts < RESTARTS_MAX => {
                // Its snapshot changed under the fetch: start over with the new one.
                restarts += 1;
                whole = None;
                continue;
            }
            Some(_) => return Err(format!("its snapshot changed {RESTARTS_MAX} times during the fetch")),
            None if piece.offset == 0 => whole = Some(piece),
            None => return Err(format!("a piece at byte {} where 0 was asked", piece.offset)),
        }
        let whole = whole.as_ref().expect("set above");
        if whole.bytes.len() as u64 >= whole.len {
            break;
        }
    }
    Ok(whole.expect("the loop ends with a whole snapshot"))
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tokio::net::TcpListener;

    use super::super::codec::{self, Received};
    use super::*;

    /// Bytes in each piece the fake member serves: a snapshot of a few dozen bytes comes in several.
    const PIECE: usize = 10;

    /// A snapshot named `id` whose bytes are `len` bytes of `fill`.
    fn snapshot(id: &str, len: usize, fill: u8) -> (SnapshotMeta<NodeId, BasicNode>, Vec<u8>) {
        let meta = SnapshotMeta { snapshot_id: id.to_owned(), ..Default::default() };
        (meta, vec![fill; len])
    }

    /// A member on the peer port that serves, for each `FetchSnapshot`, the piece at the offset asked of
    /// `snapshots[n]` once it has answered `n` requests (the last one from then on), [`PIECE`] bytes at most.
    /// Returns its address and the offsets it was asked for, in order.
    async fn member(snapshots: Vec<(SnapshotMeta<NodeId, BasicNode>, Vec<u8>)>) -> (String, Arc<Mutex<Vec<u64>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let asked = Arc::new(Mutex::new(Vec::new()));
        let seen = asked.clone();
        tokio::spawn(async move {
            loop {
                let (conn, _) = listener.accept().await.unwrap();
                let (seen, snapshots) = (seen.clone(), snapshots.clone());
                tokio::spawn(async move {
                    let mut io = tokio::io::BufReader::new(conn);
                    codec::hello(&mut io).await.unwrap();
                    let mut buf = Vec::new();
                    while let Some(Received::FetchSnapshot(fetch)) =
                        codec::read_request(&mut io, &mut buf).await.unwrap()
                    {
                        let answered = {
                            let mut seen = seen.lock().unwrap();
                            seen.push(fetch.offset);
                            seen.len() - 1
                        };
                        let (meta, bytes) = &snapshots[answered.min(snapshots.len() - 1)];
                        let start = (fetch.offset as usize).min(bytes.len());
                        let end = (start + PIECE).min(bytes.len());
                        let piece: Result<SnapshotPiece, NodeError> = Ok(SnapshotPiece {
                            meta: meta.clone(),
                            len: bytes.len() as u64,
                            crc: u32::from(bytes[0]),
                            offset: fetch.offset,
                            bytes: bytes[start..end].to_vec(),
                        });
                        let mut answer = vec![0; 4];
                        codec::encode_into(&mut answer, &piece);
                        codec::write_frame(&mut io, &mut answer).await.unwrap();
                    }
                });
            }
        });
        (addr, asked)
    }

    #[tokio::test]
    async fn a_snapshot_comes_whole_in_pieces_and_starts_over_when_the_member_replaces_it_meanwhile() {
        let (first, second) = (snapshot("first", 25, 1), snapshot("second", 37, 2));
        // The member builds a new snapshot after serving the first two pieces of the one it had.
        let (addr, asked) = member(vec![first.clone(), first, second.clone()]).await;
        let whole = fetch_from(&Peers::new(None, None), 2, &addr, 0).await.unwrap();
        assert_eq!(whole.meta.snapshot_id, "second");
        assert_eq!((whole.len, whole.bytes), (37, second.1.clone()), "every piece of the new one, in order");
        assert_eq!(whole.crc, 2, "the length and checksum of the new one (checked when stored)");
        assert_eq!(*asked.lock().unwrap(), [0, 10, 20, 0, 10, 20, 30], "started over at the change");
    }

    #[tokio::test]
    async fn a_member_whose_snapshot_keeps_changing_is_left_for_the_next() {
        // A new snapshot at every piece: the fetch starts over three times, then gives up on this member.
        let snapshots = (0..10).map(|n| snapshot(&format!("s{n}"), 25, n)).collect();
        let (addr, asked) = member(snapshots).await;
        let failed = fetch_from(&Peers::new(None, None), 2, &addr, 0).await.unwrap_err();
        assert!(failed.contains("changed 3 times"), "{failed}");
        assert_eq!(*asked.lock().unwrap(), [0, 10, 0, 10, 0, 10, 0, 10]);
    }
}
