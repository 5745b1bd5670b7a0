//! Generated bindings for the `shardlane:plugin@0.1.0` worlds (`wit/`).
//!
//! Two worlds share the `types` and `log` interfaces: `record-handler`
//! (export `handle`) and `batch-handler` (export `handle-batch`). Both are
//! generated here, the batch world reusing the record world's interface
//! bindings (`with:`) so one `log` host implementation serves both and the
//! Rust types of a record and an outcome are the same in both worlds.
//!
//! Exports are async: a call can yield at every epoch tick, which is what
//! lets the host time out a guest that loops (see [`super`]). The generated
//! `*Pre` types look every export up once, before any instantiation.

/// The `record-handler` world and the shared interfaces.
pub(super) mod record {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "record-handler",
        exports: { default: async },
        // Records are lowered into the guest straight from borrowed host
        // data: no String/Vec copies per record per call.
        ownership: Borrowing { duplicate_if_necessary: false },
    });
}

/// The `batch-handler` world.
pub(super) mod batch {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "batch-handler",
        exports: { default: async },
        ownership: Borrowing { duplicate_if_necessary: false },
        with: {
            "shardlane:plugin/types": super::record::shardlane::plugin::types,
            "shardlane:plugin/log": super::record::shardlane::plugin::log,
        },
    });
}

pub(super) use record::shardlane::plugin::log::{self, Level};
pub(super) use record::shardlane::plugin::types::{KinesisRecord, Outcome};
