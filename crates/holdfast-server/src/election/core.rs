//! The election watch and the pre-vote as a pure state machine: [`Election`] takes what happened (a look
//! at the clock, a vote or pre-vote answered, a leader's call) with what Raft says of this node, and
//! answers the [`Action`]s to take. It reads no clock and no random source (times and drawn timeouts are
//! its inputs) and does no IO, so its tests assert the whole list of actions for each input, as
//! openraft's engine tests assert its commands. The driver ([`super::Elections`]) carries them out.

use std::collections::BTreeSet;
use std::time::Duration;

use holdfast_store::NodeId;
use openraft::raft::VoteResponse;
use openraft::{LogId, ServerState, Vote};
use tokio::time::Instant;

use crate::peer::protocol::{PreVote, PreVoteAnswer};

/// What a node knows of its contact with a leader, for its election watch, its answers to pre-votes and
/// its early campaigns.
#[derive(Debug)]
struct LeaderContact {
    /// When a call from a leader (an `AppendEntries` or a snapshot chunk, from whichever leader) last
    /// arrived here or was last answered; on the leader itself, the election watch's last look. At first,
    /// when the node started: a node that just started neither campaigns nor says yes to a pre-vote until
    /// it has heard nothing for as long as one that just heard from a leader. A restarted node that said yes
    /// at once would make a majority with a node cut off from a healthy leader, and depose it.
    heard: Instant,
    /// Calls from a leader being answered now. The last chunk of a snapshot is answered only once the
    /// snapshot is installed, which takes a second or more at a million locks, and the leader sends this
    /// node nothing else until then: a silence of this node's own making, not a leader gone. A follower
    /// whose watch campaigned meanwhile deposed a healthy leader with its higher term
    /// (docs/perf-notes/2026-12-03-snapshot-install-and-leader.md). A follower's `AppendEntries` waits for its disk the
    /// same way.
    answering: u32,
    /// When this node last granted a candidate its vote: an election waits as long from then as from the
    /// last word from a leader, as openraft's timer would.
    granted_vote: Option<Instant>,
    /// As `heard`, but only calls from a leader count (never the watch's own looks as leader): when this
    /// node last followed one. A new leader's election took at most from then to its promotion.
    followed: Instant,
}

impl LeaderContact {
    /// A node's contact as it starts at `now`.
    fn new(now: Instant) -> Self {
        LeaderContact { heard: now, answering: 0, granted_vote: None, followed: now }
    }

    /// When a leader was last heard from, as of `now`: `now` itself while one of its calls is answered.
    fn heard(&self, now: Instant) -> Instant {
        if self.answering > 0 {
            now
        } else {
            self.heard
        }
    }

    /// The later of the last word from a leader and the last vote this node granted, as of `now`: what an
    /// election waits from. A candidate it voted for may lead already, its first entries on their way.
    fn quiet_since(&self, now: Instant) -> Instant {
        self.granted_vote.map_or(self.heard(now), |granted| granted.max(self.heard(now)))
    }
}

/// What a node knows when a peer asks it a [`PreVote`] ([`Election::pre_vote_asked`]).
struct PreVoteAsked<'a> {
    asked: &'a PreVote,
    state: ServerState,
    /// How long since this node last heard from a leader or granted a vote.
    leader_silent: Duration,
    /// A leader's lease: openraft's longest election timeout.
    lease: Duration,
    /// The last entry of this node's log.
    last: Option<LogId<NodeId>>,
}

impl PreVoteAsked<'_> {
    /// Whether the leader is gone as far as this node knows: it is not the leader, and heard from none
    /// (nor granted a vote) for longer than a lease, the time openraft refuses votes for after the last
    /// word from a leader.
    fn leader_gone(&self) -> bool {
        self.state != ServerState::Leader && self.leader_silent > self.lease
    }

    /// Whether this node would vote for the asker: the leader is gone, and the asker's log is at least as
    /// up to date as this node's, as openraft's vote requires.
    fn grants(&self) -> bool {
        self.leader_gone() && self.asked.last_log_id >= self.last
    }
}

/// Whether the voters in `granted` are a majority of every voter set in `configs` (two during a membership
/// change, one otherwise): what an election needs to win.
pub fn majority_of_each(configs: &[BTreeSet<NodeId>], granted: &BTreeSet<NodeId>) -> bool {
    configs.iter().all(|voters| voters.iter().filter(|id| granted.contains(id)).count() * 2 > voters.len())
}

/// A vote or a pre-vote this node answered, and what it knew then: whether it has to campaign at once (see
/// [`Election::vote_answered`]).
struct Refused {
    /// The term the candidate campaigns in (or, for a pre-vote, would campaign in), the candidate, and its
    /// last entry.
    candidate_term: u64,
    candidate: NodeId,
    candidate_last: Option<LogId<NodeId>>,
    /// Whether this node granted it.
    granted: bool,
    /// This node's last entry, and the term of its vote, as it answered.
    last: Option<LogId<NodeId>>,
    answer_term: u64,
    /// How long since this node last heard from a leader.
    leader_silent: Duration,
    /// A leader's lease: openraft's longest election timeout.
    lease: Duration,
    state: ServerState,
    /// The term of this node's vote, as its metrics last told.
    term: u64,
    /// This node's id.
    id: NodeId,
    /// Whether this node's vote, as it answered, is for a third node (neither the candidate nor itself) in
    /// the candidate's term.
    voted_other: bool,
}

