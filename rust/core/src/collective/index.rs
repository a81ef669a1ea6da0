//! The declared-plan index: an immutable snapshot behind an atomic pointer.
//!
//! Readers load the current snapshot without a lock (arc-swap) and probe its
//! hash table once; a rebuild makes a whole new snapshot and swaps it in, so
//! a reader sees the old declarations or the new ones, never a mix. Lookups
//! never insert: the index holds exactly the declared keys.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use arc_swap::cache::Cache;
use arc_swap::{ArcSwap, Guard};
use hashbrown::HashTable;

use super::key::{Norm, PlanKey};
use super::{fmt_tuple, Operation};

/// How many declarations an undeclared-plan message lists before it only counts.
pub const DECLARED_LISTED: usize = 16;

/// One declaration: its name (for messages), its key and what it maps to.
#[derive(Debug, Clone)]
pub struct Entry<P> {
    pub name: String,
    pub key: PlanKey,
    pub payload: P,
}

/// The declarations of one build, in declaration order, and a table from
/// each distinct key to its first declaration.
#[derive(Debug)]
pub struct Snapshot<P> {
    /// Each distinct key with the index of its first entry. The key is
    /// stored in the table itself so a probe compares it without first
    /// loading the entry (one dependent load less per lookup).
    table: HashTable<(PlanKey, usize)>,
    entries: Vec<Entry<P>>,
}

#[inline]
fn hash(key: &PlanKey) -> u64 {
    key.hash64()
}

impl<P> Snapshot<P> {
    /// Indexes `entries` in order; for equal keys the first declaration wins.
    pub fn new(entries: impl IntoIterator<Item = Entry<P>>) -> Self {
        let entries: Vec<Entry<P>> = entries.into_iter().collect();
        let mut table = HashTable::with_capacity(entries.len());
        for (i, entry) in entries.iter().enumerate() {
            let h = hash(&entry.key);
            if table.find(h, |(k, _): &(PlanKey, usize)| *k == entry.key).is_none() {
                table.insert_unique(h, (entry.key, i), |(k, _)| hash(k));
            }
        }
        Snapshot { table, entries }
    }

    pub fn empty() -> Self {
        Snapshot { table: HashTable::new(), entries: Vec::new() }
    }

    #[inline]
    fn position(&self, key: &PlanKey) -> Option<usize> {
        self.table.find(hash(key), |(k, _)| k == key).map(|&(_, i)| i)
    }

    /// The first declaration with exactly this key.
    #[inline]
    pub fn get(&self, key: &PlanKey) -> Option<&Entry<P>> {
        self.position(key).map(|i| &self.entries[i])
    }

    /// Number of distinct keys (what a lookup can find).
    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Every declaration in declaration order, shadowed duplicates included.
    pub fn entries(&self) -> &[Entry<P>] {
        &self.entries
    }

    /// The message of a lookup that found nothing: what was asked for, then
    /// at most `DECLARED_LISTED` declarations and how many there are. O(1) in
    /// the number of declarations beyond that bound.
    pub fn undeclared_message(
        &self,
        op: &str,
        operation: Operation,
        dtype: &dyn fmt::Display,
        shape: &[i64],
        strides: &[i64],
        norm: Option<Norm>,
    ) -> String {
        let mut msg = format!(
            "{op}: no declared plan for {operation} on shape {} {dtype} strides {}",
            fmt_tuple(shape),
            fmt_tuple(strides)
        );
        if let Some(norm) = norm.filter(|_| operation.is_fused()) {
            msg += &format!(" with norm weight id {:#x} epsilon {:?}", norm.weight, norm.epsilon());
        }
        if self.entries.is_empty() {
            msg += "; nothing is declared";
            return msg;
        }
        let n = self.entries.len();
        let listed: Vec<String> = self
            .entries
            .iter()
            .take(DECLARED_LISTED)
            .map(|e| format!("'{}' {}", e.name, e.key))
            .collect();
        msg += &format!("; declared ({n}): {}", listed.join(", "));
        if n > DECLARED_LISTED {
            msg += &format!(", ... and {} more", n - DECLARED_LISTED);
        }
        msg
    }
}

