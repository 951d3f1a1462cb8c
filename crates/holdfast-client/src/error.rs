//! The client's errors, and the one place that maps the server's gRPC statuses and session errors to them.

use tonic::{Code, Status};

use crate::types::HolderInfo;

/// The gRPC metadata entry in which the server puts an error's problem type.
pub const PROBLEM_METADATA: &str = "holdfast-problem";

/// The prefix of every problem type (`urn:holdfast:<slug>`), shared with the HTTP API.
const PROBLEM_PREFIX: &str = "urn:holdfast:";

/// Everything a holdfast call can fail with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock is held by someone else (a one-shot acquire whose wait, if any, ran out). The holder is
    /// known when the server said who it is.
    #[error("{}", busy_text(.holder))]
    Busy {
        /// Who holds it, when the answer said (boxed: it is most of the error's size).
        holder: Option<Box<HolderInfo>>,
    },
    /// The token does not hold the lock: it is wrong, or its hold already ended.
    #[error("the token does not hold the lock (wrong, or its hold already ended)")]
    NotHolder,
    /// The hold ran out before the renew arrived; acquire the lock again.
    #[error("the hold expired before the renew arrived")]
    Expired,
    /// Nobody holds the lock (or the named thing does not exist).
    #[error("not found")]
    NotFound,
    /// The request was refused as malformed (name, owner, TTL, lease, wait or token); nothing changed.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A server limit was reached (queue full, too many locks, sessions or claims); nothing changed.
    #[error("limit reached: {0}")]
    LimitReached(String),
    /// The node, or the leader, refused new load (a session, a one-shot acquire) while it served the
    /// sessions it has late, or (a new session) while its workers had no room to spare; nothing changed.
    /// Unlike a limit, it passes: try again after a pause, or through another node.
    #[error("overloaded: {0}")]
    Overloaded(String),
    /// No endpoint answered within the retry bounds, or the cluster had no leader in time. For a write the
    /// outcome is unknown: it may or may not have happened.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// A session lock was not granted within the wait the caller gave.
    #[error("timed out waiting for the lock")]
    Timeout,
    /// The session is over (its lease ran out by the client's clock, the server expired or closed it, or it
    /// could not be resumed), so it holds nothing any more.
    #[error("the session is lost: it holds nothing any more")]
    SessionLost,
    /// The server answered something this client does not understand, or failed internally.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// A change the cluster cannot make as it is (a membership change: the id or address is taken, the
    /// node is not a member, it is the last voter, another change is in progress); nothing changed.
    #[error("refused: {0}")]
    Refused(String),
    /// A watch of a prefix resumed after a revision older than what the cluster remembers of freed locks:
    /// list the prefix again and watch after the list's revision.
    #[error("the watch cannot resume after that revision: {0}")]
    Compacted(String),
    /// An admin call without the server's admin key, or with a wrong one.
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// The lock is held or waited for under another limit (a semaphore's, or 1 for a lock) than the
    /// acquire gave; nothing changed. Every acquirer of a name gives the same limit.
    #[error("limit mismatch: {0}")]
    LimitMismatch(String),
}

fn busy_text(holder: &Option<Box<HolderInfo>>) -> String {
    match holder.as_deref() {
        Some(h @ HolderInfo { free_at_ms: Some(free_at_ms), .. }) => format!(
            "the lock is in its lock-delay until {free_at_ms} ms (leader time): the hold of {:?} (fence {}) expired",
            h.owner, h.fence
        ),
        Some(h) => format!("the lock is held by {:?} (fence {})", h.owner, h.fence),
        None => "the lock is held".to_owned(),
    }
}

