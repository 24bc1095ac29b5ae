//! `tollgate_unmatched_descriptors_total{domain, key}`: descriptors that no
//! rule matched (answered OK, limited by nothing), by their domain and
//! their first entry's key, never a value. Keys come from Envoy's
//! configuration, but a client of the gRPC port could send any: past
//! [`MAX_SERIES`] label pairs, new ones count under `key="(other)"`, and a
//! domain no rule names is `(unknown)`. Each thread counts in its own
//! shard (a flood of unmatched requests takes no lock every worker shares).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::exposition::{Exposition, Kind};
use crate::shards::PerThread;

/// The most (domain, key) pairs counted by name, all threads together.
pub(crate) const MAX_SERIES: usize = 1_000;

/// A (domain, key) pair.
type Labels = (Box<str>, Box<str>);

/// The label pairs seen and their counts, per thread.
#[derive(Debug)]
pub(crate) struct Unmatched {
    /// Per thread: the pair's hash -> the pair and its count.
    shards: PerThread<HashMap<u64, (Labels, u64)>>,
    /// Pairs named so far (every shard's), bounded by [`MAX_SERIES`].
    named: AtomicUsize,
}

impl Default for Unmatched {
    fn default() -> Self {
        Self {
            shards: PerThread::new(),
            named: AtomicUsize::new(0),
        }
    }
}

impl Unmatched {
    /// Counts one descriptor of `domain` (`None`: a domain no rule names)
    /// whose first key is `key`, that no rule matched.
    pub(crate) fn count(&self, domain: Option<&str>, key: &str) {
        let domain = domain.unwrap_or("(unknown)");
        let mut shard = self.shards.mine();
        if let Some((_, n)) = shard.get_mut(&hash(domain, key)) {
            *n += 1;
            return;
        }
        let key = if self.named.fetch_add(1, Ordering::Relaxed) < MAX_SERIES {
            key
        } else {
            self.named.fetch_sub(1, Ordering::Relaxed);
            "(other)"
        };
        shard
            .entry(hash(domain, key))
            .or_insert_with(|| ((domain.into(), key.into()), 0))
            .1 += 1;
    }

    /// The family, every shard's counts summed per label pair.
    pub(crate) fn render(&self, e: &mut Exposition<'_>) {
        let mut total: HashMap<Labels, u64> = HashMap::new();
        self.shards.each(|shard| {
            for (labels, n) in shard.values() {
                *total.entry(labels.clone()).or_insert(0) += n;
            }
        });
        let mut rows: Vec<_> = total.into_iter().collect();
        rows.sort();
        const NAME: &str = "tollgate_unmatched_descriptors_total";
        e.family(
            NAME,
            "Descriptors no rule matched (answered OK, limited by nothing), by domain and first key.",
            Kind::Counter,
        );
        for ((domain, key), n) in rows {
            let mut labels = String::new();
            super::labels::push_label(&mut labels, "domain", &domain);
            super::labels::push_label(&mut labels, "key", &key);
            e.sample(NAME, &labels[1..], n);
        }
    }
}

/// The pair's identity in a shard.
fn hash(domain: &str, key: &str) -> u64 {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    hasher.update(domain.as_bytes());
    hasher.update(&[0xff]);
    hasher.update(key.as_bytes());
    hasher.digest()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_domain_and_first_key_bounded_in_pairs() {
        let u = Unmatched::default();
        u.count(Some("api"), "apikey");
        u.count(Some("api"), "apikey");
        u.count(None, "user");
        for i in 0..MAX_SERIES + 10 {
            u.count(Some("api"), &format!("k{i}"));
        }
        let mut out = String::new();
        u.render(&mut Exposition::new(&mut out));
        assert!(
            out.contains("tollgate_unmatched_descriptors_total{domain=\"api\",key=\"apikey\"} 2"),
            "{out}"
        );
        assert!(
            out.contains("domain=\"(unknown)\",key=\"user\"} 1"),
            "{out}"
        );
        assert!(
            out.contains("key=\"(other)\"} 12"),
            "the pairs past the bound: {out}"
        );
        assert_eq!(
            out.matches("tollgate_unmatched_descriptors_total{").count(),
            MAX_SERIES + 1
        );
    }
}