/// A found declaration; keeps its snapshot alive while it is held.
pub struct Hit<P> {
    snapshot: Guard<Arc<Snapshot<P>>>,
    index: usize,
}

impl<P> Deref for Hit<P> {
    type Target = Entry<P>;

    fn deref(&self) -> &Entry<P> {
        &self.snapshot.entries[self.index]
    }
}

/// Declared plans by exact key, readable from any number of threads while
/// another rebuilds it.
pub struct DeclaredPlanIndex<P> {
    current: ArcSwap<Snapshot<P>>,
}

impl<P> Default for DeclaredPlanIndex<P> {
    fn default() -> Self {
        DeclaredPlanIndex { current: ArcSwap::from_pointee(Snapshot::empty()) }
    }
}

impl<P> DeclaredPlanIndex<P> {
    pub fn new(entries: impl IntoIterator<Item = Entry<P>>) -> Self {
        DeclaredPlanIndex { current: ArcSwap::from_pointee(Snapshot::new(entries)) }
    }

    /// Replaces every declaration at once (first equal key wins).
    pub fn rebuild(&self, entries: impl IntoIterator<Item = Entry<P>>) {
        self.current.store(Arc::new(Snapshot::new(entries)));
    }

    /// Empties the index; the old payloads drop when the last reader lets go.
    pub fn clear(&self) {
        self.current.store(Arc::new(Snapshot::empty()));
    }

    /// The current snapshot (lock-free). Every read through it sees the same declarations.
    pub fn load(&self) -> Guard<Arc<Snapshot<P>>> {
        self.current.load()
    }

    #[inline]
    pub fn lookup(&self, key: &PlanKey) -> Option<Hit<P>> {
        let snapshot = self.current.load();
        let index = snapshot.position(key)?;
        Some(Hit { snapshot, index })
    }

    #[inline]
    pub fn contains(&self, key: &PlanKey) -> bool {
        self.current.load().position(key).is_some()
    }

    /// Number of distinct declared keys.
    pub fn len(&self) -> usize {
        self.current.load().len()
    }

    pub fn is_empty(&self) -> bool {
        self.current.load().is_empty()
    }

    /// A reader for one thread's hot loop: it keeps the snapshot it last saw
    /// and only reloads after a rebuild (one pointer compare per lookup, no
    /// read-side fence). It holds that snapshot, and so its payloads, until
    /// its next lookup or until it is dropped.
    pub fn reader(&self) -> Reader<'_, P> {
        Reader { cache: Cache::new(&self.current) }
    }
}

/// See [`DeclaredPlanIndex::reader`].
pub struct Reader<'a, P> {
    cache: Cache<&'a ArcSwap<Snapshot<P>>, Arc<Snapshot<P>>>,
}