impl Refused {
    /// How many campaigns, one after the other, take this node's term past the candidate's: `None` if this
    /// node should not campaign now. It does when the candidate cannot win its vote for a shorter log and
    /// no leader has been heard from for a lease (it follows, and did not vote in a later term), or when it
    /// is the leader the candidate deposes ([`Refused::deposed`]).
    fn campaigns(&self) -> Option<u64> {
        if self.granted || self.answer_term > self.candidate_term {
            return None;
        }
        let behind = self.candidate_last < self.last;
        let leader_gone = behind && self.leader_silent > self.lease && self.state == ServerState::Follower;
        let deposed = self.deposed() && matches!(self.state, ServerState::Follower | ServerState::Leader);
        (leader_gone || deposed).then(|| campaigns_past(self.candidate_term, self.term))
    }

    /// Whether the last leader this node heard from is itself, and the candidate's vote is above the one
    /// it led with (a higher term, or the same term and a higher id, as openraft orders votes), and it
    /// refused the candidate for its shorter log or its own lease, not for another candidate of that term:
    /// its last entry is its own, which no later leader's entries followed. The candidate's vote deposes
    /// it (its followers answer its calls with that vote) or has already, and the candidate, which did not
    /// get its vote, may get no other: the leader is gone, though this node heard from it a moment ago.
    fn deposed(&self) -> bool {
        self.last.is_some_and(|last| {
            let led = (last.leader_id.term, last.leader_id.node_id);
            last.leader_id.node_id == self.id && led < (self.candidate_term, self.candidate)
        }) && !self.voted_other
    }
}

/// Whether node `id`'s vote `vote` is for a third node, neither `candidate`'s nor its own, in the
/// candidate's term.
fn votes_for_a_third(vote: &Vote<NodeId>, candidate: &Vote<NodeId>, id: NodeId) -> bool {
    let (vote, candidate) = (vote.leader_id(), candidate.leader_id());
    vote.term == candidate.term && ![Some(candidate.node_id), Some(id)].contains(&vote.voted_for())
}

/// How many campaigns, one after the other, take a node whose vote is of `term` past `candidate_term`,
/// in which openraft would have the candidate refuse it if its id is lower: at least one, at most three.
pub fn campaigns_past(candidate_term: u64, term: u64) -> u64 {
    (candidate_term + 1).saturating_sub(term).clamp(1, 3)
}

/// What decides whether a node tries to campaign because its leader fell silent
/// ([`Election::tick`]).
#[derive(Debug, Clone, Copy)]
struct Silence {
    state: ServerState,
    /// Whether this node is a voter.
    voter: bool,
    /// How long since this node last heard from a leader or granted a vote (or started).
    leader_silent: Duration,
    /// How long since this node last tried (a pre-vote, and a campaign if it won); `None`: never.
    since_try: Option<Duration>,
    /// How long after the last word from a leader to try: a lease and an election timeout.
    wait: Duration,
    /// How long after a try it tries again: an election timeout.
    retry: Duration,
}

impl Silence {
    /// Whether to try now: a voter that follows or stands for election, has heard no leader for `wait`, and
    /// has not tried within `retry`.
    fn tries(&self) -> bool {
        self.voter && matches!(self.state, ServerState::Follower | ServerState::Candidate) && self.due_in().is_zero()
    }

    /// How long from now until the silence is long enough to try, if nothing is heard meanwhile: zero once
    /// it is.
    fn due_in(&self) -> Duration {
        let quiet = self.wait.saturating_sub(self.leader_silent);
        let again = self.since_try.map_or(Duration::ZERO, |since| self.retry.saturating_sub(since));
        quiet.max(again)
    }
}

/// What Raft says of this node as an input arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Role {
    pub state: ServerState,
    /// Whether this node is a voter.
    pub voter: bool,
    /// The term of this node's vote.
    pub term: u64,
    /// The last entry of this node's durable log.
    pub last: Option<LogId<NodeId>>,
}

/// Why this node campaigns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// No leader was heard from, nor a vote granted, for this long (a lease and an election timeout), and
    /// a majority would vote for this node.
    LeaderSilent(Duration),
    /// A candidate whose log is behind this node's asked for its vote, with no leader heard from for a
    /// lease: it cannot win this node's vote, and in a three-node cluster it cannot win at all.
    BehindCandidate,
    /// A candidate deposes this node as leader, and did not get its vote ([`Refused::deposed`]).
    Deposed,
}

/// What the driver does for an input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Ask every other voter for `0`, and tell [`Election::pre_voted`] whether a majority of every voter
    /// set would vote for this node.
    AskPreVotes(PreVote),
    /// Campaign now (openraft's `trigger().elect()`), `times` in a row: each takes this node's term one
    /// higher, past the candidate's where it has to.
    Campaign { times: u64, why: Why },
    /// This node leads and a candidate of `candidate_term` deposes it: openraft ignores a leader's
    /// campaign, so wait (at most a lease) until it has stepped down, then campaign past `candidate_term`
    /// from the term it then holds ([`campaigns_past`]).
    CampaignOnceDeposed { candidate_term: u64 },
    /// Look again (call [`Election::tick`]) at this instant, unless something else happens first.
    LookAt(Instant),
}

