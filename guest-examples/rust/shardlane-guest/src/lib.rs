//! The Rust guest library of contract `shardlane:plugin@0.3.0`: write a
//! handler one record at a time, export the contract's `handle-run`.
//!
//! A 0.3.0 `record-handler` (and `windowed-record-handler`) exports
//! `handle-run`: a run of one shard's records in order, handled until the
//! first that is not acked, whose outcomes come back (the host delivers
//! the records after it again). [`handle_each`] is that loop, and
//! [`export_runs!`] writes the `Guest` impl around a type's per-record
//! `handle` with it, so a plugin never gets the loop wrong (a record
//! handled after a `retry` would break its key's order).
//!
//! ```ignore
//! wit_bindgen::generate!({ world: "record-handler", path: "wit", generate_all });
//!
//! struct Audit;
//!
//! impl Audit {
//!     /// `input`: the record's place in the run (what `state` and
//!     /// `outputs` calls name it by).
//!     fn handle(run: &RunContext, input: u32, record: RunRecord) -> Outcome {
//!         Outcome::Ack
//!     }
//! }
//!
//! shardlane_guest::export_runs!(Audit);              // or (Audit, windowed): also
//! export!(Audit);                                    // `fn close_window(ClosedWindow) -> Outcome`
//! ```
//!
//! The bindings stay the plugin's own (`wit_bindgen::generate!` in its
//! crate): the macro expands there, against the types it generated.

/// Handles `records` in order with `handle` (given each record's place in
/// the run), stopping after the first whose outcome `acked` says is not
/// an ack; returns the outcomes so far, one per record handled.
pub fn handle_each<R, O>(
    records: Vec<R>,
    acked: impl Fn(&O) -> bool,
    mut handle: impl FnMut(u32, R) -> O,
) -> Vec<O> {
    let mut outcomes = Vec::with_capacity(records.len());
    for (input, record) in records.into_iter().enumerate() {
        let outcome = handle(input as u32, record);
        let stop = !acked(&outcome);
        outcomes.push(outcome);
        if stop {
            break;
        }
    }
    outcomes
}

/// Implements the world's `Guest` for `$handler` from its
/// `fn handle(run: &RunContext, input: u32, record: RunRecord) -> Outcome`
/// (see the crate docs); with `windowed`, also `close-window` from its
/// `fn close_window(window: ClosedWindow) -> Outcome`.
#[macro_export]
macro_rules! export_runs {
    ($handler:ty) => {
        impl Guest for $handler {
            $crate::handle_run_from!($handler);
        }
    };
    ($handler:ty, windowed) => {
        impl Guest for $handler {
            $crate::handle_run_from!($handler);

            fn close_window(window: ClosedWindow) -> Outcome {
                <$handler>::close_window(window)
            }
        }
    };
}

/// The `handle_run` of [`export_runs!`] (not for direct use).
#[doc(hidden)]
#[macro_export]
macro_rules! handle_run_from {
    ($handler:ty) => {
        fn handle_run(run: RunContext, records: Vec<RunRecord>) -> Vec<Outcome> {
            $crate::handle_each(
                records,
                |o| matches!(o, Outcome::Ack),
                |input, record| <$handler>::handle(&run, input, record),
            )
        }
    };
}

#[cfg(test)]
mod tests {
    use super::handle_each;

    /// Catches: a record handled after one that was not acked (its key's
    /// order broken), or an outcome lost.
    #[test]
    fn stops_after_the_first_record_not_acked() {
        let mut seen = Vec::new();
        let outcomes = handle_each(
            vec!["a", "b", "c"],
            |o: &&str| *o == "ack",
            |i, r| {
                seen.push((i, r));
                if r == "b" { "retry" } else { "ack" }
            },
        );
        assert_eq!(outcomes, ["ack", "retry"]);
        assert_eq!(seen, [(0, "a"), (1, "b")]);
        assert!(handle_each(Vec::<&str>::new(), |_: &&str| true, |_, r| r).is_empty());
        assert_eq!(
            handle_each(vec![1, 2], |_| true, |i, r| r + i as i32),
            [1, 3]
        );
    }
}
