//! The all-or-nothing rule, shared by every store that runs the algorithms in
//! process: decide each check against its current state (a key that appears
//! twice sees its own earlier hits), then commit only if no enforced check was
//! denied.

use super::CounterKey;
use crate::algorithm::{Algorithm, Held, HoldOp, Logged, Outcome, Quota, State, append};
use crate::clock::Nanos;

/// What to write back, per check.
pub type Commits = smallvec::SmallVec<[Option<(State, Nanos)>; 4]>;

/// One descriptor's question to the store.
#[derive(Debug, Clone)]
pub struct Check {
    /// Which counter.
    pub key: CounterKey,
    /// How it is decided.
    pub algorithm: Algorithm,
    /// Against what.
    pub quota: Quota,
    /// How many hits (0: check without counting).
    pub hits: u64,
    /// Whether a denial blocks the request (false in shadow mode).
    pub enforced: bool,
    /// The reference's quota mode: an enforced denial blocks the request
    /// only when every quota-mode check of the request is denied.
    pub quota_mode: bool,
    /// Hits to reserve at a time and spend locally (`consistency: leased`,
    /// shared stores only); 0 asks the store for every hit.
    pub lease: u32,
    /// The answer, filled in by the store.
    pub outcome: Option<Outcome>,
    /// Whose counter this is, for a bulk reset: see [`scope_tag`].
    pub scope: u64,
    /// For a limit on which calls hold request IDs (an in-flight cap, a
    /// reserved budget): what this call does with its ID.
    pub hold: Option<Box<HoldCheck>>,
}

/// What one call does with a request ID (see [`crate::algorithm::Held`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldCheck {
    /// Take, release, reserve or settle.
    pub op: HoldOp,
    /// The request's ID, as Envoy sent it.
    pub id: Box<[u8]>,
    /// The most IDs the key may hold: a cap's limit, a budget's
    /// `--max-held-ids` (past it a reservation is refused).
    pub most: u32,
}

/// A counter's owner as one number: its domain's hash in the high half, its
/// rule's (domain and path) in the low half (0 for a limit that came with
/// the request). A store that keeps no key names (the memory store) keeps
/// this beside each counter, so a rule's or a domain's counters can be
/// found and deleted. 32-bit hashes: two domains (or rules) whose hashes
/// meet would be reset together, one chance in four billion per pair.
pub fn scope_tag(domain: &str, rule_path: Option<&str>) -> u64 {
    let domain = u64::from(xxhash_rust::xxh3::xxh3_64(domain.as_bytes()) as u32);
    // Never 0 for a rule, so a rule's tag differs from "no rule".
    let rule = rule_path.map_or(0, |p| {
        u64::from((xxhash_rust::xxh3::xxh3_64_with_seed(p.as_bytes(), domain) as u32) | 1)
    });
    domain << 32 | rule
}

/// What a bulk reset takes, as tags (see [`scope_tag`]): a domain's every
/// counter, or one rule's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScopeTag {
    tag: u64,
    whole_domain: bool,
}

impl ScopeTag {
    /// Every counter of `domain`, or of `rule_path` in it.
    pub fn of(domain: &str, rule_path: Option<&str>) -> Self {
        Self {
            tag: scope_tag(domain, rule_path),
            whole_domain: rule_path.is_none(),
        }
    }

    /// Whether a counter tagged `tag` is in this scope.
    pub fn holds(&self, tag: u64) -> bool {
        if self.whole_domain {
            tag >> 32 == self.tag >> 32
        } else {
            tag == self.tag
        }
    }
}

impl Check {
    /// A check with no outcome yet.
    pub fn new(
        key: CounterKey,
        algorithm: Algorithm,
        quota: Quota,
        hits: u64,
        enforced: bool,
    ) -> Self {
        Self {
            key,
            algorithm,
            quota,
            hits,
            enforced,
            quota_mode: false,
            lease: 0,
            outcome: None,
            scope: 0,
            hold: None,
        }
    }