/// One node's election watch and pre-vote judge: the only election timer of a node (openraft's own is
/// off, `enable_elect`).
///
/// openraft 0.9's timer campaigned up to a tick (1.5 heartbeat intervals) after its timeout, added twice
/// the longest election timeout for as long as the node once saw a longer log while it was a candidate
/// (the first campaign after a crash came 1.05-1.2 s after it instead of about 0.6 s), did not restart on a
/// snapshot's chunk nor during its install (a follower installing a snapshot deposed its healthy leader),
/// and had no pre-vote: a follower cut off from its leader campaigned in higher and higher terms, and the
/// first answer it gave the leader after the cut healed made the leader step down
/// (docs/perf-notes/2026-12-03-election-watch.md, 2026-12-03-pre-votes.md).
///
/// A voter that follows, or stands for election, tries once no word from a leader came, nor did it grant
/// a vote, for a lease (the longest election timeout) plus an election timeout drawn between the shortest
/// and the longest, as openraft draws its own (550 to 600 ms with the defaults), counted from its start if
/// it has heard nothing since ([`LeaderContact`]). A try is a pre-vote and, if a majority would vote for it,
/// a campaign; it tries again a drawn timeout later (a split vote, a refused pre-vote) for as long as no
/// leader is heard. The watch looks at the instant a try is due, and otherwise every quarter heartbeat
/// interval, and draws a new timeout after every try. The draw spreads the followers' tries as openraft's
/// timer does, so that the one with the longer log is not often outvoted in the same term by one with a
/// shorter log and a higher id; two tries that met anyway (a split vote) do not meet again at the next. It
/// never tries while a leader is heard, and never on the leader.
#[derive(Debug)]
pub struct Election {
    id: NodeId,
    /// A leader's lease: openraft's longest election timeout, for which a node that heard from a leader
    /// refuses votes.
    lease: Duration,
    /// How often the watch looks when no try is due sooner: a quarter of the heartbeat interval.
    look: Duration,
    contact: LeaderContact,
    /// The highest term of a candidate this node started a campaign of its own against.
    campaigned_against: u64,
    /// The election timeout drawn for the next try.
    timeout: Duration,
    /// When this node last tried, and how long the leader had been silent then.
    tried: Option<(Instant, Duration)>,
}

impl Election {
    /// The election of node `id`, started at `now` (it counts as having just heard from a leader), with a
    /// leader's `lease`, looking every `look`. Its watch waits a lease for its first try until
    /// [`Election::start`] draws it a timeout.
    pub fn new(id: NodeId, now: Instant, lease: Duration, look: Duration) -> Self {
        let contact = LeaderContact::new(now);
        Election { id, lease, look, contact, campaigned_against: 0, timeout: lease, tried: None }
    }

