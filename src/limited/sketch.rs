//! One rule's heaviest refused clients: a space-saving sketch (Metwally,
//! Agrawal and El Abbadi, 2005) over a sliding window of epochs.
//!
//! A rule holds at most `slots` clients. A refusal of a tracked client
//! counts to it; a refusal of a new client takes a free slot, else the slot
//! of the client with the fewest refusals, inheriting that count as its
//! possible overestimate (`error`). So any client refused more than
//! `N / slots` times in the window (N: the rule's refusals in it) is held,
//! and a count is never below the truth nor above it by more than its
//! `error`. Counts are kept per epoch (a quarter of the window) and an epoch
//! that leaves the window is dropped, so the view forgets a client that
//! stopped being refused within a window.
//!
//! Memory is bounded whatever the clients: `slots` clients per rule, each
//! with its request's entries cut to [`MAX_DESCRIPTOR_BYTES`] (what the
//! entries take in memory, their bookkeeping included, not only their
//! text), so a client is at most [`CLIENT_BYTES`].

use std::collections::HashMap;
use std::sync::Arc;

use crate::clock::Nanos;

/// Epochs per window: a client's counts leave the window a quarter at a time.
pub(crate) const EPOCHS: usize = 4;

/// The most memory a refused request's descriptors are kept in: their keys
/// and values, and [`ENTRY_BYTES`] for each entry and descriptor (beyond,
/// entries are left out and the cut is marked).
pub(crate) const MAX_DESCRIPTOR_BYTES: usize = 1_024;

/// Marks a value cut to fit (see [`owned`]).
const VALUE_CUT: &str = "…";
/// The least of a cut value kept (less, and the entry is left out).
const MIN_VALUE_KEPT: usize = 16;

/// What an entry takes beside its text: the pair of boxed strings and
/// their two allocations' rounding.
const ENTRY_BYTES: usize = 2 * std::mem::size_of::<Box<str>>() + 2 * 16;

/// The most one held client takes: its record, its slot in the index,
/// its descriptors (the cut's mark and the shared list's header included).
pub(crate) const CLIENT_BYTES: usize =
    std::mem::size_of::<Client>() + 32 + MAX_DESCRIPTOR_BYTES + 2 * ENTRY_BYTES + 64;

/// One descriptor's entries, owned.
pub(crate) type Entries = Box<[(Box<str>, Box<str>)]>;

/// The descriptors of a request, owned: `[[(key, value), ...], ...]`.
pub(crate) type Descriptors = Arc<[Entries]>;

/// Counts per epoch, the newest at `epoch`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Window {
    counts: [u64; EPOCHS],
    epoch: u64,
}

impl Window {
    /// Moves to `epoch`, dropping the epochs that left the window.
    fn roll(&mut self, epoch: u64) {
        if epoch <= self.epoch {
            return;
        }
        let gone = (epoch - self.epoch).min(EPOCHS as u64);
        for e in 1..=gone {
            self.counts[((self.epoch + e) % EPOCHS as u64) as usize] = 0;
        }
        self.epoch = epoch;
    }

    fn add(&mut self, epoch: u64, n: u64) {
        self.roll(epoch);
        // An epoch older than the newest (another thread's clock read a
        // little earlier) counts to the newest.
        self.counts[(self.epoch % EPOCHS as u64) as usize] += n;
    }

    /// The total over the window ending at `epoch`.
    pub(crate) fn total(&self, epoch: u64) -> u64 {
        (0..EPOCHS as u64)
            .filter_map(|back| self.epoch.checked_sub(back))
            .filter(|e| e + (EPOCHS as u64) > epoch)
            .map(|e| self.counts[(e % EPOCHS as u64) as usize])
            .sum()
    }
}

/// One tracked client of a rule.
#[derive(Debug, Clone)]
pub(crate) struct Client {
    /// The hash of the descriptor the rule counted (the client's identity).
    pub(crate) id: u64,
    pub(crate) refused: Window,
    /// Requests of this client the rule admitted since it was tracked.
    pub(crate) admitted: Window,
    /// The most `refused` may overstate (inherited from the slot's last
    /// holder).
    pub(crate) error: u64,
    pub(crate) first_refused: Nanos,
    pub(crate) last_refused: Nanos,
    /// Every descriptor of the last refused request.
    pub(crate) descriptors: Descriptors,
}

