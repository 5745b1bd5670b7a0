//! Generated bindings for every contract version the host runs: the
//! current `shardlane:plugin@0.3.0` (`wit/`, four worlds) and the frozen
//! 0.2.0 (`wit/v0.2.0`) and 0.1.0 (`wit/v0.1.0`), each with its two
//! worlds.
//!
//! In each version the batch world reuses the record world's interface
//! bindings (`with:`), so one host implementation of `log` (and `outputs`, `state`)
//! serves both worlds and the Rust types of a record and an outcome are the
//! same in both. The 0.2.0 worlds' WASI imports (`wasi:http`, `wasi:io`,
//! `wasi:clocks`) map onto wasmtime-wasi's and wasmtime-wasi-http's own
//! bindings, which the linker gets from those crates.
//!
//! Exports are async: a call can yield at every epoch tick, which is what
//! lets the host time out a guest that loops (see [`super`]). The generated
//! `*Pre` types look every export up once, before any instantiation.

/// `shardlane:plugin@0.1.0`, frozen.
pub(super) mod v1 {
    /// The `record-handler` world and the shared interfaces.
    pub(crate) mod record {
        wasmtime::component::bindgen!({
            path: "../wit/v0.1.0",
            world: "shardlane:plugin/record-handler@0.1.0",
            exports: { default: async },
            // Records are lowered into the guest straight from borrowed host
            // data: no String/Vec copies per record per call.
            ownership: Borrowing { duplicate_if_necessary: false },
        });
    }

    /// The `batch-handler` world.
    pub(crate) mod batch {
        wasmtime::component::bindgen!({
            path: "../wit/v0.1.0",
            world: "shardlane:plugin/batch-handler@0.1.0",
            exports: { default: async },
            ownership: Borrowing { duplicate_if_necessary: false },
            with: {
                "shardlane:plugin/types": super::record::shardlane::plugin::types,
                "shardlane:plugin/log": super::record::shardlane::plugin::log,
            },
        });
    }

    pub(crate) use record::shardlane::plugin::log;
    pub(crate) use record::shardlane::plugin::types::{KinesisRecord, Outcome};
}

/// `shardlane:plugin@0.2.0`, frozen.
pub(super) mod v2 {
    /// The `record-handler` world and the shared interfaces.
    pub(crate) mod record {
        wasmtime::component::bindgen!({
            path: "../wit/v0.2.0",
            world: "shardlane:plugin/record-handler@0.2.0",
            exports: { default: async },
            ownership: Borrowing { duplicate_if_necessary: false },
            with: {
                "wasi:io": wasmtime_wasi::p2::bindings::io,
                "wasi:clocks": wasmtime_wasi::p2::bindings::clocks,
                "wasi:http": wasmtime_wasi_http::p2::bindings::http,
            },
        });
    }

    /// The `batch-handler` world.
    pub(crate) mod batch {
        wasmtime::component::bindgen!({
            path: "../wit/v0.2.0",
            world: "shardlane:plugin/batch-handler@0.2.0",
            exports: { default: async },
            ownership: Borrowing { duplicate_if_necessary: false },
            with: {
                "shardlane:plugin/types": super::record::shardlane::plugin::types,
                "shardlane:plugin/log": super::record::shardlane::plugin::log,
                "shardlane:plugin/outputs": super::record::shardlane::plugin::outputs,
                "shardlane:plugin/state": super::record::shardlane::plugin::state,
                "wasi:config/store": super::record::wasi::config::store,
                "wasi:io": wasmtime_wasi::p2::bindings::io,
                "wasi:clocks": wasmtime_wasi::p2::bindings::clocks,
                "wasi:http": wasmtime_wasi_http::p2::bindings::http,
            },
        });
    }

    pub(crate) use record::shardlane::plugin::log;
    pub(crate) use record::shardlane::plugin::outputs;
    pub(crate) use record::shardlane::plugin::state;
    pub(crate) use record::shardlane::plugin::types::{KinesisRecord, Outcome};
    pub(crate) use record::wasi::config::store as config;
}

