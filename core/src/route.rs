//! Which stream claims a subject, without scanning every stream's filters: a tree of the filters' tokens, walked
//! once per publish along the subject's tokens (a literal token, `*` for any one token, `>` for the rest). Streams'
//! filters never overlap (the cell refuses a stream that would), so at most one stream matches.
//!
//! A tenant's scope token (`@acme`, see [`crate::subject`]) is matched only literally: the root's wildcards do not
//! claim it.
//!
//! Derived from the streams' configs: never encoded, rebuilt after a snapshot is decoded.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::subject::is_scoped;

/// A filter that ends at a node, and the stream that claims it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Claim {
    stream: Arc<str>,
    filter: Arc<str>,
}

/// A tree node: the filters that continue with each token.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Node {
    literal: BTreeMap<Box<str>, Node>,
    any: Option<Box<Node>>,
    /// A filter ends here with `>`: its stream claims every longer subject.
    rest: Option<Claim>,
    /// A filter ends here: its stream claims the subject that ends here.
    end: Option<Claim>,
}

impl Node {
    fn is_empty(&self) -> bool {
        self.literal.is_empty() && self.any.is_none() && self.rest.is_none() && self.end.is_none()
    }

    fn children(&self) -> impl Iterator<Item = &Node> {
        self.literal.values().chain(self.any.as_deref())
    }

    /// The claim on the subject whose remaining tokens are `tokens` (an iterator, so a publish allocates nothing).
    fn find<'a>(&'a self, mut tokens: std::str::Split<'_, char>, top: bool) -> Option<&'a Claim> {
        let Some(first) = tokens.next() else { return self.end.as_ref() };
        if let Some(child) = self.literal.get(first)
            && let Some(found) = child.find(tokens.clone(), false)
        {
            return Some(found);
        }
        if top && is_scoped(first) {
            return None;
        }
        if let Some(child) = &self.any
            && let Some(found) = child.find(tokens, false)
        {
            return Some(found);
        }
        self.rest.as_ref()
    }

    /// The children a wildcard at this node reaches: at the top, not the tenants' scope tokens.
    fn wild_children(&self, top: bool) -> impl Iterator<Item = &Node> {
        let literal = self.literal.iter().filter(move |(token, _)| !(top && is_scoped(token))).map(|(_, child)| child);
        literal.chain(self.any.as_deref())
    }

    /// Every claim in this subtree.
    fn every<'a>(&'a self, out: &mut Vec<&'a Claim>) {
        out.extend(self.rest.iter().chain(self.end.iter()));
        self.children().for_each(|child| child.every(out));
    }

    /// The claims below this node whose filters overlap `tokens` (some subject matches both).
    fn overlapping<'a>(&'a self, tokens: &[&str], out: &mut Vec<&'a Claim>, top: bool) {
        match tokens.split_first() {
            None => out.extend(self.end.iter()),
            Some((&">", [])) => {
                out.extend(self.rest.iter());
                self.wild_children(top).for_each(|child| child.every(out));
            }
            Some((&"*", rest)) => {
                out.extend(self.rest.iter());
                self.wild_children(top).for_each(|child| child.overlapping(rest, out, false));
            }
            Some((token, rest)) if top && is_scoped(token) => {
                if let Some(child) = self.literal.get(*token) {
                    child.overlapping(rest, out, false);
                }
            }
            Some((token, rest)) => {
                out.extend(self.rest.iter());
                if let Some(child) = self.literal.get(*token) {
                    child.overlapping(rest, out, false);
                }
                if let Some(child) = &self.any {
                    child.overlapping(rest, out, false);
                }
            }
        }
    }

    /// Removes `tokens`' filter below this node; true when this node is left empty.
    fn remove(&mut self, tokens: &[&str]) -> bool {
        match tokens.split_first() {
            None => self.end = None,
            Some((&">", [])) => self.rest = None,
            Some((&"*", rest)) => {
                if let Some(child) = &mut self.any
                    && child.remove(rest)
                {
                    self.any = None;
                }
            }
            Some((token, rest)) => {
                if let Some(child) = self.literal.get_mut(*token)
                    && child.remove(rest)
                {
                    self.literal.remove(*token);
                }
            }
        }
        self.is_empty()
    }
}

/// The streams' filters, for routing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Router {
    root: Node,
}

impl Router {
    /// `stream` claims the subjects `filter` matches. The filter is valid and overlaps no other stream's.
    pub fn insert(&mut self, filter: &str, stream: &Arc<str>) {
        let claim = Claim { stream: stream.clone(), filter: Arc::from(filter) };
        let mut node = &mut self.root;
        let tokens: Vec<&str> = filter.split('.').collect();
        for (index, token) in tokens.iter().enumerate() {
            match *token {
                ">" if index + 1 == tokens.len() => {
                    node.rest = Some(claim);
                    return;
                }
                "*" => node = node.any.get_or_insert_with(Box::default),
                token => node = node.literal.entry(Box::from(token)).or_default(),
            }
        }
        node.end = Some(claim);
    }

