//! [`Notes`]: what a session's stream hears of its session, from the entries applied and its heartbeats'
//! answers.

use futures_util::StreamExt;
use holdfast_core::Grant;

use crate::peer::protocol::NodeError;

/// What a session's stream hears: from applied entries, and from its heartbeats' answers when they could not
/// simply be acknowledged.
#[derive(Debug, Clone)]
pub enum SessionNote {
    /// The session was granted a lock it waited for.
    Granted(Grant),
    /// A hold of the session ended (released, or the session closed or expired).
    Ended { name: String, fence: u64 },
    /// A heartbeat found the session gone (expired or closed).
    Gone,
    /// The leader could not confirm a heartbeat in time.
    HeartbeatFailed(NodeError),
}

/// What a session stream hears of its session, as [`Events::attach`] gives it: one channel for the applied
/// entries and the heartbeats' answers. A stream keeps it for as long as its session is open, so it is
/// futures' channel, about 100 bytes (heap-profiled) where tokio's kept 800 (its cache-padded ends and a
/// first block of 32 slots); the notes are boxed for the same reason.
///
/// [`Events::attach`]: super::events::Events::attach
pub struct Notes {
    pub(super) rx: NoteReceiver,
    /// Closed by the node's registry when another stream attaches the session.
    pub(super) tell: NoteSender,
}

pub(super) type NoteSender = futures_channel::mpsc::UnboundedSender<Box<SessionNote>>;
pub(super) type NoteReceiver = futures_channel::mpsc::UnboundedReceiver<Box<SessionNote>>;

impl Notes {
    /// The next note, polled; `None` once another stream attached the session.
    pub fn poll_recv(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<Box<SessionNote>>> {
        self.rx.poll_next_unpin(cx)
    }

    /// Stops the notes: the node's registry sees the stream gone
    /// ([`Events::detach`](super::events::Events::detach)).
    pub fn close(&mut self) {
        self.rx.close();
    }

    /// Tells the stream `note`, if it is still attached.
    pub fn teller(&self) -> impl Fn(SessionNote) + Send + 'static {
        let tell = self.tell.clone();
        move |note| {
            let _ = tell.unbounded_send(Box::new(note));
        }
    }
}
