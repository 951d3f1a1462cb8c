//! [`Watch`]: a lock's states as the cluster changes it, from the server's `Watch` stream, resumed through
//! another node when the one it talks to goes away.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use holdfast_proto::v1::{WatchEvent, WatchRequest};
use tokio_stream::Stream;
use tonic::Streaming;

use crate::error::Error;
use crate::pool::Pool;
use crate::types::LockInfo;

/// A watch of one lock ([`Client::watch`](crate::Client::watch)). [`next`](Self::next) answers the lock's
/// state when the watch began, then its state after every change, in the order the cluster made them
/// (grant, release, expiry, hand-over, value change, renewal, a waiter joining or leaving), none skipped
/// while the stream lasts.
///
/// When the node it talks to goes away, or the watch falls behind, it resumes through another node from the
/// last revision it answered: if the lock changed meanwhile, the next state is the lock as it is then (the
/// changes in between are not replayed: compare [`LockInfo::revision`]s, which only grow while a lock is
/// remembered); if it did not, nothing is answered twice.
pub struct Watch {
    pool: Arc<Pool>,
    /// The lock watched, or the prefix (`prefix` set).
    name: String,
    prefix: bool,
    /// The revision of the last state answered.
    after: u64,
    /// Whether a state was answered yet.
    answered: bool,
    stream: Option<Streaming<WatchEvent>>,
    /// Streams opened after the first.
    resumes: u64,
}

impl Watch {
    pub(crate) fn new(pool: Arc<Pool>, name: String, after: u64) -> Self {
        Watch { pool, name, prefix: false, after, answered: false, stream: None, resumes: 0 }
    }

    pub(crate) fn of_prefix(pool: Arc<Pool>, prefix: String, after: u64) -> Self {
        Watch { pool, name: prefix, prefix: true, after, answered: false, stream: None, resumes: 0 }
    }

    /// The revision of the last state answered (or the one the watch was started after).
    pub fn revision(&self) -> u64 {
        self.after
    }

    /// How many times the watch resumed through a new stream after its first: the changes between two
    /// states answered on either side of a resume may have been more than one.
    pub fn resumes(&self) -> u64 {
        self.resumes
    }

    /// The lock's next state: `holder` is `None` when nobody holds it. Fails only when no node could be
    /// reached within the client's retry bounds, or with an error another node would not change.
    pub async fn next(&mut self) -> Result<LockInfo, Error> {
        // Streams that ended without answering anything, in a row: bounded, so that a node that ends every
        // watch at once cannot keep this loop going.
        let mut fruitless = 0;
        loop {
            if self.stream.is_none() {
                self.stream = Some(self.connect().await?);
                if self.answered {
                    self.resumes += 1;
                }
            }
            let stream = self.stream.as_mut().expect("connected");
            let ended = match stream.message().await {
                Ok(Some(event)) => {
                    let Some(lock) = event.lock else {
                        return Err(Error::Protocol("a watch event without a lock".into()));
                    };
                    let lock = LockInfo::from(lock);
                    // A lock's watch resumed and found the lock as it was last answered: nothing was missed.
                    // (A prefix's watch begins with the locks changed since, none of them answered before.)
                    if !self.prefix && event.initial && self.answered && lock.revision == self.after {
                        continue;
                    }
                    self.answered = true;
                    self.after = if self.prefix { self.after.max(lock.revision) } else { lock.revision };
                    return Ok(lock);
                }
                Ok(None) => Error::Unavailable("the node ended the watch".into()),
                Err(status) => Error::from(status),
            };
            self.stream = None;
            match ended {
                // The node went away, or the watch fell behind its apply: resume.
                Error::Unavailable(_) if fruitless < self.pool.config.max_attempts => {
                    fruitless += 1;
                    tracing::debug!(name = self.name, error = %ended, "watch interrupted; resuming");
                }
                other => return Err(other),
            }
        }
    }

    /// The watch as a [`Stream`]: each item is [`next`](Self::next)'s answer; the stream ends after the
    /// first error.
    pub fn into_stream(self) -> Pin<Box<dyn Stream<Item = Result<LockInfo, Error>> + Send>> {
        Box::pin(futures_util::stream::unfold(Some(self), |watch| async move {
            let mut watch = watch?;
            let next = watch.next().await;
            let more = next.is_ok().then_some(watch);
            Some((next, more))
        }))
    }

    /// A stream of the lock from `after` on one node after another, as the pool's retry plan allows.
    async fn connect(&self) -> Result<Streaming<WatchEvent>, Error> {
        let request = match self.prefix {
            true => WatchRequest { name: String::new(), after: self.after, prefix: Some(self.name.clone()) },
            false => WatchRequest { name: self.name.clone(), after: self.after, prefix: None },
        };
        let pool = &self.pool;
        pool.call("watch", pool.retry(Duration::ZERO), |_, mut client| {
            let request = request.clone();
            async move { Ok(client.watch(request).await?.into_inner()) }
        })
        .await
    }
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch").field("name", &self.name).field("revision", &self.after).finish()
    }
}