/// A rule's clients.
#[derive(Debug)]
pub(crate) struct RuleSketch {
    /// The domain of the requests it counted.
    pub(crate) domain: Arc<str>,
    /// The rule's name as responses name it (its name, else its path).
    pub(crate) policy: Arc<str>,
    /// The rule's index in the rule set in force when it last refused.
    pub(crate) rule: Option<usize>,
    /// Every refusal of the rule, tracked client or not.
    pub(crate) refused: Window,
    pub(crate) clients: Vec<Client>,
    index: HashMap<u64, usize>,
}

impl RuleSketch {
    pub(crate) fn new(domain: Arc<str>, policy: Arc<str>, rule: Option<usize>) -> Self {
        Self {
            domain,
            policy,
            rule,
            refused: Window::default(),
            clients: Vec::new(),
            index: HashMap::new(),
        }
    }

    /// A refusal of client `id` at `now` (in `epoch`); `descriptors` makes
    /// its request's descriptors when they must be kept.
    pub(crate) fn refuse(
        &mut self,
        (id, now, epoch): (u64, Nanos, u64),
        slots: usize,
        descriptors: impl FnOnce() -> Descriptors,
    ) {
        self.refused.add(epoch, 1);
        if let Some(&i) = self.index.get(&id) {
            let client = &mut self.clients[i];
            client.refused.add(epoch, 1);
            // The request shown is refreshed at most once a second: a flood
            // of one client copies nothing.
            if now.saturating_sub(client.last_refused) >= crate::clock::NANOS_PER_SEC {
                client.descriptors = descriptors();
            }
            client.last_refused = now;
            return;
        }
        let mut client = Client {
            id,
            refused: Window::default(),
            admitted: Window::default(),
            error: 0,
            first_refused: now,
            last_refused: now,
            descriptors: descriptors(),
        };
        if self.clients.len() < slots.max(1) {
            client.refused.add(epoch, 1);
            self.index.insert(id, self.clients.len());
            self.clients.push(client);
            return;
        }
        // The fewest refusals in the window: taken over, its count inherited
        // (zero when it has left the window).
        let (i, least) = self
            .clients
            .iter()
            .enumerate()
            .map(|(i, c)| (i, c.refused.total(epoch)))
            .min_by_key(|(_, n)| *n)
            .unwrap_or((0, 0));
        client.error = least;
        client.refused.add(epoch, least + 1);
        self.index.remove(&self.clients[i].id);
        self.index.insert(id, i);
        self.clients[i] = client;
    }

    /// An admission of client `id`, counted when it is tracked.
    pub(crate) fn admit(&mut self, id: u64, epoch: u64) {
        if let Some(&i) = self.index.get(&id) {
            self.clients[i].admitted.add(epoch, 1);
        }
    }

    /// Whether nothing of this rule is left in the window ending at `epoch`.
    pub(crate) fn expired(&self, epoch: u64) -> bool {
        self.refused.total(epoch) == 0
    }
}

/// The identity of a client of a rule: the descriptor it counted, with its
/// domain.
pub(crate) fn client_id(domain: &str, entries: &[(&str, &str)]) -> u64 {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    hasher.update(domain.as_bytes());
    for (k, v) in entries {
        hasher.update(&[0xff]);
        hasher.update(k.as_bytes());
        hasher.update(&[0xfe]);
        hasher.update(v.as_bytes());
    }
    hasher.digest()
}

