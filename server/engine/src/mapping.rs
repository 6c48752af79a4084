//! Node ids renamed between two versions of a workflow (replay's and
//! MigrateRuns' `--map OLD=NEW`).

use std::collections::BTreeMap;

use crate::state::{NodeKey, RunRecord};

/// Node ids renamed from the recorded definition to the new one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeMapping(BTreeMap<String, String>);

impl NodeMapping {
    /// The mapping of these `(old, new)` pairs (a later pair for the same
    /// old id wins).
    pub fn from_pairs(pairs: impl IntoIterator<Item = (String, String)>) -> NodeMapping {
        NodeMapping(pairs.into_iter().collect())
    }

    /// Parses `OLD=NEW` pairs.
    pub fn parse<'a>(pairs: impl IntoIterator<Item = &'a str>) -> Result<NodeMapping, String> {
        let mut map = BTreeMap::new();
        for pair in pairs {
            let Some((from, to)) = pair.split_once('=') else {
                return Err(format!("{pair:?}: a mapping is OLD=NEW"));
            };
            let (from, to) = (from.trim(), to.trim());
            if from.is_empty() || to.is_empty() {
                return Err(format!("{pair:?}: both node ids are needed"));
            }
            if map.insert(from.to_owned(), to.to_owned()).is_some() {
                return Err(format!("{from:?} is mapped twice"));
            }
        }
        Ok(NodeMapping(map))
    }

    /// Whether it renames nothing.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The pairs, old id first.
    pub fn pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(a, b)| (a.as_str(), b.as_str()))
    }

    /// `id`'s new id (itself when not renamed).
    pub fn id<'a>(&'a self, id: &'a str) -> &'a str {
        self.0.get(id).map_or(id, String::as_str)
    }

    /// `key` under its new id (itself when not renamed).
    pub fn key(&self, key: &NodeKey) -> NodeKey {
        if key.is_map_inputs() {
            return NodeKey::map_inputs(self.id(key.node_id()), key.index.unwrap_or(0));
        }
        NodeKey {
            node: self.id(&key.node).to_owned(),
            index: key.index,
        }
    }

    pub(crate) fn old_id<'a>(&'a self, new: &'a str) -> &'a str {
        self.0
            .iter()
            .find(|(_, to)| to.as_str() == new)
            .map_or(new, |(from, _)| from.as_str())
    }

    /// `record` with its nodes renamed: the nodes to compensate, the one
    /// compensating, those that failed it, the one its error names.
    pub fn rename_record(&self, record: &mut RunRecord) {
        for id in &mut record.compensable {
            *id = self.id(id).to_owned();
        }
        for key in &mut record.failed {
            *key = self.key(key);
        }
        if let Some(compensation) = &mut record.compensation {
            for id in &mut compensation.remaining {
                *id = self.id(id).to_owned();
            }
            if let Some(current) = &mut compensation.current {
                *current = self.id(current).to_owned();
            }
        }
        if let Some(error) = &mut record.error
            && let Some(node) = &mut error.node
            && let Ok(key) = node.parse::<NodeKey>()
        {
            *node = self.key(&key).to_string();
        }
    }
}