    /// The watch starts, with `timeout` drawn for its first try.
    pub fn start(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// A leader's lease.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// `current`, openraft's leader, unless it is another node this node has not heard from for a lease
    /// and the longest election timeout (the longest the watch waits before it tries to campaign): with
    /// pre-votes, a follower cut off from its leader stays a follower, with openraft's idea of the leader
    /// unchanged, until some node wins an election, which a node cut off from the others, or a lone
    /// survivor, never does.
    pub fn leader(&self, now: Instant, current: Option<NodeId>) -> Option<NodeId> {
        let leader = current?;
        if leader != self.id && now > self.follows_until(now) {
            return None;
        }
        Some(leader)
    }

    /// When a leader last called this node, as of `now` (`now` while a call is answered); when the node
    /// started if none has; on the leader, the watch's last look.
    pub fn leader_heard(&self, now: Instant) -> Instant {
        self.contact.heard(now)
    }

    /// Until when this node, as a follower, takes its leader for one ([`Election::leader`]).
    pub fn follows_until(&self, now: Instant) -> Instant {
        self.contact.heard(now) + self.lease * 2
    }

    /// A call from a leader (an `AppendEntries`, or a chunk of a snapshot it streams) reached this node at
    /// `now`: until it is answered ([`Election::leader_call_answered`]), the leader counts as heard from at
    /// every moment ([`LeaderContact`]).
    pub fn leader_call(&mut self, now: Instant) {
        self.contact.heard = now;
        self.contact.followed = now;
        self.contact.answering += 1;
    }

    /// A call from a leader was answered at `now`: the leader was last heard from then.
    pub fn leader_call_answered(&mut self, now: Instant) {
        self.contact.answering -= 1;
        self.contact.heard = now;
        self.contact.followed = now;
    }

    /// When this node last followed a leader, as of `now` (`now` while a leader's call is answered): on a
    /// new leader, the start of the time its election took.
    pub fn followed(&self, now: Instant) -> Instant {
        if self.contact.answering > 0 {
            now
        } else {
            self.contact.followed
        }
    }

    /// The watch looks at `now`; `draw` draws an election timeout, once per try. Either a try, a pre-vote
    /// first ([`Action::AskPreVotes`]), or nothing but when to look next.
    pub fn tick(&mut self, now: Instant, role: Role, draw: impl FnOnce() -> Duration) -> Vec<Action> {
        // A leader hears itself: once deposed, it waits as long as its followers did.
        if role.state == ServerState::Leader {
            self.contact.heard = now;
        }
        let silence = Silence {
            state: role.state,
            voter: role.voter,
            leader_silent: now - self.contact.quiet_since(now),
            since_try: self.tried.map(|(at, _)| now - at),
            wait: self.lease + self.timeout,
            retry: self.timeout,
        };
        if !silence.tries() {
            let due = silence.due_in();
            return vec![Action::LookAt(now + if due.is_zero() { self.look } else { due.min(self.look) })];
        }
        self.tried = Some((now, silence.leader_silent));
        self.timeout = draw();
        let asked = PreVote { candidate: self.id, term: role.term + 1, last_log_id: role.last };
        vec![Action::AskPreVotes(asked), Action::LookAt(now + self.look)]
    }

    /// The pre-vote of the try begun at the last [`Election::tick`] came back at `now`: `won` if a majority
    /// of every voter set would vote for this node. It campaigns only if it won and, meanwhile, heard from
    /// no leader and granted no vote: two followers whose watches try within a round trip of each other
    /// both win their pre-votes, and the one that granted the other's vote would only depose the leader it
    /// just voted for. `despite_a_vote_granted` breaks that rule (a fault of the simulation's).
    pub fn pre_voted(&mut self, now: Instant, won: bool, despite_a_vote_granted: bool) -> Vec<Action> {
        let Some((began, silent)) = self.tried else { return Vec::new() };
        if !won || (self.contact.quiet_since(now) >= began && !despite_a_vote_granted) {
            return Vec::new();
        }
        vec![Action::Campaign { times: 1, why: Why::LeaderSilent(silent) }]
    }

    /// A peer asks this node's [`PreVote`] at `now`: granted if it would vote for the asker now
    /// ([`PreVoteAsked::grants`]). A node that refuses it because its log is behind this node's, with the
    /// leader gone, campaigns at once instead, as it would on refusing that node's vote
    /// ([`Election::vote_answered`]).
    pub fn pre_vote_asked(&mut self, now: Instant, role: Role, asked: &PreVote) -> (PreVoteAnswer, Vec<Action>) {
        let (heard, quiet_since) = (self.contact.heard(now), self.contact.quiet_since(now));
        let judged = PreVoteAsked {
            asked,
            state: role.state,
            leader_silent: now - quiet_since,
            lease: self.lease,
            last: role.last,
        };
        let granted = judged.grants();
        let mut actions = Vec::new();
        if !granted && judged.leader_gone() {
            actions = self.campaign_past(Refused {
                candidate_term: asked.term,
                candidate: asked.candidate,
                candidate_last: asked.last_log_id,
                granted,
                last: role.last,
                answer_term: role.term,
                leader_silent: now - heard,
                lease: self.lease,
                state: role.state,
                term: role.term,
                id: self.id,
                voted_other: false,
            });
        }
        (PreVoteAnswer { granted }, actions)
    }

    /// This node answered, at `now`, a candidate's vote `candidate` whose log ends at `candidate_last`, with
    /// `answer`; `role` is what its metrics said then. Records when it granted a vote (the watch waits from
    /// then too), and campaigns at once if this node is the one that has to lead.
    ///
    /// A candidate whose log is behind this node's never gets its vote, and in a three-node cluster whose
    /// leader is gone it cannot win at all: this node has to. Waiting for its own watch costs a lease and
    /// an election timeout from the last word of the leader (failovers of 1.2 s against about 0.6 s:
    /// docs/perf-notes/2026-12-02-early-campaign.md). So when no leader has been heard from for longer than
    /// a leader's lease, this node campaigns at once, in a term above the candidate's: openraft orders the
    /// candidates of one term by node id, and would have the candidate refuse this node in its own term if
    /// this node's id is lower. A campaign never breaks safety; at worst it costs an election round, and a
    /// node that still hears from a leader never starts one here.
    ///
    /// Nor does it wait when the leader such a candidate deposes is this node. Two followers whose watches
    /// try within a moment of each other both win their pre-votes; the second may grant the first its vote
    /// after its own watch last looked, and campaign in the next term anyway (the grant and the campaign
    /// meet only in openraft's core). The first, elected meanwhile with one entry more, is deposed by that
    /// higher term and refuses the second for its shorter log: nobody could win until the second tried
    /// again, a lease and an election timeout after its grant. If the second's log is as long as the
    /// first's (it heard the first's entry before its campaign), the first refuses it for its own lease,
    /// with the same end. The deposed leader campaigns at once instead.
    pub fn vote_answered(
        &mut self,
        now: Instant,
        role: Role,
        candidate: &Vote<NodeId>,
        candidate_last: Option<LogId<NodeId>>,
        answer: &VoteResponse<NodeId>,
    ) -> Vec<Action> {
        if answer.vote_granted {
            self.contact.granted_vote = Some(now);
        }
        let heard = self.contact.heard(now);
        self.campaign_past(Refused {
            candidate_term: candidate.leader_id().term,
            candidate_last,
            granted: answer.vote_granted,
            last: answer.last_log_id,
            answer_term: answer.vote.leader_id().term,
            leader_silent: now - heard,
            lease: self.lease,
            state: role.state,
            term: role.term,
            id: self.id,
            candidate: candidate.leader_id().node_id,
            voted_other: votes_for_a_third(&answer.vote, candidate, self.id),
        })
    }

    /// The campaigns `refused` calls for ([`Refused::campaigns`]), once per candidate's term.
    fn campaign_past(&mut self, refused: Refused) -> Vec<Action> {
        let Some(times) = refused.campaigns() else { return Vec::new() };
        let candidate_term = refused.candidate_term;
        if self.campaigned_against >= candidate_term {
            return Vec::new();
        }
        self.campaigned_against = candidate_term;
        if refused.state == ServerState::Leader {
            return vec![Action::CampaignOnceDeposed { candidate_term }];
        }
        let why = if refused.deposed() { Why::Deposed } else { Why::BehindCandidate };
        vec![Action::Campaign { times, why }]
    }
}

#[cfg(test)]
mod tests {
    use openraft::raft::VoteResponse;
    use openraft::{CommittedLeaderId, Vote};