    /// What admission spends on this counter (the hits, or a budget's
    /// capped charge; a reservation's hits, at least one; a slot).
    pub fn charge(&self) -> u64 {
        match self.hold.as_ref().map(|h| h.op) {
            Some(HoldOp::Reserve) => self.hits.max(1),
            // A slot; what already happened is never taken back.
            Some(HoldOp::Take) => 1,
            Some(HoldOp::Release | HoldOp::Settle) => 0,
            None => self.quota.hits(self.hits).charge,
        }
    }

    /// Whether the call reports what already happened (a release, a
    /// settlement): always admitted, and applied whatever the request's
    /// other checks decide.
    pub fn is_after_the_fact(&self) -> bool {
        self.hold.as_ref().is_some_and(|h| h.op.is_after_the_fact())
    }
}

/// Whether decided `checks` refuse their request: an enforced check is
/// denied, or every enforced quota-mode check is (the reference's rule:
/// quota-mode descriptors refuse together).
pub fn refused<'a>(checks: impl IntoIterator<Item = &'a Check>) -> bool {
    let (mut quota, mut quota_denied) = (0usize, 0usize);
    for check in checks.into_iter().filter(|c| c.enforced) {
        let denied = check.outcome.is_some_and(|o| !o.allowed);
        if check.quota_mode {
            quota += 1;
            quota_denied += usize::from(denied);
        } else if denied {
            return true;
        }
    }
    quota > 0 && quota == quota_denied
}

/// What to write back to each check's held IDs (see
/// [`crate::algorithm::Held`]): the new list and when it lapses. Empty for
/// a request none of whose checks holds IDs (nearly all of them).
pub type HeldCommits = smallvec::SmallVec<[Option<(Vec<Held>, Nanos)>; 4]>;

/// What a store holds for each check: its counter's state, a sliding log's
/// entries, and the held IDs of a limit that holds them (empty for the
/// others).
#[derive(Clone, Copy)]
pub struct Stored<'a> {
    /// Each check's counter state.
    pub states: &'a [State],
    /// Each check's sliding log (empty for the other algorithms).
    pub logs: &'a [&'a [Logged]],
    /// Each check's held IDs (empty for limits without them).
    pub held: &'a [&'a [Held]],
}

/// Decides `checks` from what is `stored` and fills their outcomes.
/// Returns, for each check, the state to write (with its expiry) when the
/// request is admitted, or `None` everywhere when it is not; a sliding
/// log's state is an append (see [`crate::algorithm::append`]); and the
/// held IDs to write. Releases and settlements are applied (and written)
/// whatever the others decide.
pub fn decide_batch(
    checks: &mut [Check],
    stored: Stored<'_>,
    now: Nanos,
) -> (Commits, HeldCommits) {
    let (pending, held) = decide_in_order(checks, stored, now, |_| true);
    if !refused(checks.iter()) {
        return (pending, held);
    }
    // Nothing is spent: report what is left without this request's hits.
    let Stored { states, logs, .. } = stored;
    let log_of = |i: usize| logs.get(i).copied().unwrap_or(&[]);
    for (i, (check, state)) in checks.iter_mut().zip(states).enumerate() {
        if check.hold.is_some() {
            continue;
        }
        if let Some(outcome) = check.outcome.as_mut().filter(|o| o.allowed) {
            let unspent = match check.algorithm {
                Algorithm::SlidingLog => Algorithm::decide_log(log_of(i), &check.quota, now, 0),
                algorithm => algorithm.decide(*state, &check.quota, now, 0),
            };
            outcome.remaining = unspent.remaining;
            outcome.commit = None;
        }
    }
    // What already happened is applied alone, in order.
    if !checks.iter().any(Check::is_after_the_fact) {
        return (smallvec::smallvec![None; checks.len()], HeldCommits::new());
    }
    let mut alone: smallvec::SmallVec<[Check; 4]> = checks.iter().cloned().collect();
    let (pending, held) = decide_in_order(&mut alone, stored, now, Check::is_after_the_fact);
    for (check, decided) in checks.iter_mut().zip(alone) {
        if check.is_after_the_fact() {
            check.outcome = decided.outcome;
        } else if let Some(o) = check.outcome.as_mut().filter(|_| check.hold.is_some()) {
            o.commit = None;
        }
    }
    (pending, held)
}