impl Error {
    /// Maps an answer from the server to an error: the gRPC `code` of a failed call (`None` for an error
    /// event inside a session stream, which has only a problem type), the `urn:holdfast:<slug>` problem type
    /// if there is one, and the human-readable detail.
    ///
    /// This is the only place that interprets codes and problem types. The problem type is the more
    /// specific of the two and wins where it is known; the code decides otherwise, so an older or newer
    /// server with slugs this client does not know still maps sensibly.
    pub(crate) fn from_problem(code: Option<Code>, problem: Option<&str>, detail: &str) -> Error {
        let slug = problem.map(|p| p.strip_prefix(PROBLEM_PREFIX).unwrap_or(p));
        match slug {
            Some("busy") => return Error::Busy { holder: None },
            Some("not-holder") => return Error::NotHolder,
            Some("expired") => return Error::Expired,
            Some("not-found") => return Error::NotFound,
            Some("session-gone") => return Error::SessionLost,
            Some("unavailable") => return Error::Unavailable(detail.to_owned()),
            Some("queue-full" | "too-many-locks" | "too-many-sessions" | "too-many-claims") => {
                return Error::LimitReached(detail.to_owned())
            }
            Some(s) if s.starts_with("invalid-") || s == "session-hold" => {
                return Error::InvalidArgument(detail.to_owned())
            }
            Some("unauthenticated") => return Error::Unauthenticated(detail.to_owned()),
            Some("compacted") => return Error::Compacted(detail.to_owned()),
            Some("limit-mismatch") => return Error::LimitMismatch(detail.to_owned()),
            Some("too-many-changes") => return Error::LimitReached(detail.to_owned()),
            Some("overloaded") => return Error::Overloaded(detail.to_owned()),
            // A watch stream that fell behind its node ended: nothing is wrong but the pace; resume.
            Some("watch-behind") => return Error::Unavailable(detail.to_owned()),
            Some(
                "member-exists" | "address-in-use" | "not-caught-up" | "not-a-member" | "last-member"
                | "membership-change",
            ) => return Error::Refused(detail.to_owned()),
            _ => {}
        }
        match code {
            Some(Code::InvalidArgument) => Error::InvalidArgument(detail.to_owned()),
            Some(Code::AlreadyExists) => Error::Busy { holder: None },
            Some(Code::FailedPrecondition) => Error::NotHolder,
            Some(Code::NotFound) => Error::NotFound,
            Some(Code::ResourceExhausted) => Error::LimitReached(detail.to_owned()),
            Some(Code::Unauthenticated) => Error::Unauthenticated(detail.to_owned()),
            Some(Code::Unavailable | Code::DeadlineExceeded) => Error::Unavailable(detail.to_owned()),
            Some(code) => Error::Protocol(format!("{code:?}: {detail}")),
            None => Error::Protocol(format!("{}: {detail}", problem.unwrap_or("unknown problem"))),
        }
    }

    /// Whether the cluster could not serve the call at the time, rather than answer it: no endpoint or no
    /// leader answered within the retry bounds ([`Error::Unavailable`]), or a node refused new load
    /// ([`Error::Overloaded`]). The same call, unchanged, may succeed after a pause or through another node.
    /// After `Unavailable` a write's outcome is unknown: send it again only if doing it twice is harmless
    /// (a release, a renew), or check first. Every other error is an answer about the request or the lock
    /// (busy, not the holder, a limit, bad input) that sending it again would not change.
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Unavailable(_) | Error::Overloaded(_))
    }

    /// Whether a call that failed with this error may be sent again to another endpoint: the node did not
    /// answer, or answered that no leader could serve the request.
    pub(crate) fn is_retryable(&self) -> bool {
        matches!(self, Error::Unavailable(_))
    }
}

impl From<Status> for Error {
    fn from(status: Status) -> Self {
        let problem = status.metadata().get(PROBLEM_METADATA).and_then(|v| v.to_str().ok());
        // A status made on this side from a transport failure (connection refused or reset, a stream torn
        // down by a dying node) says nothing about the request: the node may not even have seen it. Those
        // come with the transport error as their source; a status the server sent has none.
        let transport = std::error::Error::source(&status).is_some();
        if problem.is_none() && transport && matches!(status.code(), Code::Unknown | Code::Internal | Code::Cancelled) {
            return Error::Unavailable(describe(&status));
        }
        if problem.is_none() && status.code() == Code::Unavailable {
            return Error::Unavailable(describe(&status));
        }
        match Error::from_problem(Some(status.code()), problem, status.message()) {
            // A busy answer names the holder in binary metadata (a `Holder` message), when the server knows it.
            Error::Busy { holder: None } => {
                let holder = status
                    .metadata()
                    .get_bin(HOLDER_METADATA)
                    .and_then(|v| v.to_bytes().ok())
                    .and_then(|bytes| <holdfast_proto::v1::Holder as prost::Message>::decode(bytes).ok())
                    .map(|holder| Box::new(HolderInfo::from(holder)));
                Error::Busy { holder }
            }
            other => other,
        }
    }
}