/// A request's descriptors, owned, cut to [`MAX_DESCRIPTOR_BYTES`]: entries
/// beyond are left out, and a last entry `("…", "N more entries")` says so.
pub(crate) fn owned<'a>(
    descriptors: impl Iterator<Item = &'a [(&'a str, &'a str)]>,
) -> Descriptors {
    let mut left = MAX_DESCRIPTOR_BYTES;
    let mut cut = 0usize;
    let mut out: Vec<Entries> = Vec::new();
    for entries in descriptors {
        let mut kept = Vec::new();
        // The descriptor's own list.
        left = left.saturating_sub(ENTRY_BYTES);
        for (k, v) in entries {
            let size = k.len() + v.len() + ENTRY_BYTES;
            if size > left {
                // A long value is cut rather than left out, while its key
                // and some of it fit: a client whose value is a long
                // header is still shown (and found by a search).
                let room = left.saturating_sub(k.len() + ENTRY_BYTES + VALUE_CUT.len());
                if room >= MIN_VALUE_KEPT.min(v.len()) && room > 0 {
                    let mut end = room.min(v.len());
                    while !v.is_char_boundary(end) {
                        end -= 1;
                    }
                    let value = format!("{}{VALUE_CUT}", &v[..end]);
                    left -= k.len() + ENTRY_BYTES + value.len();
                    kept.push((Box::from(*k), value.into_boxed_str()));
                } else {
                    cut += 1;
                }
                continue;
            }
            left -= size;
            kept.push((Box::from(*k), Box::from(*v)));
        }
        if !kept.is_empty() {
            out.push(kept.into_boxed_slice());
        }
    }
    if cut > 0 {
        out.push(Box::new([(
            Box::from("…"),
            format!("{cut} more entries").into_boxed_str(),
        )]));
    }
    out.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none() -> Descriptors {
        Arc::from(Vec::new())
    }

    #[test]
    fn a_window_forgets_epochs_that_left_it() {
        let mut w = Window::default();
        w.add(10, 3);
        w.add(11, 2);
        assert_eq!(w.total(11), 5);
        assert_eq!(w.total(13), 5);
        assert_eq!(w.total(14), 2, "epoch 10 left");
        assert_eq!(w.total(15), 0);
        w.add(20, 1);
        assert_eq!(w.total(20), 1, "a jump clears every epoch");
    }

    #[test]
    fn heavy_clients_are_held_and_counts_are_within_the_error() {
        let mut sketch = RuleSketch::new("d".into(), "r".into(), None);
        // Three heavy clients among 2,000 light ones, 8 slots.
        let mut truth: HashMap<u64, u64> = HashMap::new();
        for round in 0..100u64 {
            for heavy in 0..3u64 {
                for _ in 0..(10 + heavy) {
                    sketch.refuse((heavy, 0, 0), 8, none);
                    *truth.entry(heavy).or_default() += 1;
                }
            }
            for light in 0..20u64 {
                let id = 1_000 + round * 20 + light;
                sketch.refuse((id, 0, 0), 8, none);
                *truth.entry(id).or_default() += 1;
            }
        }
        let n: u64 = truth.values().sum();
        for heavy in 0..3u64 {
            let client = sketch
                .clients
                .iter()
                .find(|c| c.id == heavy)
                .expect("a heavy client is held");
            let counted = client.refused.total(0);
            assert!(counted >= truth[&heavy], "never below the truth");
            assert!(counted - truth[&heavy] <= client.error, "within its error");
            assert!(client.error <= n / 8, "error at most N/slots");
        }
        assert_eq!(sketch.refused.total(0), n);
    }

    #[test]
    fn a_million_distinct_clients_keep_the_slots_bound() {
        let mut sketch = RuleSketch::new("d".into(), "r".into(), None);
        for id in 0..1_000_000u64 {
            sketch.refuse((id, 0, id / 100_000), 16, none);
        }
        assert_eq!(sketch.clients.len(), 16);
        assert_eq!(sketch.index.len(), 16);
    }

    #[test]
    fn admissions_count_for_tracked_clients_only() {
        let mut sketch = RuleSketch::new("d".into(), "r".into(), None);
        sketch.refuse((1, 0, 0), 4, none);
        sketch.admit(1, 0);
        sketch.admit(1, 0);
        sketch.admit(2, 0);
        assert_eq!(sketch.clients.len(), 1);
        assert_eq!(sketch.clients[0].admitted.total(0), 2);
    }

    #[test]
    fn descriptors_are_cut_to_the_bound() {
        let long = "v".repeat(600);
        let entries: Vec<Vec<(&str, &str)>> = vec![
            vec![("user", "ann")],
            vec![("a", long.as_str())],
            vec![("b", long.as_str())],
        ];
        let kept = owned(entries.iter().map(Vec::as_slice));
        assert_eq!(&*kept[0][0].1, "ann");
        // The first long value fits whole; the second is cut, marked, and
        // still there (a client is never shown without its value).
        assert_eq!(kept[1][0].1.len(), 600);
        assert!(kept[2][0].1.ends_with('…'), "{:?}", kept[2][0]);
        assert!(kept[2][0].1.starts_with("vvvv"), "{:?}", kept[2][0]);
        let bytes: usize = kept
            .iter()
            .flat_map(|d| d.iter())
            .map(|(k, v)| k.len() + v.len())
            .sum();
        assert!(bytes <= MAX_DESCRIPTOR_BYTES + 30);
    }

    #[test]
    fn ids_tell_entries_apart() {
        assert_ne!(
            client_id("d", &[("a", "bc")]),
            client_id("d", &[("ab", "c")])
        );
        assert_ne!(client_id("d", &[("a", "b")]), client_id("e", &[("a", "b")]));
    }
}