/// Decides the checks `which` selects in order (the others change nothing
/// and commit nothing), each seeing what the earlier ones of the request
/// would write.
fn decide_in_order(
    checks: &mut [Check],
    Stored { states, logs, held }: Stored<'_>,
    now: Nanos,
    which: impl Fn(&Check) -> bool,
) -> (Commits, HeldCommits) {
    let mut pending: Commits = smallvec::smallvec![None; checks.len()];
    let mut held_pending: HeldCommits = match checks.iter().any(|c| c.hold.is_some()) {
        true => smallvec::smallvec![None; checks.len()],
        false => HeldCommits::new(),
    };
    // The counter's state after each check: what it committed, or what it
    // saw when it changed nothing (a denial, a check of zero hits).
    let mut after: smallvec::SmallVec<[State; 4]> = smallvec::SmallVec::with_capacity(checks.len());
    let earlier = earlier_checks(checks);
    let log_of = |i: usize| logs.get(i).copied().unwrap_or(&[]);
    for i in 0..checks.len() {
        // An earlier check of the same counter in this request sees through,
        // as the Redis script reads its own pending writes.
        let state = earlier[i].map_or(states[i], |j| after[j]);
        if !which(&checks[i]) {
            after.push(state);
            continue;
        }
        let check = &checks[i];
        let outcome = match (&check.hold, check.algorithm, earlier[i]) {
            (Some(hold), _, _) => {
                // The held IDs as this request's earlier calls left them.
                let mut seen: &[Held] = held.get(i).copied().unwrap_or(&[]);
                if let Some(list) = (0..i)
                    .rev()
                    .filter(|&j| checks[j].key == check.key)
                    .find_map(|j| held_pending[j].as_ref())
                {
                    seen = &list.0;
                }
                let decided = match hold.op {
                    HoldOp::Take | HoldOp::Release => crate::algorithm::in_flight(
                        seen,
                        hold.op,
                        &hold.id,
                        (check.quota.limit, check.quota.period),
                        now,
                    ),
                    HoldOp::Reserve | HoldOp::Settle => crate::algorithm::reserve(
                        (state, seen),
                        (hold.op, &hold.id, hold.most),
                        &check.quota,
                        now,
                        check.hits,
                    ),
                };
                held_pending[i] = decided.held;
                decided.outcome
            }
            (None, Algorithm::SlidingLog, None) => {
                Algorithm::decide_log(log_of(i), &check.quota, now, check.hits)
            }
            (None, Algorithm::SlidingLog, Some(_)) => {
                // The log with what this request's earlier checks of it add.
                let mut log = log_of(i).to_vec();
                for j in 0..i {
                    if let (true, Some((added, _))) = (checks[j].key == check.key, pending[j]) {
                        append(&mut log, added, check.quota.period_ticks());
                    }
                }
                Algorithm::decide_log(&log, &check.quota, now, check.hits)
            }
            (None, algorithm, _) => algorithm.decide(state, &check.quota, now, check.hits),
        };
        pending[i] = outcome.commit;
        after.push(outcome.commit.map_or(state, |(s, _)| s));
        checks[i].outcome = Some(outcome);
    }
    (pending, held_pending)
}

/// For each check, the closest earlier check of the same counter. Linear in
/// the request (a hash map past a handful of checks), so a request of many
/// descriptors costs no more than its size while the store holds its locks.
fn earlier_checks(checks: &[Check]) -> smallvec::SmallVec<[Option<usize>; 4]> {
    if checks.len() <= 8 {
        return (0..checks.len())
            .map(|i| (0..i).rev().find(|&j| checks[j].key == checks[i].key))
            .collect();
    }
    let mut last: std::collections::HashMap<&[u8], usize> =
        std::collections::HashMap::with_capacity(checks.len());
    checks
        .iter()
        .enumerate()
        .map(|(i, c)| last.insert(c.key.as_bytes(), i))
        .collect()
}