    use super::*;

    fn log_id(term: u64, index: u64) -> Option<LogId<NodeId>> {
        log_id_of(term, 2, index)
    }

    /// An entry written by leader `node`.
    fn log_id_of(term: u64, node: NodeId, index: u64) -> Option<LogId<NodeId>> {
        Some(LogId::new(CommittedLeaderId::new(term, node), index))
    }

    #[test]
    fn a_leader_counts_as_heard_from_for_as_long_as_one_of_its_calls_is_answered() {
        let arrived = Instant::now();
        let later = arrived + Duration::from_secs(2);
        let mut contact = LeaderContact { answering: 1, ..LeaderContact::new(arrived) };
        assert_eq!(contact.heard(later), later, "a snapshot still installing");
        contact.answering = 0;
        assert_eq!(contact.heard(later), arrived);
    }

    #[test]
    fn an_election_waits_from_the_later_of_the_last_word_from_a_leader_and_the_last_vote_granted() {
        let heard = Instant::now();
        let later = heard + Duration::from_secs(1);
        let contact = LeaderContact::new(heard);
        assert_eq!(contact.quiet_since(later), heard, "a node just started counts as having just heard");
        let voted = LeaderContact { granted_vote: Some(later), ..contact };
        assert_eq!(voted.quiet_since(later), later);
        let voted_before = LeaderContact { granted_vote: Some(heard - Duration::from_secs(1)), ..contact };
        assert_eq!(voted_before.quiet_since(later), heard);
        let answering = LeaderContact { answering: 1, ..voted };
        assert_eq!(answering.quiet_since(later + Duration::from_secs(5)), later + Duration::from_secs(5));
    }

    #[test]
    fn a_follower_tries_to_campaign_only_after_a_lease_and_an_election_timeout_of_silence() {
        let ms = Duration::from_millis;
        let silent = Silence {
            state: ServerState::Follower,
            voter: true,
            leader_silent: ms(610),
            since_try: None,
            wait: ms(600),
            retry: ms(280),
        };
        assert!(silent.tries());
        assert!(Silence { leader_silent: ms(600), ..silent }.tries(), "exactly the wait");
        assert!(!Silence { leader_silent: ms(599), ..silent }.tries(), "a leader heard within the wait");
        assert!(!Silence { voter: false, ..silent }.tries(), "a learner never campaigns");
        for state in [ServerState::Leader, ServerState::Learner, ServerState::Shutdown] {
            assert!(!Silence { state, ..silent }.tries(), "{state:?}");
        }
        // A candidate whose election came to nothing (a split vote) tries again.
        assert!(Silence { state: ServerState::Candidate, since_try: Some(ms(280)), ..silent }.tries());
        // Once per election timeout: not again until as long has passed since its last try.
        assert!(!Silence { since_try: Some(ms(279)), ..silent }.tries());
        assert!(Silence { since_try: Some(ms(280)), ..silent }.tries());
        // When the watch wakes next: the later of the end of the wait and a retry after the last try.
        assert_eq!(Silence { leader_silent: ms(450), ..silent }.due_in(), ms(150));
        assert_eq!(Silence { since_try: Some(ms(100)), ..silent }.due_in(), ms(180));
        assert_eq!(Silence { leader_silent: ms(450), since_try: Some(ms(200)), ..silent }.due_in(), ms(150));
        assert_eq!(silent.due_in(), Duration::ZERO);
    }

