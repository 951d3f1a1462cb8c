//! Hard limits, the same on every replica.
//!
//! They are compiled in, not configured: a limit that differed between replicas would make them apply the
//! same entry differently. Front doors may enforce tighter, configurable bounds (for example the TTL range)
//! before they propose anything.

/// Longest lock name, in bytes.
pub const NAME_LEN_MAX: usize = 200;
/// Longest owner description, in bytes.
pub const OWNER_LEN_MAX: usize = 128;
/// Shortest TTL or session lease any replica accepts.
pub const TTL_MS_MIN: u64 = 10;
/// Longest TTL or session lease any replica accepts (7 days).
pub const TTL_MS_MAX: u64 = 7 * 24 * 3600 * 1000;
/// Longest a waiter may stay queued (1 day).
pub const WAIT_MS_MAX: u64 = 24 * 3600 * 1000;
/// Waiters queued on one lock.
pub const WAITERS_PER_LOCK_MAX: usize = 1024;
/// Locks that exist at once (held or with waiters).
pub const LOCKS_MAX: usize = 4_000_000;
/// Sessions open at once, as the leader proposes a session's open
/// ([`Command::OpenSessionCapped`](crate::Command::OpenSessionCapped) carries it, so that raising it never
/// changes how a stored entry applies).
pub const SESSIONS_MAX: u64 = 500_000;
/// Sessions open at once for [`Command::OpenSession`](crate::Command::OpenSession) entries, which builds
/// before [`SESSIONS_MAX`] travelled in the entry wrote.
pub const SESSIONS_MAX_BEFORE: u64 = 200_000;
/// Locks one session holds or waits for at once.
pub const CLAIMS_PER_SESSION_MAX: usize = 1024;
/// Items one `Expire` entry may carry.
pub const EXPIRE_BATCH_MAX: usize = 4096;
/// Longest value a lock carries, in bytes.
pub const VALUE_LEN_MAX: usize = 1024;
/// How long a freed lock's revision is remembered (leader time): a watcher that looks again within this
/// long after a lock was freed sees the release's revision, not the "no history" 0.
pub const FREED_KEEP_MS: u64 = 10 * 60 * 1000;
/// Frees (of any lock) remembered at once: past it, the oldest is forgotten first.
pub const FREED_MAX: usize = 100_000;
/// Longest lock-delay an acquire may ask for (1 hour): after its hold expires, the lock stays ungranted
/// this long. Front doors set a tighter, configurable bound.
pub const LOCK_DELAY_MS_MAX: u64 = 3600 * 1000;
/// Most holders a semaphore may have at once (an acquire's `limit`).
pub const SEMAPHORE_LIMIT_MAX: u32 = 1024;
/// Most commands in one [`Command::Batch`](crate::Command::Batch) entry.
pub const BATCH_MAX: usize = 256;

/// Length of a tenant prefix: 16 lowercase hex digits of the tenant id, then `/`.
pub const TENANT_PREFIX_LEN: usize = 17;
/// API keys that exist at once.
pub const KEYS_MAX: usize = 100_000;

/// The tenant prefix of names and owners in the namespace of tenant `id`.
pub fn tenant_prefix(id: u64) -> String {
    format!("{id:016x}/")
}

/// Splits a stored name or owner into its tenant (when auth is on, the front doors put every name and
/// owner of a tenant under [`tenant_prefix`]) and what the tenant sees.
pub fn split_tenant(text: &str) -> (Option<u64>, &str) {
    let bytes = text.as_bytes();
    if bytes.len() >= TENANT_PREFIX_LEN
        && bytes[TENANT_PREFIX_LEN - 1] == b'/'
        && bytes[..TENANT_PREFIX_LEN - 1].iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        let id = u64::from_str_radix(&text[..TENANT_PREFIX_LEN - 1], 16).expect("16 hex digits");
        return (Some(id), &text[TENANT_PREFIX_LEN..]);
    }
    (None, text)
}

/// Whether `name` is a valid lock name: 1 to [`NAME_LEN_MAX`] bytes of `A-Z a-z 0-9 . _ - :`, possibly
/// under a tenant prefix.
///
/// `/` is excluded (but for the prefix) so that a name is always one path segment of the HTTP API.
pub fn valid_name(name: &str) -> bool {
    let (_, name) = split_tenant(name);
    !name.is_empty()
        && name.len() <= NAME_LEN_MAX
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':'))
}

/// Whether `owner` is a valid owner description: up to [`OWNER_LEN_MAX`] bytes with no control characters,
/// possibly under a tenant prefix.
pub fn valid_owner(owner: &str) -> bool {
    let (_, owner) = split_tenant(owner);
    owner.len() <= OWNER_LEN_MAX && !owner.chars().any(char::is_control)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(valid_name("nightly-import"));
        assert!(valid_name("a.b_c:d-9"));
        assert!(valid_name(&"x".repeat(NAME_LEN_MAX)));
        assert!(!valid_name(""));
        assert!(!valid_name(&"x".repeat(NAME_LEN_MAX + 1)));
        assert!(!valid_name("a/b"));
        assert!(!valid_name("a b"));
        assert!(!valid_name("é"));
        let prefixed = format!("{}job", tenant_prefix(0xab));
        assert!(valid_name(&prefixed));
        assert_eq!(split_tenant(&prefixed), (Some(0xab), "job"));
        assert!(!valid_name(&tenant_prefix(7)), "a prefix alone is no name");
        assert!(!valid_name("00000000000000AB/job"), "prefixes are lowercase");
        assert_eq!(split_tenant("plain"), (None, "plain"));
    }

    #[test]
    fn owners() {
        assert!(valid_owner(""));
        assert!(valid_owner("worker-1 on host é"));
        assert!(!valid_owner("bad\nowner"));
        assert!(!valid_owner(&"o".repeat(OWNER_LEN_MAX + 1)));
    }
}
