//! The values of blobs expressions read, kept by bytes: the oldest go
//! first when the cache is full.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use serde_json::Value as Json;

type Key = (String, String);

/// Blob values by namespace and digest, at most `capacity` bytes of them
/// (counted as the size of their JSON).
pub(crate) struct BlobCache {
    capacity: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    values: HashMap<Key, (Arc<Json>, usize)>,
    order: VecDeque<Key>,
    bytes: usize,
}

impl BlobCache {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            capacity,
            inner: Mutex::default(),
        }
    }

    pub(crate) fn get(&self, namespace: &str, sha256: &str) -> Option<Arc<Json>> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner
            .values
            .get(&(namespace.to_owned(), sha256.to_owned()))
            .map(|(value, _)| Arc::clone(value))
    }

    pub(crate) fn put(&self, namespace: &str, sha256: &str, value: Arc<Json>, size: usize) {
        if size > self.capacity {
            return;
        }
        let key = (namespace.to_owned(), sha256.to_owned());
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.values.contains_key(&key) {
            return;
        }
        while inner.bytes + size > self.capacity {
            let Some(oldest) = inner.order.pop_front() else {
                break;
            };
            if let Some((_, gone)) = inner.values.remove(&oldest) {
                inner.bytes -= gone;
            }
        }
        inner.bytes += size;
        inner.order.push_back(key.clone());
        inner.values.insert(key, (value, size));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_values_go_when_the_cache_is_full() {
        let cache = BlobCache::new(100);
        cache.put("ns", "a", Arc::new(Json::from(1)), 60);
        cache.put("ns", "b", Arc::new(Json::from(2)), 30);
        cache.put("ns", "c", Arc::new(Json::from(3)), 30);
        assert!(cache.get("ns", "a").is_none());
        assert_eq!(cache.get("ns", "b").as_deref(), Some(&Json::from(2)));
        assert!(cache.get("other", "b").is_none(), "keyed by namespace");
        cache.put("ns", "huge", Arc::new(Json::Null), 101);
        assert!(cache.get("ns", "huge").is_none());
    }
}