/// The gRPC binary metadata entry in which the server names the holder of a busy lock.
pub const HOLDER_METADATA: &str = "holdfast-holder-bin";

/// A status's message with its source chain, which is where a transport error says what went wrong.
fn describe(status: &Status) -> String {
    let mut text = status.message().to_owned();
    let mut source = std::error::Error::source(status);
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text.push_str(": ");
            text.push_str(&s_text);
        }
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::metadata::MetadataMap;

    fn status(code: Code, problem: Option<&str>, message: &str) -> Status {
        let mut metadata = MetadataMap::new();
        if let Some(p) = problem {
            metadata.insert(PROBLEM_METADATA, p.parse().unwrap());
        }
        Status::with_metadata(code, message, metadata)
    }

    #[test]
    fn statuses_with_problem_types_map_to_their_variant() {
        let cases = [
            (Code::InvalidArgument, "urn:holdfast:invalid-name", Error::InvalidArgument("bad".into())),
            (Code::InvalidArgument, "urn:holdfast:invalid-ttl", Error::InvalidArgument("bad".into())),
            (Code::InvalidArgument, "urn:holdfast:session-hold", Error::InvalidArgument("bad".into())),
            (Code::AlreadyExists, "urn:holdfast:busy", Error::Busy { holder: None }),
            (Code::FailedPrecondition, "urn:holdfast:not-holder", Error::NotHolder),
            (Code::FailedPrecondition, "urn:holdfast:expired", Error::Expired),
            (Code::NotFound, "urn:holdfast:not-found", Error::NotFound),
            (Code::NotFound, "urn:holdfast:session-gone", Error::SessionLost),
            (Code::ResourceExhausted, "urn:holdfast:queue-full", Error::LimitReached("bad".into())),
            (Code::ResourceExhausted, "urn:holdfast:too-many-claims", Error::LimitReached("bad".into())),
            (Code::ResourceExhausted, "urn:holdfast:overloaded", Error::Overloaded("bad".into())),
            (Code::Unavailable, "urn:holdfast:unavailable", Error::Unavailable("bad".into())),
            (Code::Internal, "urn:holdfast:internal", Error::Protocol("Internal: bad".into())),
        ];
        for (code, problem, want) in cases {
            assert_eq!(Error::from(status(code, Some(problem), "bad")), want, "{problem}");
        }
    }

    #[test]
    fn only_unavailable_and_overloaded_are_transient() {
        let transient = |code, problem| Error::from(status(code, Some(problem), "x")).is_transient();
        assert!(transient(Code::Unavailable, "urn:holdfast:unavailable"));
        assert!(transient(Code::ResourceExhausted, "urn:holdfast:overloaded"));
        // A watch that fell behind resumes: the node's pace, not the request.
        assert!(transient(Code::Unavailable, "urn:holdfast:watch-behind"));
        // A transport failure made on this side (no problem type) is unavailable too.
        assert!(Error::from(Status::unavailable("connection refused")).is_transient());
        for (code, problem) in [
            (Code::ResourceExhausted, "urn:holdfast:queue-full"),
            (Code::ResourceExhausted, "urn:holdfast:too-many-locks"),
            (Code::AlreadyExists, "urn:holdfast:busy"),
            (Code::FailedPrecondition, "urn:holdfast:not-holder"),
            (Code::InvalidArgument, "urn:holdfast:invalid-name"),
            (Code::NotFound, "urn:holdfast:session-gone"),
            (Code::Internal, "urn:holdfast:internal"),
        ] {
            assert!(!transient(code, problem), "{problem}");
        }
        assert!(!Error::Timeout.is_transient(), "a wait that ran out is an answer about the lock");
    }

    #[test]
    fn a_busy_status_names_the_holder_from_its_binary_metadata() {
        let holder = holdfast_proto::v1::Holder {
            owner: "w1".into(),
            fence: 41,
            granted_at_ms: 1,
            expires_at_ms: 2,
            ttl_ms: 1,
            session_id: 0,
            value: b"10.0.0.1:7070".to_vec(),
            free_at_ms: 0,
        };
        let mut busy = status(Code::AlreadyExists, Some("urn:holdfast:busy"), "held");
        let bytes = prost::Message::encode_to_vec(&holder);
        busy.metadata_mut().insert_bin(HOLDER_METADATA, tonic::metadata::MetadataValue::from_bytes(&bytes));
        assert_eq!(Error::from(busy), Error::Busy { holder: Some(Box::new(HolderInfo::from(holder))) });
        // Undecodable bytes are ignored: still busy, holder unknown.
        let mut garbled = status(Code::AlreadyExists, Some("urn:holdfast:busy"), "held");
        garbled.metadata_mut().insert_bin(HOLDER_METADATA, tonic::metadata::MetadataValue::from_bytes(&[0xff, 0xff]));
        assert_eq!(Error::from(garbled), Error::Busy { holder: None });
    }

    #[test]
    fn the_problem_type_wins_over_the_code() {
        // FAILED_PRECONDITION covers both "not holder" and "expired"; only the problem type tells them apart.
        assert_eq!(Error::from(status(Code::FailedPrecondition, Some("urn:holdfast:expired"), "")), Error::Expired);
        assert_eq!(
            Error::from(status(Code::FailedPrecondition, Some("urn:holdfast:not-holder"), "")),
            Error::NotHolder
        );
    }

    #[test]
    fn statuses_without_problem_types_map_by_code() {
        let cases = [
            (Code::InvalidArgument, Error::InvalidArgument("m".into())),
            (Code::AlreadyExists, Error::Busy { holder: None }),
            (Code::FailedPrecondition, Error::NotHolder),
            (Code::NotFound, Error::NotFound),
            (Code::ResourceExhausted, Error::LimitReached("m".into())),
            (Code::Unavailable, Error::Unavailable("m".into())),
            (Code::DeadlineExceeded, Error::Unavailable("m".into())),
            (Code::Unimplemented, Error::Protocol("Unimplemented: m".into())),
        ];
        for (code, want) in cases {
            assert_eq!(Error::from(status(code, None, "m")), want, "{code:?}");
        }
    }

    #[test]
    fn an_unknown_slug_falls_back_to_the_code() {
        let e = Error::from(status(Code::ResourceExhausted, Some("urn:holdfast:too-many-widgets"), "m"));
        assert_eq!(e, Error::LimitReached("m".into()));
    }

    #[test]
    fn session_errors_map_by_problem_type_alone() {
        assert_eq!(Error::from_problem(None, Some("urn:holdfast:session-gone"), "gone"), Error::SessionLost);
        assert_eq!(
            Error::from_problem(None, Some("urn:holdfast:too-many-claims"), "max 1024"),
            Error::LimitReached("max 1024".into())
        );
        assert_eq!(
            Error::from_problem(None, Some("urn:holdfast:overloaded"), "busy workers"),
            Error::Overloaded("busy workers".into())
        );
        assert_eq!(
            Error::from_problem(None, Some("urn:holdfast:invalid-name"), "bad name"),
            Error::InvalidArgument("bad name".into())
        );
        assert_eq!(
            Error::from_problem(None, Some("urn:holdfast:mystery"), "what"),
            Error::Protocol("urn:holdfast:mystery: what".into())
        );
    }

    #[test]
    fn only_unavailable_is_retried() {
        assert!(Error::Unavailable("x".into()).is_retryable());
        for e in [
            Error::NotFound,
            Error::Busy { holder: None },
            Error::Timeout,
            Error::SessionLost,
            Error::NotHolder,
            // Sent elsewhere at once, a refused load would only move: the caller backs off.
            Error::Overloaded("x".into()),
        ] {
            assert!(!e.is_retryable(), "{e:?}");
        }
    }

    #[test]
    fn busy_names_its_holder() {
        let holder = HolderInfo {
            owner: "w1".into(),
            fence: 41,
            granted_at_ms: 1,
            expires_at_ms: None,
            ttl_ms: None,
            session_id: Some(9),
            value: vec![],
            free_at_ms: None,
        };
        let delayed = HolderInfo { free_at_ms: Some(5_000), session_id: None, ..holder.clone() };
        assert_eq!(Error::Busy { holder: Some(Box::new(holder)) }.to_string(), "the lock is held by \"w1\" (fence 41)");
        assert_eq!(
            Error::Busy { holder: Some(Box::new(delayed)) }.to_string(),
            "the lock is in its lock-delay until 5000 ms (leader time): the hold of \"w1\" (fence 41) expired"
        );
        assert_eq!(Error::Busy { holder: None }.to_string(), "the lock is held");
    }
}