/// `shardlane:plugin@0.3.0`, the current contract: runs of records, and
/// the windowed worlds with `close-window`.
///
/// Each interface is bound once, by the first world that uses it, and the
/// others reuse it (`with:`), so one host implementation of `log`,
/// `outputs` and `state` serves the four worlds. The record types live in
/// interfaces of their own (`runs`, `batches`, `windows`) because
/// borrowed lowering cannot bind a type that no export of the world
/// passes in (bindgen gives it a lifetime it does not declare).
pub(super) mod v3 {
    /// The `record-handler` world and the shared interfaces.
    pub(crate) mod record {
        wasmtime::component::bindgen!({
            path: "../wit",
            world: "shardlane:plugin/record-handler@0.3.0",
            exports: { default: async },
            ownership: Borrowing { duplicate_if_necessary: false },
            with: {
                "wasi:config/store": super::super::v2::record::wasi::config::store,
                "wasi:io": wasmtime_wasi::p2::bindings::io,
                "wasi:clocks": wasmtime_wasi::p2::bindings::clocks,
                "wasi:http": wasmtime_wasi_http::p2::bindings::http,
            },
        });
    }

    /// The `batch-handler` world.
    pub(crate) mod batch {
        wasmtime::component::bindgen!({
            path: "../wit",
            world: "shardlane:plugin/batch-handler@0.3.0",
            exports: { default: async },
            ownership: Borrowing { duplicate_if_necessary: false },
            with: {
                "shardlane:plugin/types": super::record::shardlane::plugin::types,
                "shardlane:plugin/log": super::record::shardlane::plugin::log,
                "shardlane:plugin/outputs": super::record::shardlane::plugin::outputs,
                "shardlane:plugin/state": super::record::shardlane::plugin::state,
                "wasi:config/store": super::super::v2::record::wasi::config::store,
                "wasi:io": wasmtime_wasi::p2::bindings::io,
                "wasi:clocks": wasmtime_wasi::p2::bindings::clocks,
                "wasi:http": wasmtime_wasi_http::p2::bindings::http,
            },
        });
    }

    /// The `windowed-record-handler` world.
    pub(crate) mod windowed_record {
        wasmtime::component::bindgen!({
            path: "../wit",
            world: "shardlane:plugin/windowed-record-handler@0.3.0",
            exports: { default: async },
            ownership: Borrowing { duplicate_if_necessary: false },
            with: {
                "shardlane:plugin/types": super::record::shardlane::plugin::types,
                "shardlane:plugin/log": super::record::shardlane::plugin::log,
                "shardlane:plugin/outputs": super::record::shardlane::plugin::outputs,
                "shardlane:plugin/state": super::record::shardlane::plugin::state,
                "shardlane:plugin/runs": super::record::shardlane::plugin::runs,
                "wasi:config/store": super::super::v2::record::wasi::config::store,
                "wasi:io": wasmtime_wasi::p2::bindings::io,
                "wasi:clocks": wasmtime_wasi::p2::bindings::clocks,
                "wasi:http": wasmtime_wasi_http::p2::bindings::http,
            },
        });
    }

    /// The `windowed-batch-handler` world.
    pub(crate) mod windowed_batch {
        wasmtime::component::bindgen!({
            path: "../wit",
            world: "shardlane:plugin/windowed-batch-handler@0.3.0",
            exports: { default: async },
            ownership: Borrowing { duplicate_if_necessary: false },
            with: {
                "shardlane:plugin/types": super::record::shardlane::plugin::types,
                "shardlane:plugin/log": super::record::shardlane::plugin::log,
                "shardlane:plugin/outputs": super::record::shardlane::plugin::outputs,
                "shardlane:plugin/state": super::record::shardlane::plugin::state,
                "shardlane:plugin/batches": super::batch::shardlane::plugin::batches,
                "shardlane:plugin/windows": super::windowed_record::shardlane::plugin::windows,
                "wasi:config/store": super::super::v2::record::wasi::config::store,
                "wasi:io": wasmtime_wasi::p2::bindings::io,
                "wasi:clocks": wasmtime_wasi::p2::bindings::clocks,
                "wasi:http": wasmtime_wasi_http::p2::bindings::http,
            },
        });
    }

    pub(crate) use batch::shardlane::plugin::batches::KinesisRecord;
    pub(crate) use record::shardlane::plugin::log;
    pub(crate) use record::shardlane::plugin::outputs;
    pub(crate) use record::shardlane::plugin::runs::{RunContext, RunRecord};
    pub(crate) use record::shardlane::plugin::state;
    pub(crate) use record::shardlane::plugin::types::{Outcome, Window};
    pub(crate) use windowed_record::shardlane::plugin::windows::ClosedWindow;
}