impl<P> Reader<'_, P> {
    /// The declaration of `key` in the current snapshot, if any.
    #[inline]
    pub fn lookup(&mut self, key: &PlanKey) -> Option<&Entry<P>> {
        let snapshot = self.cache.load();
        snapshot.position(key).map(|i| &snapshot.entries[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::DType;

    #[test]
    fn a_reader_sees_rebuilds_and_clears() {
        let index = DeclaredPlanIndex::new([entry("a", key(4), 1)]);
        let mut reader = index.reader();
        assert_eq!(reader.lookup(&key(4)).map(|e| e.payload), Some(1));
        assert!(reader.lookup(&key(5)).is_none());
        index.rebuild([entry("b", key(5), 2), entry("c", key(5), 3)]);
        assert!(reader.lookup(&key(4)).is_none());
        assert_eq!(reader.lookup(&key(5)).map(|e| e.payload), Some(2)); // first wins
        index.clear();
        assert!(reader.lookup(&key(5)).is_none());
    }

    fn key(rows: i64) -> PlanKey {
        PlanKey::new(Operation::AllReduce, DType::BF16, &[rows, 16], &[16, 1], None).unwrap()
    }

    fn entry(name: &str, key: PlanKey, payload: u32) -> Entry<u32> {
        Entry { name: name.into(), key, payload }
    }

    #[test]
    fn finds_exactly_the_declared_keys() {
        let index =
            DeclaredPlanIndex::new((1..=64).map(|r| entry(&r.to_string(), key(r), r as u32)));
        assert_eq!(index.len(), 64);
        for r in 1..=64 {
            let hit = index.lookup(&key(r)).expect("declared");
            assert_eq!(hit.payload, r as u32);
            assert_eq!(hit.name, r.to_string());
        }
        assert!(index.lookup(&key(65)).is_none());
        assert!(!index.contains(&key(0x7fff)));
    }

    #[test]
    fn first_equal_key_wins() {
        let index = DeclaredPlanIndex::new([
            entry("first", key(2), 1),
            entry("other", key(3), 2),
            entry("equivalent", key(2), 3),
        ]);
        assert_eq!(index.len(), 2);
        assert_eq!(index.lookup(&key(2)).unwrap().payload, 1);
        assert_eq!(index.load().entries().len(), 3);
    }

    #[test]
    fn lookups_never_insert() {
        let index = DeclaredPlanIndex::new([entry("a", key(1), 1)]);
        for r in 2..1000 {
            assert!(index.lookup(&key(r)).is_none());
        }
        assert_eq!(index.len(), 1);
        assert_eq!(index.load().entries().len(), 1);
    }

    #[test]
    fn rebuild_and_clear_replace_the_whole_snapshot() {
        let index = DeclaredPlanIndex::new([entry("a", key(1), 1), entry("b", key(2), 2)]);
        let before = index.load();
        index.rebuild([entry("c", key(3), 3)]);
        // a snapshot taken before the rebuild still reads the old declarations
        assert_eq!(before.get(&key(1)).unwrap().payload, 1);
        assert!(before.get(&key(3)).is_none());
        assert!(index.lookup(&key(1)).is_none());
        assert_eq!(index.lookup(&key(3)).unwrap().payload, 3);
        index.clear();
        assert!(index.is_empty());
        assert!(index.lookup(&key(3)).is_none());
    }

    #[test]
    fn undeclared_message_is_bounded() {
        let index = DeclaredPlanIndex::new((1..=40).map(|r| entry(&r.to_string(), key(r), 0)));
        let m = index.load().undeclared_message(
            "plan_for",
            Operation::AllReduce,
            &DType::BF16,
            &[41, 16],
            &[16, 1],
            None,
        );
        assert!(m.starts_with(
            "plan_for: no declared plan for all_reduce on shape (41, 16) bfloat16 strides (16, 1); \
             declared (40): '1' all_reduce(1, 16) bfloat16 strides (0, 1), '2' all_reduce(2, 16)"
        ));
        assert!(m.contains("'16' all_reduce(16, 16)"), "{m}");
        assert!(!m.contains("'17'"), "{m}");
        assert!(m.ends_with(", ... and 24 more"), "{m}");

        let empty: Snapshot<u32> = Snapshot::empty();
        let m = empty.undeclared_message(
            "plan_for",
            Operation::AllReduceFusedAddRmsNorm,
            &DType::F16,
            &[4],
            &[1],
            Some(Norm::new(0xabc, 1e-5)),
        );
        assert_eq!(
            m,
            "plan_for: no declared plan for all_reduce_fused_add_rms_norm on shape (4,) float16 \
             strides (1,) with norm weight id 0xabc epsilon 1e-5; nothing is declared"
        );
    }
}
