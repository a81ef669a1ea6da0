//! Readers running while the declared-plan index is rebuilt over and over
//! see one whole snapshot per load: every key of generation g maps to
//! payload g, generation g declares exactly its own keys, and a reader never
//! goes back to an older generation.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;

use b12x_core::collective::{DeclaredPlanIndex, Entry, Operation, PlanKey};
use b12x_core::DType;

const KEYS: i64 = 64;
const GENERATIONS: u64 = 2_000;
const READERS: usize = 3;

fn key(rows: i64) -> PlanKey {
    PlanKey::new(Operation::AllReduce, DType::BF16, &[rows, 16], &[16, 1], None).unwrap()
}

/// The first row generation g declares; rows 1 ..= first-1 belong to older ones.
fn first_row(g: u64) -> i64 {
    g as i64 + 2
}

/// Generation g declares rows first_row(g) .. first_row(g)+KEYS: a sliding
/// window, so the key set itself changes with every rebuild.
fn generation(g: u64) -> Vec<Entry<u64>> {
    let first = first_row(g);
    (first..first + KEYS)
        .map(|r| Entry { name: format!("g{g}.r{r}"), key: key(r), payload: g })
        .collect()
}

#[test]
fn readers_see_whole_snapshots_during_rebuilds() {
    let index = Arc::new(DeclaredPlanIndex::new(generation(0)));
    let done = Arc::new(AtomicBool::new(false));
    let checked = Arc::new(AtomicU64::new(0));

    let readers: Vec<_> = (0..READERS)
        .map(|_| {
            let (index, done, checked) = (index.clone(), done.clone(), checked.clone());
            thread::spawn(move || {
                let mut last = 0u64;
                // `done` is read first so one full check always runs after the last rebuild
                loop {
                    let finished = done.load(Ordering::Acquire);
                    let snap = index.load();
                    assert_eq!(snap.len(), KEYS as usize);
                    let g = snap.entries()[0].payload;
                    assert!(g >= last, "went back from generation {last} to {g}");
                    last = g;
                    let first = first_row(g);
                    for r in first..first + KEYS {
                        let entry = snap.get(&key(r)).expect("a key of this generation");
                        assert_eq!(entry.payload, g, "row {r}: mixed generations");
                    }
                    assert!(snap.get(&key(first - 1)).is_none(), "a key of an older generation");
                    assert!(snap.get(&key(first + KEYS)).is_none(), "a key of a newer generation");
                    // single lookups also see some whole generation, never an older one than seen
                    if let Some(hit) = index.lookup(&key(first + KEYS / 2)) {
                        assert!(hit.payload >= g);
                    }
                    checked.fetch_add(1, Ordering::Relaxed);
                    if finished {
                        return last;
                    }
                }
            })
        })
        .collect();

    for g in 1..=GENERATIONS {
        index.rebuild(generation(g));
    }
    done.store(true, Ordering::Release);
    for reader in readers {
        let last = reader.join().expect("reader panicked");
        assert_eq!(last, GENERATIONS, "the final check saw the final generation");
    }
    assert!(checked.load(Ordering::Relaxed) >= READERS as u64);
}
