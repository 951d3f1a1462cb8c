//! Leader election on sessions, values and watches, in the shape of etcd's `concurrency.Election` and
//! Curator's `LeaderLatch`: [`Client::campaign`](crate::Client::campaign) waits its turn in the lock's FIFO
//! queue and answers a [`Leadership`]; [`Client::leader`](crate::Client::leader) and
//! [`Client::observe`](crate::Client::observe) tell everyone else who leads. No mechanism of its own: the
//! leader is the session that holds the election's lock, its value is the lock's value, and its fence is the
//! grant's, which only grows from one leader to the next.

use std::pin::Pin;

use tokio_stream::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;

use crate::error::Error;
use crate::session::{HeldLock, Session};
use crate::types::{HolderInfo, LockInfo};
use crate::watch::Watch;

/// Who leads an election: the holder of its lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// What the leader published (its address, say).
    pub value: Vec<u8>,
    /// The fence of its leadership: it grows from one leader to the next. Pass it to whatever the leader
    /// writes, so that a deposed leader's late writes are turned away.
    pub fence: u64,
    /// The leader's owner description.
    pub owner: String,
}

impl Leader {
    pub(crate) fn of(holder: HolderInfo) -> Self {
        Leader { value: holder.value, fence: holder.fence, owner: holder.owner }
    }
}

/// This process leads an election, for as long as its session keeps the lease. Watch [`lost`](Self::lost):
/// once it fires, someone else may lead.
pub struct Leadership {
    session: Session,
    held: HeldLock,
}

impl Leadership {
    pub(crate) fn new(session: Session, held: HeldLock) -> Self {
        Leadership { session, held }
    }

    /// The fence of this leadership.
    pub fn fence(&self) -> u64 {
        self.held.fence()
    }

    /// The value this leader publishes.
    pub fn value(&self) -> &[u8] {
        self.held.value()
    }

    /// Cancelled the moment leadership is no longer confirmed (see [`HeldLock::lost`]).
    pub fn lost(&self) -> CancellationToken {
        self.held.lost()
    }

    /// Until when leadership is confirmed by this client's clock (see [`HeldLock::confirmed_until`]).
    pub fn confirmed_until(&self) -> tokio::time::Instant {
        self.held.confirmed_until()
    }

    /// Whether leadership is no longer confirmed right now.
    pub fn is_lost(&self) -> bool {
        self.held.is_lost()
    }

    /// Publishes `value` in place of this leader's value; observers see it. The fence stays.
    pub async fn proclaim(&mut self, value: impl Into<Vec<u8>>) -> Result<(), Error> {
        self.held.set_value(value).await
    }

    /// Steps down: the session closes, and the next candidate in line leads at once.
    pub async fn resign(self) -> Result<(), Error> {
        let Leadership { session, held } = self;
        drop(held);
        session.close().await
    }
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership").field("fence", &self.fence()).field("lost", &self.is_lost()).finish()
    }
}

/// The leaders of an election as a watch sees them: each time the leader or its value changes, the new one
/// (`None`: nobody leads). Changes that do not touch the leader (candidates joining the queue) are left out.
pub(crate) fn leaders(watch: Watch) -> Pin<Box<dyn Stream<Item = Result<Option<Leader>, Error>> + Send>> {
    let mut last: Option<Option<Leader>> = None;
    Box::pin(watch.into_stream().filter_map(move |state: Result<LockInfo, Error>| {
        let leader = match state {
            // A lock in its lock-delay has no leader: its last one's lease ran out.
            Ok(lock) => lock.holder.filter(HolderInfo::is_live).map(Leader::of),
            Err(e) => return Some(Err(e)),
        };
        if last.as_ref() == Some(&leader) {
            return None;
        }
        last = Some(leader.clone());
        Some(Ok(leader))
    }))
}