    /// No stream claims what `filter` matched any more.
    pub fn remove(&mut self, filter: &str) {
        let tokens: Vec<&str> = filter.split('.').collect();
        self.root.remove(&tokens);
    }

    /// The stream claiming `subject` (a valid subject, no wildcards), if any.
    #[inline]
    pub fn route(&self, subject: &str) -> Option<&Arc<str>> {
        self.root.find(subject.split('.'), true).map(|claim| &claim.stream)
    }

    /// Every (stream, filter) claimed whose filter overlaps `filter` (a valid filter): some subject matches both.
    pub fn overlapping(&self, filter: &str) -> Vec<(&Arc<str>, &Arc<str>)> {
        let tokens: Vec<&str> = filter.split('.').collect();
        let mut out = Vec::new();
        self.root.overlapping(&tokens, &mut out, true);
        out.into_iter().map(|claim| (&claim.stream, &claim.filter)).collect()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::subject::{filter_matches, filters_overlap};

    fn token() -> impl Strategy<Value = String> {
        prop_oneof![Just("a"), Just("b"), Just("c")].prop_map(String::from)
    }

    /// A first token: now and then a tenant's scope token.
    fn first_token() -> impl Strategy<Value = String> {
        prop_oneof![6 => token(), 1 => Just("@t".to_string()), 1 => Just("@u".to_string())]
    }

    fn filter() -> impl Strategy<Value = String> {
        let part = || prop_oneof![4 => token(), 1 => Just("*".to_string())];
        let first = prop_oneof![4 => first_token(), 1 => Just("*".to_string())];
        (first, prop::collection::vec(part(), 0..3), any::<bool>()).prop_map(|(first, more, rest)| {
            let mut parts = vec![first];
            parts.extend(more);
            if rest {
                parts.push(">".to_string());
            }
            parts.join(".")
        })
    }

    fn subject() -> impl Strategy<Value = String> {
        (first_token(), prop::collection::vec(token(), 0..5)).prop_map(|(first, more)| {
            let mut parts = vec![first];
            parts.extend(more);
            parts.join(".")
        })
    }

    /// A router of those of `filters` that overlap none before them, each its own stream, and what it claims.
    fn claim(filters: Vec<String>) -> (Router, Vec<(String, Arc<str>)>) {
        let mut router = Router::default();
        let mut claimed: Vec<(String, Arc<str>)> = Vec::new();
        for (n, filter) in filters.into_iter().enumerate() {
            if claimed.iter().any(|(other, _)| filters_overlap(other, &filter)) {
                continue;
            }
            let stream: Arc<str> = Arc::from(format!("s{n}"));
            router.insert(&filter, &stream);
            claimed.push((filter, stream));
        }
        (router, claimed)
    }

    proptest! {
        /// The tree answers what scanning every filter answers, as streams come and go.
        #[test]
        fn routes_as_a_scan_of_every_filter_would(
            filters in prop::collection::vec(filter(), 1..12),
            removed in prop::collection::vec(any::<prop::sample::Index>(), 0..4),
            subjects in prop::collection::vec(subject(), 1..20),
        ) {
            let (mut router, mut claimed) = claim(filters);
            for index in removed {
                if claimed.is_empty() {
                    break;
                }
                let (filter, _) = claimed.remove(index.index(claimed.len()));
                router.remove(&filter);
            }
            for subject in subjects {
                let scanned = claimed.iter().find(|(filter, _)| filter_matches(filter, &subject)).map(|(_, s)| s);
                prop_assert_eq!(router.route(&subject), scanned, "subject {}", subject);
            }
        }

        /// The tree finds every claimed filter that overlaps a new one, as comparing it with each would.
        #[test]
        fn finds_every_overlapping_filter_as_a_scan_would(
            filters in prop::collection::vec(filter(), 1..12),
            probes in prop::collection::vec(filter(), 1..12),
        ) {
            let (router, claimed) = claim(filters);
            for probe in probes {
                let mut found: Vec<(String, String)> =
                    router.overlapping(&probe).into_iter().map(|(s, f)| (s.to_string(), f.to_string())).collect();
                let mut scanned: Vec<(String, String)> = claimed
                    .iter()
                    .filter(|(filter, _)| filters_overlap(filter, &probe))
                    .map(|(filter, stream)| (stream.to_string(), filter.clone()))
                    .collect();
                found.sort();
                scanned.sort();
                prop_assert_eq!(found, scanned, "probe {}", probe);
            }
        }
    }

    #[test]
    fn a_removed_filter_leaves_no_empty_branch() {
        let mut router = Router::default();
        let orders: Arc<str> = Arc::from("orders");
        router.insert("orders.*.eu", &orders);
        router.insert("orders.>", &Arc::from("all"));
        router.remove("orders.*.eu");
        router.remove("orders.>");
        assert_eq!(router, Router::default());
    }
}
