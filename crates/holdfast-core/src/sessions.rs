//! [`Sessions`]: the open sessions by id, and which of them the last command changed.

use std::fmt;
use std::sync::Arc;

use imbl::OrdMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::command::SessionId;

/// The open sessions in id order, each behind an [`Arc`], in a persistent B-tree whose nodes copies of the
/// state share ([`Clone`] takes the same short time whatever their number); a session is copied only when
/// it changes while a copy shares it ([`Sessions::get_mut`]).
///
/// Every change goes through [`Sessions::insert`], [`Sessions::get_mut`] or [`Sessions::remove`], and each
/// notes the session's id: [`Sessions::changed`] names every session the last command opened, closed or
/// changed. A node keeps a session's counts of holds and waits beside its deadline from them, so that a
/// heartbeat's answer looks nothing up in this tree: a look here goes down four or five levels of nodes,
/// most of them cache misses once the state outgrows the cache, and was 15-16 % of the leader's CPU at
/// 100,000 sessions (docs/perf-notes/2026-12-07-a-heartbeat-without-a-lookup.md).
pub(crate) struct Sessions<S> {
    by_id: OrdMap<SessionId, Arc<S>>,
    /// Sessions changed since [`Sessions::forget_changes`], perhaps more than once each. Not part of the
    /// state: neither compared, copied nor encoded.
    changed: Vec<SessionId>,
}

impl<S> Default for Sessions<S> {
    fn default() -> Self {
        Sessions { by_id: OrdMap::new(), changed: Vec::new() }
    }
}

impl<S> Clone for Sessions<S> {
    fn clone(&self) -> Self {
        Sessions { by_id: self.by_id.clone(), changed: Vec::new() }
    }
}

impl<S: PartialEq> PartialEq for Sessions<S> {
    fn eq(&self, other: &Self) -> bool {
        self.by_id == other.by_id
    }
}

impl<S: Eq> Eq for Sessions<S> {}

impl<S: Clone> Sessions<S> {
    pub fn get(&self, id: &SessionId) -> Option<&Arc<S>> {
        self.by_id.get(id)
    }

    /// Session `id`, to change: copied first if a copy of the state (a snapshot's) shares it.
    pub fn get_mut(&mut self, id: &SessionId) -> Option<&mut S> {
        let session = self.by_id.get_mut(id)?;
        self.changed.push(*id);
        Some(Arc::make_mut(session))
    }

    pub fn contains_key(&self, id: &SessionId) -> bool {
        self.by_id.contains_key(id)
    }

    pub fn insert(&mut self, id: SessionId, session: Arc<S>) {
        self.changed.push(id);
        self.by_id.insert(id, session);
    }

    pub fn remove(&mut self, id: &SessionId) -> Option<Arc<S>> {
        let session = self.by_id.remove(id)?;
        self.changed.push(*id);
        Some(session)
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Every session, in id order.
    pub fn iter(&self) -> impl Iterator<Item = (&SessionId, &Arc<S>)> + '_ {
        self.by_id.iter()
    }

    pub fn values(&self) -> impl Iterator<Item = &Arc<S>> + '_ {
        self.by_id.values()
    }

    /// The sessions opened, closed or changed since [`Sessions::forget_changes`], some perhaps twice.
    pub fn changed(&self) -> &[SessionId] {
        &self.changed
    }

    pub fn forget_changes(&mut self) {
        self.changed.clear();
    }
}

impl<S: Clone> FromIterator<(SessionId, Arc<S>)> for Sessions<S> {
    fn from_iter<I: IntoIterator<Item = (SessionId, Arc<S>)>>(entries: I) -> Self {
        Sessions { by_id: entries.into_iter().collect(), changed: Vec::new() }
    }
}

impl<S: fmt::Debug> fmt::Debug for Sessions<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.by_id.fmt(f)
    }
}

/// A map in id order, as the ordered map kept before it.
impl<S: Serialize> Serialize for Sessions<S> {
    fn serialize<Z: Serializer>(&self, serializer: Z) -> Result<Z::Ok, Z::Error> {
        self.by_id.serialize(serializer)
    }
}

impl<'de, S: Deserialize<'de> + Clone> Deserialize<'de> for Sessions<S> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let by_id = crate::state::ordered::deserialize(deserializer)?;
        Ok(Sessions { by_id, changed: Vec::new() })
    }
}
