//! References to payloads kept in the blob store (docs/payloads.md).
//!
//! A value larger than the server's offload threshold is stored apart and
//! carried as `{"$blob": {"sha256": ..., "size": ..., "head": ...}}`. The
//! engine never reads a blob itself: when an expression looks inside a
//! reference whose value it was not given, [`decide`](crate::decide) asks
//! for it with [`DecideError::NeedBlobs`](crate::DecideError::NeedBlobs),
//! as it asks for node states it has not loaded.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value as Json, json};

/// The one key of a reference object.
pub const BLOB_KEY: &str = "$blob";

/// The values of the blobs a decision may read, by SHA-256 (hex).
pub type BlobValues = BTreeMap<String, Arc<Json>>;

/// The digest `value` refers to, when it is a reference: an object whose
/// only key is `$blob`, holding a `sha256` string.
pub fn reference_digest(value: &Json) -> Option<&str> {
    let Json::Object(map) = value else {
        return None;
    };
    if map.len() != 1 {
        return None;
    }
    map.get(BLOB_KEY)?.get("sha256")?.as_str()
}

/// Whether `value` is or holds a `$blob` object anywhere (well formed or
/// not: the server checks that what it accepts is well formed).
pub fn holds_references(value: &Json) -> bool {
    match value {
        Json::Object(map) => {
            (map.len() == 1 && map.contains_key(BLOB_KEY)) || map.values().any(holds_references)
        }
        Json::Array(items) => items.iter().any(holds_references),
        _ => false,
    }
}

/// Every `$blob` object in `value`, in document order (repeats included).
pub fn references(value: &Json) -> Vec<&Json> {
    fn walk<'v>(value: &'v Json, out: &mut Vec<&'v Json>) {
        match value {
            Json::Object(map) if map.len() == 1 && map.contains_key(BLOB_KEY) => out.push(value),
            Json::Object(map) => map.values().for_each(|v| walk(v, out)),
            Json::Array(items) => items.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(value, &mut out);
    out
}

/// A reference to the blob `sha256` of `size` bytes beginning with `head`.
pub fn reference(sha256: &str, size: u64, head: &str) -> Json {
    json!({ BLOB_KEY: { "sha256": sha256, "size": size, "head": head } })
}

/// `value` with every reference replaced by its value from `blobs`; the
/// digests `blobs` lacks are added to `missing` (their references become
/// null meanwhile).
pub fn substitute(value: &Json, blobs: &BlobValues, missing: &mut Vec<String>) -> Json {
    if let Some(digest) = reference_digest(value) {
        return match blobs.get(digest) {
            Some(found) => Json::clone(found),
            None => {
                if !missing.iter().any(|d| d == digest) {
                    missing.push(digest.to_owned());
                }
                Json::Null
            }
        };
    }
    match value {
        Json::Object(map) => Json::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), substitute(v, blobs, missing)))
                .collect(),
        ),
        Json::Array(items) => Json::Array(
            items
                .iter()
                .map(|v| substitute(v, blobs, missing))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    #[test]
    fn a_reference_is_an_object_with_the_one_key_blob() {
        let reference = reference(DIGEST, 3, "abc");
        assert_eq!(reference_digest(&reference), Some(DIGEST));
        assert_eq!(
            reference_digest(&json!({"$blob": {"sha256": DIGEST}, "x": 1})),
            None
        );
        assert_eq!(reference_digest(&json!({"sha256": DIGEST})), None);
        assert!(holds_references(&json!({"a": [1, {"b": reference}]})));
        assert!(!holds_references(&json!({"a": [1, {"b": 2}]})));
    }

    #[test]
    fn substitution_replaces_references_at_any_depth_and_names_what_it_lacks() {
        let other = "0".repeat(64);
        let value = json!({"doc": reference(DIGEST, 9, ""), "rest": [reference(&other, 1, "")]});
        let mut blobs = BlobValues::new();
        blobs.insert(DIGEST.to_owned(), Arc::new(json!({"text": "hi"})));
        let mut missing = Vec::new();
        let resolved = substitute(&value, &blobs, &mut missing);
        assert_eq!(resolved, json!({"doc": {"text": "hi"}, "rest": [null]}));
        assert_eq!(missing, vec![other]);
        assert_eq!(references(&value).len(), 2);
    }
}
