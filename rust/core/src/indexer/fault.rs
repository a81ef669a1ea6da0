//! Page ids the kernels refused, as the host reads them back.
//!
//! `bind` cannot see device values, so the scorers bound every page id they
//! read by the bound K cache's page count: an id outside `[0, pages)` is
//! unmapped (its tokens are never candidates, its page is never read), and
//! the first id at or past `pages` since the last check is recorded in a
//! status word. The words are written by the kernels
//! (`idx_report_bad_page`, kernels/indexer_common.cuh) and read by the host
//! only on request, so runs stay sync-free.

use std::fmt;
use std::sync::Mutex;

/// u32 words of the status record: [set, row, column, page id, pages, 0, 0, 0].
pub const STATUS_WORDS: usize = 8;

/// The first out-of-range page id a run met: `page_table[row, column]` held
/// `page_id`, outside the `pages` pages of `index_k_cache`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageFault {
    pub row: u32,
    pub column: u32,
    pub page_id: i64,
    pub pages: u64,
}

impl PageFault {
    /// The record in the kernels' word order, or None when no fault is set.
    pub fn from_words(w: &[u32; STATUS_WORDS]) -> Option<PageFault> {
        (w[0] != 0).then(|| PageFault {
            row: w[1],
            column: w[2],
            page_id: w[3] as i32 as i64,
            pages: w[4] as u64,
        })
    }
}

/// The host's status record: what the CPU reference's runs met, kept like
/// the device word (the first fault since the last check wins).
static HOST_RECORD: Mutex<Option<PageFault>> = Mutex::new(None);

/// Records `fault` in the host's record unless one is already there.
pub fn record_host_fault(fault: PageFault) {
    HOST_RECORD.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(fault);
}

/// Reads and clears the host's record.
pub fn take_host_fault() -> Option<PageFault> {
    HOST_RECORD.lock().unwrap_or_else(|p| p.into_inner()).take()
}

impl fmt::Display for PageFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "run: page_table[{}, {}] expected a page id in [0, {}) (the pages of index_k_cache) \
             or negative (unmapped), got {}; the page was skipped as unmapped (the first such \
             id since the last check is reported)",
            self.row, self.column, self.pages, self.page_id
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_record_keeps_the_first_fault_until_taken() {
        let first = PageFault { row: 1, column: 2, page_id: 9, pages: 8 };
        record_host_fault(first);
        record_host_fault(PageFault { row: 3, ..first });
        assert_eq!(take_host_fault(), Some(first));
        assert_eq!(take_host_fault(), None);
    }

    #[test]
    fn words_round_trip_and_name_the_entry() {
        assert_eq!(PageFault::from_words(&[0; STATUS_WORDS]), None);
        let f = PageFault::from_words(&[1, 3, 17, 5000, 4096, 0, 0, 0]).unwrap();
        assert_eq!(f, PageFault { row: 3, column: 17, page_id: 5000, pages: 4096 });
        assert!(f.to_string().starts_with(
            "run: page_table[3, 17] expected a page id in [0, 4096) (the pages of \
             index_k_cache) or negative (unmapped), got 5000"
        ));
    }
}
