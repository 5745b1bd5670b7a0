//! End-to-end tests: the real `shardlane` binary against real emulators.
//!
//! One test binary, one module per topic (as in wasmtime's `tests/all`).
//! Every test that needs Kinesis starts its own `kinesis-local` on a free
//! port with random stream names, and fails loudly when it cannot start.
//!
//! A test fails loudly by unwrapping, and reads as one scenario from start
//! to end: the workspace's `unwrap_used` and `too_many_lines` lints (for
//! the host's own code) do not apply here.

#![allow(clippy::unwrap_used, clippy::too_many_lines)]

mod admin;
mod aws;
mod batches;
mod budget;
mod chaos;
mod check;
mod common;
mod config;
mod conformance;
mod container;
mod emf;
mod examples;
mod failures;
mod fan_out;
mod faults;
mod files;
mod filters;
mod fleet;
mod hostile;
mod import_kcl;
mod kpl;
mod lanes;
mod leases;
mod local_loop;
mod ops;
mod outputs;
mod packaging;
mod pipeline;
mod repair;
mod state;
mod store_faults;
mod traces;
mod versions;
mod windows;
