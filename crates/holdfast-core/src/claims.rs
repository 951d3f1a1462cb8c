//! [`Claims`]: the names of the locks a session holds or waits for.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A set of lock names, kept as a sorted list. Every open session has one on every replica, and most hold
/// one lock or a few: a `BTreeSet`'s first node was about 280 bytes a session, a list's is the names' 24
/// bytes each. At most [`limits::CLAIMS_PER_SESSION_MAX`](crate::limits::CLAIMS_PER_SESSION_MAX) names, so
/// a change moves at most that many. Encoded as a `BTreeSet<String>` is (a sequence of the names in order),
/// so snapshots read and write the same bytes as before.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Claims(Vec<String>);

impl Claims {
    /// Adds `name`; false if it was there already.
    pub(crate) fn insert(&mut self, name: String) -> bool {
        match self.0.binary_search(&name) {
            Ok(_) => false,
            Err(i) => {
                // Room for one at first: a list's first growth makes room for four, where most sessions hold one.
                if self.0.is_empty() {
                    self.0.reserve_exact(1);
                }
                self.0.insert(i, name);
                true
            }
        }
    }

    /// Removes `name`; false if it was not there.
    pub(crate) fn remove(&mut self, name: &str) -> bool {
        match self.0.binary_search_by(|n| n.as_str().cmp(name)) {
            Ok(i) => {
                self.0.remove(i);
                true
            }
            Err(_) => false,
        }
    }

    pub(crate) fn contains(&self, name: &str) -> bool {
        self.0.binary_search_by(|n| n.as_str().cmp(name)).is_ok()
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// The names in order.
    pub(crate) fn iter(&self) -> std::slice::Iter<'_, String> {
        self.0.iter()
    }
}

impl<'a> IntoIterator for &'a Claims {
    type Item = &'a String;
    type IntoIter = std::slice::Iter<'a, String>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl FromIterator<String> for Claims {
    fn from_iter<I: IntoIterator<Item = String>>(names: I) -> Self {
        let mut names: Vec<String> = names.into_iter().collect();
        names.sort_unstable();
        names.dedup();
        Claims(names)
    }
}

impl Serialize for Claims {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(&self.0)
    }
}

impl<'de> Deserialize<'de> for Claims {
    /// As a `BTreeSet<String>` decodes: any order, a repeated name once.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(Vec::<String>::deserialize(deserializer)?.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::Claims;

    #[test]
    fn claims_keep_a_set_of_names_in_order() {
        let mut claims = Claims::default();
        assert!(claims.insert("b".into()));
        assert!(claims.insert("a".into()));
        assert!(!claims.insert("b".into()), "a name once");
        assert!(claims.contains("a") && claims.contains("b") && !claims.contains("c"));
        assert_eq!(claims.iter().collect::<Vec<_>>(), ["a", "b"]);
        assert!(claims.remove("a"));
        assert!(!claims.remove("a"));
        assert_eq!(claims.len(), 1);
    }

    #[test]
    fn claims_encode_as_a_set_of_names_does() {
        let names: BTreeSet<String> = ["job", "a", "zz"].into_iter().map(String::from).collect();
        let claims: Claims = ["zz", "job", "a", "job"].into_iter().map(String::from).collect();
        let encoded = bincode::serialize(&names).expect("encodes");
        assert_eq!(bincode::serialize(&claims).expect("encodes"), encoded);
        let decoded: Claims = bincode::deserialize(&encoded).expect("decodes");
        assert_eq!(decoded, claims);
        // A set encoded out of order (not one this crate writes) still decodes as the set.
        let shuffled = bincode::serialize(&vec!["zz", "a", "job", "a"]).expect("encodes");
        assert_eq!(bincode::deserialize::<Claims>(&shuffled).expect("decodes"), claims);
    }
}
