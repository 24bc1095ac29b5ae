//! The data directory's writes (`--data-dir`), in Prometheus
//! (`tollgate_data_*`): a failing write (a full disk) shows here, in the
//! health endpoint and in the log, while decisions go on from memory.

use super::exposition::Exposition;
use crate::store::memory::DataEvents;

/// Writes the families.
pub(crate) fn render(out: &mut Exposition<'_>, d: &DataEvents) {
    out.gauge(
        "tollgate_data_write_failing",
        "1 while the data directory cannot be written (a full disk, an I/O error): counters are kept in memory, a crash would lose the counts since the last write; 0 once a write succeeds again.",
        u8::from(d.failing),
    )
    .counter(
        "tollgate_data_flushes_total",
        "Flushes of the counters to the data directory that were written.",
        d.flushes,
    )
    .counter(
        "tollgate_data_flush_failures_total",
        "Flushes of the counters to the data directory that failed.",
        d.failures,
    )
    .gauge(
        "tollgate_data_keys",
        "Keys in the data directory after the last flush written.",
        d.keys,
    )
    .gauge(
        "tollgate_data_file_bytes",
        "The size of the data directory's database file.",
        d.bytes,
    );
}