    #[test]
    fn a_voter_grants_a_pre_vote_only_with_the_leader_gone_for_a_lease_and_a_log_no_longer_than_the_askers() {
        let asked = PreVote { candidate: 1, term: 3, last_log_id: log_id(2, 3852) };
        let judged = PreVoteAsked {
            asked: &asked,
            state: ServerState::Follower,
            leader_silent: Duration::from_millis(301),
            lease: Duration::from_millis(300),
            last: log_id(2, 3852),
        };
        assert!(judged.grants());
        assert!(PreVoteAsked { state: ServerState::Candidate, ..judged }.grants());
        assert!(PreVoteAsked { last: log_id(2, 3851), ..judged }.grants(), "the asker's log is longer");
        assert!(PreVoteAsked { last: log_id(1, 3900), ..judged }.grants(), "the asker's last term is later");
        // A leader heard within its lease: the asker is only cut off from it.
        let heard = PreVoteAsked { leader_silent: Duration::from_millis(300), ..judged };
        assert!(!heard.grants() && !heard.leader_gone());
        let leader = PreVoteAsked { state: ServerState::Leader, leader_silent: Duration::from_secs(9), ..judged };
        assert!(!leader.grants() && !leader.leader_gone());
        // The asker's log is behind: refused, though the leader is gone.
        let behind = PreVoteAsked { last: log_id(2, 3853), ..judged };
        assert!(!behind.grants() && behind.leader_gone());
        assert!(!PreVoteAsked { last: log_id(3, 3800), ..judged }.grants(), "a later last term");
    }

    #[test]
    fn an_election_needs_a_majority_of_every_voter_set() {
        let set = |ids: &[NodeId]| ids.iter().copied().collect::<BTreeSet<NodeId>>();
        let three = vec![set(&[1, 2, 3])];
        assert!(!majority_of_each(&three, &set(&[1])));
        assert!(majority_of_each(&three, &set(&[1, 3])));
        assert!(majority_of_each(&[set(&[1])], &set(&[1])), "a single node elects itself");
        assert!(!majority_of_each(&[set(&[1, 2, 3, 4])], &set(&[1, 2])), "half is not a majority");
        // During a membership change, a majority of the old voters and one of the new.
        let joint = vec![set(&[1, 2, 3]), set(&[3, 4, 5])];
        assert!(!majority_of_each(&joint, &set(&[1, 2, 3])));
        assert!(majority_of_each(&joint, &set(&[1, 3, 4])));
    }

    /// Node 3 of a failover (docs/perf-notes/2026-12-02-early-campaign.md): it followed node 2 in term 2 up to entry
    /// 3853, node 2 is gone, and node 1 asks for its vote in term 3 with a log that ends at 3852.
    fn refused(answer: &VoteResponse<NodeId>) -> Refused {
        Refused {
            candidate_term: 3,
            candidate: 1,
            candidate_last: log_id(2, 3852),
            granted: answer.vote_granted,
            last: answer.last_log_id,
            answer_term: answer.vote.leader_id().term,
            leader_silent: Duration::from_millis(600),
            lease: Duration::from_millis(300),
            state: ServerState::Follower,
            term: 2,
            id: 3,
            voted_other: false,
        }
    }

    fn answer(granted: bool, vote: Vote<NodeId>, last: Option<LogId<NodeId>>) -> VoteResponse<NodeId> {
        VoteResponse { vote, vote_granted: granted, last_log_id: last }
    }

    #[test]
    fn a_node_campaigns_past_a_candidate_it_refused_for_a_shorter_log_once_the_leader_is_gone() {
        let refusal = answer(false, Vote::new_committed(2, 2), log_id(2, 3853));
        // Two campaigns: terms 3 and 4, past the candidate's 3, which a lower id would not win.
        assert_eq!(refused(&refusal).campaigns(), Some(2));
        assert_eq!(Refused { term: 3, ..refused(&refusal) }.campaigns(), Some(1));
        assert_eq!(Refused { term: 0, ..refused(&refusal) }.campaigns(), Some(3), "at most 3");

        // Not while a leader was heard from within its lease: the candidate is only cut off from it.
        let heard = Refused { leader_silent: Duration::from_millis(300), ..refused(&refusal) };
        assert_eq!(heard.campaigns(), None);
        // Not when the candidate's log is as long: it may win, and this node's refusal was for another reason.
        assert_eq!(Refused { candidate_last: log_id(2, 3853), ..refused(&refusal) }.campaigns(), None);
        // Not when the vote was granted, or this node already voted in a later term, or is not a follower.
        let granted = answer(true, Vote::new(3, 1), log_id(2, 3853));
        assert_eq!(refused(&granted).campaigns(), None);
        let later = answer(false, Vote::new(4, 3), log_id(2, 3853));
        assert_eq!(refused(&later).campaigns(), None);
        for state in [ServerState::Candidate, ServerState::Leader, ServerState::Learner] {
            assert_eq!(Refused { state, ..refused(&refusal) }.campaigns(), None, "{state:?}");
        }
    }

