//! A lock-free interning cache: readers take one atomic snapshot load and a
//! hash probe; writers clone the map and swap it in under a mutex.
//!
//! Meant for small, write-rarely maps (plans keyed by bucketed caps): a hit
//! never takes a lock, and a miss costs a map clone, which is cheap next to
//! building what is being cached. Nothing is cached on a failed build.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use rustc_hash::FxBuildHasher;

type Map<K, V> = HashMap<K, Arc<V>, FxBuildHasher>;

pub struct InternCache<K, V> {
    snapshot: ArcSwap<Map<K, V>>,
    writer: Mutex<()>,
}

impl<K: Hash + Eq + Clone, V> Default for InternCache<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Hash + Eq + Clone, V> InternCache<K, V> {
    pub fn new() -> Self {
        InternCache { snapshot: ArcSwap::from_pointee(Map::default()), writer: Mutex::new(()) }
    }

    /// Runs `f` on the cached value, without cloning the `Arc`.
    #[inline]
    pub fn with<R>(&self, key: &K, f: impl FnOnce(&V) -> R) -> Option<R> {
        self.snapshot.load().get(key).map(|v| f(v))
    }

    #[inline]
    pub fn get(&self, key: &K) -> Option<Arc<V>> {
        self.snapshot.load().get(key).cloned()
    }

    /// Inserts `value` unless another writer got there first; returns the
    /// value that is cached now, so every caller sees one instance per key.
    pub fn insert_if_absent(&self, key: K, value: V) -> Arc<V> {
        let _guard = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let current = self.snapshot.load_full();
        if let Some(existing) = current.get(&key) {
            return existing.clone();
        }
        let value = Arc::new(value);
        let mut next = Map::clone(&current);
        next.insert(key, value.clone());
        self.snapshot.store(Arc::new(next));
        value
    }

    /// The cached value for `key`, building it (outside the lock) on a miss.
    pub fn get_or_try_insert<E>(
        &self,
        key: &K,
        build: impl FnOnce() -> Result<V, E>,
    ) -> Result<Arc<V>, E> {
        if let Some(v) = self.get(key) {
            return Ok(v);
        }
        let value = build()?;
        Ok(self.insert_if_absent(key.clone(), value))
    }

    pub fn len(&self) -> usize {
        self.snapshot.load().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every entry (values live on while someone holds them).
    pub fn clear(&self) {
        let _guard = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        self.snapshot.store(Arc::new(Map::default()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn equal_keys_give_one_instance() {
        let c: InternCache<u32, String> = InternCache::new();
        let a = c.get_or_try_insert(&1, || Ok::<_, ()>("one".to_string())).unwrap();
        let b = c.get_or_try_insert(&1, || Ok::<_, ()>("other".to_string())).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(*b, "one");
        assert_eq!(c.with(&1, |v| v.len()), Some(3));
        assert_eq!(c.len(), 1);
        c.clear();
        assert!(c.is_empty() && c.get(&1).is_none());
        assert_eq!(*a, "one"); // holders keep their value
    }

    #[test]
    fn failed_builds_are_not_cached() {
        let c: InternCache<u32, u32> = InternCache::new();
        assert_eq!(c.get_or_try_insert(&7, || Err("no")), Err("no"));
        assert!(c.is_empty());
        assert_eq!(*c.get_or_try_insert(&7, || Ok::<_, ()>(49)).unwrap(), 49);
    }

    #[test]
    fn racing_writers_agree_on_one_instance_per_key() {
        let c: Arc<InternCache<u32, usize>> = Arc::new(InternCache::new());
        let builds = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..8)
            .map(|t| {
                let (c, builds) = (c.clone(), builds.clone());
                std::thread::spawn(move || {
                    (0..64u32)
                        .map(|k| {
                            let v = c
                                .get_or_try_insert(&k, || {
                                    builds.fetch_add(1, Ordering::Relaxed);
                                    Ok::<_, ()>(t)
                                })
                                .unwrap();
                            Arc::as_ptr(&v) as usize
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let seen: Vec<Vec<usize>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        for row in &seen[1..] {
            assert_eq!(row, &seen[0]);
        }
        assert_eq!(c.len(), 64);
        assert!(builds.load(Ordering::Relaxed) >= 64);
    }
}
