//! The example of failure replay against a service of one's own (`examples/own_service.rs`),
//! run in CI: it must hold its invariant under duplicated calls, lost answers and doubled
//! deliveries.

#[path = "../../examples/own_service.rs"]
mod example;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_of_ones_own_holds_its_invariant_under_the_plan() {
    let (succeeded, deliveries) = example::run(30).await.expect("the invariant holds");
    assert_eq!(succeeded, 20, "two orders in three succeed");
    // Every action sent twice: 60 actions, 120 calls; the 10 failed orders' 20
    // compensations each lose their first answer and are sent again: 40 more. Each step
    // applied once whatever arrived (checked inside `run`).
    assert!(deliveries >= 160, "{deliveries} deliveries");
}
