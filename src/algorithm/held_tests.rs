use super::*;
use crate::clock::NANOS_PER_SEC;

const S: Nanos = NANOS_PER_SEC;

fn ids(held: &[Held]) -> Vec<&[u8]> {
    held.iter().map(|h| &*h.id).collect()
}

#[test]
fn an_in_flight_cap_admits_its_limit_and_frees_only_the_releasers_slot() {
    let cap = (2, 60 * S);
    let mut held = Vec::new();
    for id in [&b"a"[..], b"b"] {
        let out = in_flight(&held, HoldOp::Take, id, cap, 10 * S);
        assert!(out.outcome.allowed);
        held = out.held.expect("taken").0;
    }
    let third = in_flight(&held, HoldOp::Take, b"c", cap, 10 * S);
    assert!(!third.outcome.allowed);
    assert_eq!(third.outcome.wait, 60 * S, "the first slot lapses then");
    // The refused request's stream-end call frees nothing.
    let stray = in_flight(&held, HoldOp::Release, b"c", cap, 11 * S);
    assert!(stray.outcome.allowed && stray.held.is_none());
    // A's release frees A's slot, once.
    let (after, _) = in_flight(&held, HoldOp::Release, b"a", cap, 12 * S)
        .held
        .expect("released");
    assert_eq!(ids(&after), [b"b"]);
    assert!(
        in_flight(&after, HoldOp::Release, b"a", cap, 12 * S)
            .held
            .is_none()
    );
    assert!(
        in_flight(&after, HoldOp::Take, b"c", cap, 13 * S)
            .outcome
            .allowed
    );
}

#[test]
fn a_held_id_cannot_take_a_second_slot_and_slots_lapse_by_themselves() {
    let cap = (5, 30 * S);
    let (held, lapse) = in_flight(&[], HoldOp::Take, b"x", cap, 100 * S)
        .held
        .expect("taken");
    assert_eq!(lapse, 130 * S);
    assert!(
        !in_flight(&held, HoldOp::Take, b"x", cap, 101 * S)
            .outcome
            .allowed
    );
    // Never released: free again once max_hold has passed.
    let later = in_flight(&held, HoldOp::Take, b"x", cap, 130 * S);
    assert!(later.outcome.allowed);
    assert_eq!(later.held.expect("taken").0.len(), 1);
}

fn budget(limit: u32) -> Quota {
    Quota {
        budget: true,
        ..Quota::new(limit, 3600 * S, limit)
    }
}

#[test]
fn reservations_fit_in_what_is_left_and_settle_to_the_real_cost() {
    let q = budget(100);
    let now = 7200 * S + 5 * S;
    let r = reserve(
        (State::default(), &[]),
        (HoldOp::Reserve, b"a", 1000),
        &q,
        now,
        60,
    );
    assert!(r.outcome.allowed);
    let (state, _) = r.outcome.commit.expect("charged");
    assert_eq!(state.current, 60);
    let held = r.held.expect("held").0;
    // 50 more do not fit in the 40 left: refused, nothing charged.
    let refused = reserve((state, &held), (HoldOp::Reserve, b"b", 1000), &q, now, 50);
    assert!(!refused.outcome.allowed && refused.outcome.commit.is_none());
    assert!(refused.held.is_none());
    // A second reservation for one ID is refused too.
    assert!(
        !reserve((state, &held), (HoldOp::Reserve, b"a", 1000), &q, now, 1)
            .outcome
            .allowed
    );
    // Settled at 25: 35 come back.
    let s = reserve((state, &held), (HoldOp::Settle, b"a", 1000), &q, now, 25);
    assert!(s.outcome.allowed);
    let (settled, _) = s.outcome.commit.expect("refunded");
    assert_eq!(settled.current, 25);
    let emptied = s.held.expect("settled").0;
    assert!(emptied.is_empty());
    // Settling it again (or a refused ID) refunds nothing and charges it.
    let again = reserve(
        (settled, &emptied),
        (HoldOp::Settle, b"a", 1000),
        &q,
        now,
        10,
    );
    assert_eq!(again.outcome.commit.expect("charged").0.current, 35);
}

#[test]
fn a_settlement_above_the_reservation_charges_the_difference_even_past_the_limit() {
    let q = budget(100);
    let now = 5 * S;
    let r = reserve(
        (State::default(), &[]),
        (HoldOp::Reserve, b"a", 1000),
        &q,
        now,
        90,
    );
    let (state, _) = r.outcome.commit.expect("charged");
    let held = r.held.expect("held").0;
    let s = reserve((state, &held), (HoldOp::Settle, b"a", 1000), &q, now, 95);
    let (settled, _) = s.outcome.commit.expect("charged");
    assert_eq!(settled.current, 95);
    // Past the limit: the budget ends overdrawn by what the response cost.
    let other = reserve((settled, &[]), (HoldOp::Settle, b"b", 1000), &q, now, 30);
    assert_eq!(other.outcome.commit.expect("charged").0.current, 125);
    assert_eq!(other.outcome.remaining, 0);
    // A cost beyond the whole budget is cut to it, as for any budget.
    let huge = reserve(
        (State::default(), &[]),
        (HoldOp::Settle, b"z", 1000),
        &q,
        now,
        u64::MAX,
    );
    assert_eq!(huge.outcome.commit.expect("charged").0.current, 100);
}

#[test]
fn a_reservation_lapses_with_its_window() {
    let q = budget(100);
    let r = reserve(
        (State::default(), &[]),
        (HoldOp::Reserve, b"a", 1000),
        &q,
        5 * S,
        80,
    );
    let (state, _) = r.outcome.commit.expect("charged");
    let held = r.held.expect("held").0;
    // Next hour: the counter starts afresh and the reservation is gone, so
    // its settlement charges the whole cost to the new window.
    let s = reserve(
        (state, &held),
        (HoldOp::Settle, b"a", 1000),
        &q,
        3605 * S,
        30,
    );
    assert_eq!(s.outcome.commit.expect("charged").0.current, 30);
    assert!(s.held.expect("pruned").0.is_empty());
}

#[test]
fn a_reservation_of_nothing_holds_one_hit() {
    let q = budget(2);
    let mut state = State::default();
    let mut held = Vec::new();
    for id in [&b"a"[..], b"b"] {
        let r = reserve((state, &held), (HoldOp::Reserve, id, 1000), &q, S, 0);
        assert!(r.outcome.allowed);
        state = r.outcome.commit.expect("charged").0;
        held = r.held.expect("held").0;
    }
    assert!(
        !reserve((state, &held), (HoldOp::Reserve, b"c", 1000), &q, S, 0)
            .outcome
            .allowed
    );
}

#[test]
fn a_key_holds_at_most_its_bound_of_reservations() {
    let q = budget(100);
    let mut state = State::default();
    let mut held = Vec::new();
    for id in [&b"a"[..], b"b", b"c"] {
        let r = reserve((state, &held), (HoldOp::Reserve, id, 3), &q, S, 1);
        assert!(r.outcome.allowed);
        state = r.outcome.commit.expect("charged").0;
        held = r.held.expect("held").0;
    }
    let fourth = reserve((state, &held), (HoldOp::Reserve, b"d", 3), &q, S, 1);
    assert!(!fourth.outcome.allowed && fourth.outcome.commit.is_none());
    // A settlement makes room.
    let s = reserve((state, &held), (HoldOp::Settle, b"a", 3), &q, S, 1);
    let held = s.held.expect("settled").0;
    assert!(
        reserve((state, &held), (HoldOp::Reserve, b"d", 3), &q, S, 1)
            .outcome
            .allowed
    );
}
