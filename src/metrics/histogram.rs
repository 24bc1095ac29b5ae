//! Latency: a Prometheus histogram, and the samples statsd timers want.

use std::sync::atomic::{AtomicU64, Ordering};

use super::exposition::{Exposition, Kind};

/// Latency buckets in seconds.
const BUCKETS: [f64; 12] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5,
];

/// A Prometheus histogram.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, seconds: f64) {
        if let Some(i) = BUCKETS.iter().position(|b| seconds <= *b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_nanos
            .fetch_add((seconds * 1e9) as u64, Ordering::Relaxed);
    }

    pub(super) fn write(&self, out: &mut String, name: &str, help: &str) {
        Exposition::new(out).family(name, help, Kind::Histogram);
        self.write_series(out, name, "");
    }

    /// The histogram's lines (no HELP or TYPE) with `labels`
    /// (`a="x",b="y"`, or empty) on each.
    pub fn write_series(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let bucket_name = format!("{name}_bucket");
        let mut e = Exposition::new(out);
        let mut cumulative = 0;
        for (bound, bucket) in BUCKETS.iter().zip(&self.buckets) {
            cumulative += bucket.load(Ordering::Relaxed);
            e.sample(
                &bucket_name,
                &format!("{labels}{sep}le=\"{bound}\""),
                cumulative,
            );
        }
        let count = self.count();
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        e.sample(&bucket_name, &format!("{labels}{sep}le=\"+Inf\""), count)
            .sample(&format!("{name}_sum"), labels, sum)
            .sample(&format!("{name}_count"), labels, count);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

/// The most timer samples kept between two statsd flushes.
const MAX_SAMPLES: usize = 1000;

/// Individual observations kept for statsd timers (statsd wants samples, not
/// buckets): at most [`MAX_SAMPLES`] between two takes, the rest counted so
/// the sample rate can be reported. Off (one relaxed load per observation)
/// unless statsd output is on.
#[derive(Debug, Default)]
pub struct Samples {
    enabled: std::sync::atomic::AtomicBool,
    kept: parking_lot::Mutex<Vec<f64>>,
    seen: AtomicU64,
}

impl Samples {
    /// Starts keeping samples.
    pub fn enable(&self) {
        self.enabled.store(true, Ordering::Relaxed);
    }

    /// Records one observation, in seconds, if enabled.
    pub fn record(&self, seconds: f64) {
        if !self.enabled.load(Ordering::Relaxed) {
            return;
        }
        self.seen.fetch_add(1, Ordering::Relaxed);
        let mut kept = self.kept.lock();
        if kept.len() < MAX_SAMPLES {
            kept.push(seconds);
        }
    }

    /// The samples kept since the last take, and how many were observed.
    pub fn take(&self) -> (Vec<f64>, u64) {
        let kept = std::mem::take(&mut *self.kept.lock());
        (kept, self.seen.swap(0, Ordering::Relaxed))
    }
}
