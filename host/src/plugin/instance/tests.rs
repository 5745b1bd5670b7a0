//! An instance of a real plugin (the `chaos` test guest) in the engine
//! the service uses: what a call answers, and what a trap, a call past
//! its deadline and a memory blow-up become, each leaving the host whole
//! and a fresh instance usable.

use super::*;
use crate::plugin::PluginHost;
use crate::tests::delivery;

/// The `chaos` guest, loaded with `handler_timeout` and a memory cap of
/// `max_memory` bytes.
fn chaos(handler_timeout: Duration, max_memory: usize) -> Plugin {
    let guests = shardlane_testkit::guests::build().unwrap();
    let mut sandbox = crate::tests::subscription("").sandbox.clone();
    sandbox.max_memory = max_memory;
    let host = PluginHost::new(max_memory, 100, false).unwrap();
    host.load(&guests.chaos, "s".into(), handler_timeout, sandbox)
        .unwrap()
}

/// `data` as a record, handled once by `instance`.
async fn call(instance: &mut Instance, data: &str) -> Result<Outcome, CallError> {
    let mut record = delivery("k", 1).record;
    Arc::get_mut(&mut record).unwrap().data = data.as_bytes().to_vec();
    instance
        .handle(&record, 1, &mut CallState::default())
        .await
        .map(|handled| handled.outcome)
}

/// Catches a trap that is not reported as one (the lane would not retry
/// the record on a fresh instance) and an instance that cannot be made
/// again after a trap.
#[tokio::test]
async fn a_trap_is_a_trap_that_spoils_the_instance_and_a_fresh_one_works() {
    let plugin = chaos(Duration::from_secs(10), 64 << 20);
    let mut instance = plugin.instantiate(LaneId(0)).await.unwrap();
    assert_eq!(call(&mut instance, "hello").await.unwrap(), Outcome::Ack);
    let trapped = call(&mut instance, "trap").await.unwrap_err();
    assert!(matches!(trapped, CallError::Trap(_)), "{trapped:?}");
    assert!(trapped.spoils_instance());
    let mut fresh = plugin.instantiate(LaneId(0)).await.unwrap();
    assert_eq!(call(&mut fresh, "hello").await.unwrap(), Outcome::Ack);
}

/// Catches a call that runs past `handler_timeout` (an endless loop would
/// hold its lane, and the shard, for ever).
#[tokio::test]
async fn an_endless_call_ends_at_its_deadline() {
    let plugin = chaos(Duration::from_millis(200), 64 << 20);
    let mut instance = plugin.instantiate(LaneId(0)).await.unwrap();
    let started = std::time::Instant::now();
    let timed_out = call(&mut instance, "loop").await.unwrap_err();
    assert!(matches!(timed_out, CallError::Timeout(_)), "{timed_out:?}");
    assert!(timed_out.spoils_instance());
    // Bounded by the deadline plus an epoch tick or two, not by the loop.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// Catches a guest that allocates without bound and is not stopped at
/// its memory cap as out of memory (it would take the host's memory, or
/// be reported as an ordinary trap).
#[tokio::test]
async fn a_memory_blow_up_is_out_of_memory_at_the_cap() {
    let plugin = chaos(Duration::from_secs(10), 16 << 20);
    let mut instance = plugin.instantiate(LaneId(0)).await.unwrap();
    let blown = call(&mut instance, "alloc").await.unwrap_err();
    assert!(matches!(blown, CallError::OutOfMemory(_)), "{blown:?}");
    let mut fresh = plugin.instantiate(LaneId(0)).await.unwrap();
    assert_eq!(call(&mut fresh, "hello").await.unwrap(), Outcome::Ack);
}