    #[test]
    fn a_leader_deposed_by_a_candidate_with_a_shorter_log_campaigns_at_once() {
        // Node 3 was elected in term 3 and wrote its first entry, 3854; node 1, a candidate of term 4 that
        // ends at 3853, deposes it. Node 3 heard from itself a moment ago.
        let refusal = answer(false, Vote::new_committed(3, 3), log_id_of(3, 3, 3854));
        let deposed = Refused {
            candidate_term: 4,
            candidate_last: log_id(2, 3853),
            leader_silent: Duration::from_millis(5),
            term: 3,
            ..refused(&refusal)
        };
        // Whether it still leads when it answers or has stepped down already: terms 4 and 5.
        for state in [ServerState::Leader, ServerState::Follower] {
            assert_eq!(Refused { state, ..deposed }.campaigns(), Some(2), "{state:?}");
        }
        // Not when its last entry is another leader's: that leader may still lead.
        for state in [ServerState::Leader, ServerState::Follower] {
            assert_eq!(Refused { state, last: log_id(3, 3854), ..deposed }.campaigns(), None, "{state:?}");
        }
        // Not when the candidate's term is its own: nothing deposes it.
        assert_eq!(Refused { candidate_term: 3, ..deposed }.campaigns(), None);
        // Not when it voted for another candidate of that term, which may win, nor when it granted the vote.
        assert_eq!(Refused { voted_other: true, ..deposed }.campaigns(), None);
        assert_eq!(Refused { granted: true, ..deposed }.campaigns(), None);
        // But when it refused a candidate with a log as long for its own lease: the candidate may get no
        // other vote.
        assert_eq!(Refused { candidate_last: log_id_of(3, 3, 3854), ..deposed }.campaigns(), Some(2));

        // A fresh cluster: node 2 won term 1 and wrote entry 1; node 3, started later, stands in term 1 too,
        // a vote above node 2's. Node 2 refuses it for its lease (its own vote of term 1), and campaigns in
        // term 2 once deposed; not for a candidate of its term with a lower id, which cannot depose it.
        let fresh = answer(false, Vote::new_committed(1, 2), log_id_of(1, 2, 1));
        let late = Refused {
            candidate_term: 1,
            candidate: 3,
            candidate_last: None,
            leader_silent: Duration::from_millis(5),
            term: 1,
            id: 2,
            state: ServerState::Leader,
            ..refused(&fresh)
        };
        assert_eq!(late.campaigns(), Some(1));
        assert_eq!(Refused { candidate: 1, ..late }.campaigns(), None);
        // Its own vote in the candidate's term, or one for the candidate, is not a third node's; a vote in
        // another term is not in the candidate's.
        let candidate = Vote::new(1, 3);
        assert!(!votes_for_a_third(&Vote::new_committed(1, 2), &candidate, 2));
        assert!(!votes_for_a_third(&Vote::new(1, 3), &candidate, 2));
        assert!(votes_for_a_third(&Vote::new(1, 1), &candidate, 2));
        assert!(!votes_for_a_third(&Vote::new(0, 1), &candidate, 2));
    }

    // Whole-action tests: each input's complete list of actions.

    const LEASE: Duration = Duration::from_millis(300);
    const LOOK: Duration = Duration::from_millis(25);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn follower(term: u64, last: u64) -> Role {
        Role { state: ServerState::Follower, voter: true, term, last: log_id(term, last) }
    }

    /// Node 1's election, started at `t0`, its first timeout drawn as 280 ms.
    fn election(t0: Instant) -> Election {
        let mut election = Election::new(1, t0, LEASE, LOOK);
        election.start(ms(280));
        election
    }

    #[test]
    fn a_silent_leader_brings_a_pre_vote_after_a_lease_and_the_drawn_timeout_and_a_campaign_if_it_is_won() {
        let t0 = Instant::now();
        let mut e = election(t0);
        let role = follower(2, 40);
        let no_draw = || -> Duration { panic!("no try, no draw") };
        assert_eq!(e.tick(t0, role, no_draw), [Action::LookAt(t0 + LOOK)], "a node just started heard a leader");
        // Due at 580 ms (the lease and the timeout): the look before it wakes exactly then.
        assert_eq!(e.tick(t0 + ms(570), role, no_draw), [Action::LookAt(t0 + ms(580))]);
        let tried = e.tick(t0 + ms(580), role, || ms(290));
        let asked = PreVote { candidate: 1, term: 3, last_log_id: log_id(2, 40) };
        assert_eq!(tried, [Action::AskPreVotes(asked), Action::LookAt(t0 + ms(580) + LOOK)]);
        let won = e.pre_voted(t0 + ms(590), true, false);
        assert_eq!(won, [Action::Campaign { times: 1, why: Why::LeaderSilent(ms(580)) }]);
        // The next try waits for the new timeout (290 ms) after this one.
        assert_eq!(e.tick(t0 + ms(605), role, no_draw), [Action::LookAt(t0 + ms(630))]);
        assert_eq!(e.tick(t0 + ms(860), role, no_draw), [Action::LookAt(t0 + ms(870))]);
        let again = e.tick(t0 + ms(870), role, || ms(300));
        assert!(matches!(again[..], [Action::AskPreVotes(_), Action::LookAt(_)]), "{again:?}");
    }

