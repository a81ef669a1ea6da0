//! The rule for a plan whose scorers' MMA flavor is forced (benchmarks and
//! tests cover, on one GPU, the kernels other GPUs run): the flavor's
//! scorers must be loaded on the plan's device.

use b12x_core::indexer::MmaFlavor;
use b12x_core::Error as CoreError;

use crate::device::loaded;
use crate::error::Result;
use crate::indexer::available_flavors;

/// Ok when `ordinal` (its kernels loaded) runs `forced`'s scorers; else an
/// error naming `mma_flavor`, the device, its arch and the flavors it runs.
pub fn require_flavor(ordinal: u32, forced: MmaFlavor) -> Result<()> {
    let runs = available_flavors(ordinal)?;
    if runs.contains(&forced) {
        return Ok(());
    }
    let names: Vec<&str> = runs.iter().map(|f| f.name()).collect();
    let (major, minor) = loaded(ordinal)?.compute_capability;
    Err(CoreError::InvalidValue {
        op: "plan",
        operand: "mma_flavor".into(),
        expected: format!(
            "one of the flavors cuda:{ordinal} (sm_{major}{minor}) runs: {}",
            names.join(", ")
        )
        .into(),
        got: format!("{:?}", forced.name()),
    }
    .into())
}
