//! The simulation's deliberately broken behaviours ([`Bugs`]), behind the `faults` feature.
//!
//! A leaf: it imports no other module of this crate.

/// Declares [`Bugs`]: a field per switch when the `faults` feature is on, and a method of the same name
/// that reads it then and is `false` otherwise, so that a build without the feature (every build of the
/// `holdfast` binary) has neither the switches nor the branches on them.
macro_rules! bugs {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        /// Deliberately broken behaviours, each the opposite of a rule the design depends on. Every one is
        /// off unless the simulation turns it on, to show that its checkers catch a cluster that breaks that
        /// rule (a checker that never failed proves nothing). They exist only with the `faults` feature,
        /// which only `holdfast-sim` turns on; no flag of the binary sets them.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct Bugs {
            $($(#[$doc])* #[cfg(feature = "faults")] pub $name: bool,)*
        }

        impl Bugs {
            $(
                $(#[$doc])*
                #[inline(always)]
                pub fn $name(&self) -> bool {
                    #[cfg(feature = "faults")]
                    return self.$name;
                    #[cfg(not(feature = "faults"))]
                    return false;
                }
            )*
        }
    };
}

bugs! {
    /// A new leader keeps the deadlines it kept as a follower, instead of giving every session and hold a
    /// full lease from its promotion.
    no_promotion_grace,
    /// Heartbeats are acknowledged without a quorum round confirming that this node still leads.
    unconfirmed_heartbeats,
    /// Clients are told the leader's term as a grant's fence, instead of the grant's log index.
    term_as_fence,
    /// A try-lock of a held lock is answered busy from this node's state without confirming leadership.
    unconfirmed_busy,
    /// A read (`get`, `list`) is answered from the leader's state without confirming its leadership.
    unconfirmed_reads,
    /// A follower answers a read from its own state at once, without asking the leader how far to apply
    /// first.
    unconfirmed_follower_reads,
    /// Leases never run out: the keeper never proposes an expiry.
    never_expire,
    /// Not a bug: this node acts as one of a build from before batches, which closes the connection on a
    /// follower's batch of heartbeats or writes (it cannot decode one). What a follower of a newer build
    /// meets during a rolling upgrade, and must cope with.
    no_heartbeat_batches,
    /// A follower whose watch won a pre-vote campaigns even if it granted another candidate its vote
    /// during the pre-vote. What happens anyway when the grant comes after the watch's last look but
    /// before openraft's core takes the campaign (see `election::Elections::vote_answered`); here it happens every
    /// time.
    campaign_despite_a_vote_granted,
    /// Watch streams are not sent every other change this node tells them of.
    watch_skips_changes,
    /// The leader proposes an acquire without the lock-delay its client asked for.
    lock_delay_dropped,
    /// The leader proposes a semaphore's acquire (a limit above 1) with one place more than its client
    /// asked for.
    semaphore_limit_raised,
}