    #[test]
    fn a_lost_pre_vote_or_a_leader_or_a_vote_granted_meanwhile_means_no_campaign() {
        let t0 = Instant::now();
        let role = follower(2, 40);
        let tried = |e: &mut Election| assert_eq!(e.tick(t0 + ms(580), role, || ms(280)).len(), 2);
        let mut lost = election(t0);
        tried(&mut lost);
        assert_eq!(lost.pre_voted(t0 + ms(590), false, false), []);

        let mut heard = election(t0);
        tried(&mut heard);
        heard.leader_call(t0 + ms(585));
        heard.leader_call_answered(t0 + ms(586));
        assert_eq!(heard.pre_voted(t0 + ms(590), true, false), [], "a leader spoke during the pre-vote");

        let mut voted = election(t0);
        tried(&mut voted);
        let candidate = Vote::new(3, 2);
        let granted = answer(true, candidate, log_id(2, 40));
        assert_eq!(voted.vote_answered(t0 + ms(585), role, &candidate, log_id(2, 41), &granted), []);
        assert_eq!(voted.pre_voted(t0 + ms(590), true, false), [], "it granted another candidate its vote");
        // The simulation's fault campaigns anyway.
        assert_eq!(voted.pre_voted(t0 + ms(590), true, true).len(), 1);
    }

    #[test]
    fn a_leader_a_learner_and_a_node_answering_a_leaders_call_never_try() {
        let t0 = Instant::now();
        let mut e = election(t0);
        let leader = Role { state: ServerState::Leader, ..follower(2, 40) };
        assert_eq!(e.tick(t0 + ms(5_000), leader, || unreachable!()), [Action::LookAt(t0 + ms(5_000) + LOOK)]);
        // Deposed, it waits as long as its followers did, from its last look as leader.
        assert_eq!(e.tick(t0 + ms(5_010), follower(3, 40), || unreachable!()), [Action::LookAt(t0 + ms(5_035))]);
        let learner = Role { voter: false, ..follower(2, 40) };
        assert_eq!(election(t0).tick(t0 + ms(9_000), learner, || unreachable!()), [Action::LookAt(t0 + ms(9_025))]);
        let mut installing = election(t0);
        installing.leader_call(t0 + ms(10));
        let role = follower(2, 40);
        assert_eq!(installing.tick(t0 + ms(9_000), role, || unreachable!()), [Action::LookAt(t0 + ms(9_025))]);
        assert_eq!(installing.leader(t0 + ms(9_000), Some(2)), Some(2), "a snapshot still installing");
        installing.leader_call_answered(t0 + ms(9_000));
        assert_eq!(installing.leader(t0 + ms(9_600), Some(2)), Some(2), "two leases after the answer");
        assert_eq!(installing.leader(t0 + ms(9_601), Some(2)), None, "silent for longer");
        assert_eq!(installing.leader(t0 + ms(9_601), Some(1)), Some(1), "this node itself");
    }

    #[test]
    fn a_pre_vote_from_a_node_behind_is_refused_with_one_campaign_per_candidate_term() {
        let t0 = Instant::now();
        let mut e = election(t0);
        let asked = PreVote { candidate: 2, term: 3, last_log_id: log_id(2, 39) };
        let role = follower(2, 40);
        // A leader heard within the lease: refused, nothing else.
        assert_eq!(e.pre_vote_asked(t0 + ms(100), role, &asked), (PreVoteAnswer { granted: false }, vec![]));
        // The leader gone: refused for the shorter log, and this node campaigns past the asker's term.
        let campaign = Action::Campaign { times: 2, why: Why::BehindCandidate };
        assert_eq!(e.pre_vote_asked(t0 + ms(400), role, &asked), (PreVoteAnswer { granted: false }, vec![campaign]));
        assert_eq!(e.pre_vote_asked(t0 + ms(410), role, &asked), (PreVoteAnswer { granted: false }, vec![]));
        // A log as long as this node's is granted.
        let even = PreVote { last_log_id: log_id(2, 40), ..asked };
        assert_eq!(e.pre_vote_asked(t0 + ms(420), role, &even), (PreVoteAnswer { granted: true }, vec![]));
    }

    #[test]
    fn a_leader_deposed_by_a_candidate_it_refused_campaigns_once_it_has_stepped_down() {
        let t0 = Instant::now();
        let mut e = election(t0);
        let leader = Role { state: ServerState::Leader, term: 3, voter: true, last: log_id_of(3, 1, 3854) };
        let candidate = Vote::new(4, 2);
        let refusal = answer(false, Vote::new_committed(3, 1), log_id_of(3, 1, 3854));
        let actions = e.vote_answered(t0 + ms(5), leader, &candidate, log_id(2, 3853), &refusal);
        assert_eq!(actions, [Action::CampaignOnceDeposed { candidate_term: 4 }]);
        // Once per candidate term; as a follower the same refusal is a campaign of its own.
        assert_eq!(e.vote_answered(t0 + ms(6), leader, &candidate, log_id(2, 3853), &refusal), []);
        let follower = Role { state: ServerState::Follower, ..leader };
        let later = Vote::new(5, 2);
        let actions = e.vote_answered(t0 + ms(7), follower, &later, log_id(2, 3853), &refusal);
        assert_eq!(actions, [Action::Campaign { times: 3, why: Why::Deposed }]);
    }
}
