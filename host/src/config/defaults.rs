//! Defaults, with the reasoning behind each.

use std::time::Duration;

/// Kinesis allows 5 GetRecords calls per shard per second, shared by
/// every consumer of the stream. The budget is the whole of it, as KCL's
/// 200 ms minimum between reads is: a shard read by shardlane alone keeps
/// the latency five reads a second give, and where other readers take
/// reads the throttling they meet lowers shardlane's rate to what they
/// leave (`reader/pace.rs`). A quiet shard leaves room by itself (see
/// `POLL_IDLE_MAX`). Set 4 to reserve a read a second up front.
pub const MAX_READS_PER_SECOND: f64 = 5.0;
/// An empty read waits this long while the shard had records lately:
/// the read budget's spacing, so a new record is about 100 ms away on
/// average (the latency before the budget existed).
pub const POLL_IDLE: Duration = Duration::from_millis(200);
/// A shard empty for 30 s backs off to one read every 1.5 s, KCL's
/// default time between reads (`idleTimeBetweenReadsInMillis`; Lambda
/// polls about once a second): an idle subscription costs little CPU
/// (an empty read costs the SDK 0.4–0.6 ms of CPU, an idle shard about
/// 0.04 % of a core; BENCHMARKS.md, "Memory and idle polling") and leaves
/// the shard's reads to others. The price: the first record on a shard
/// quiet for 30 s or more waits up to 1.5 s (0.75 s on average) for its
/// read; a shard with a record every few seconds keeps `POLL_IDLE`.
pub const POLL_IDLE_MAX: Duration = Duration::from_millis(1500);
/// Six checkpoint writes a minute per busy shard (an idle one writes none:
/// a checkpoint is written only when the position moved). A crash
/// redelivers at most the last 10 s of records (a graceful stop or
/// hand-over writes the final checkpoint, and redelivers nothing); state
/// commits batch 10 s of key writes. The trade-off is a table in the
/// book's "Lease stores" (docs/src/user-guide/lease-stores.md); KCL's samples checkpoint every 60 s, Lambda
/// after every batch.
pub const CHECKPOINT_EVERY: Duration = Duration::from_secs(10);
/// Small reads keep the records held by a blocked reader (read but not
/// yet in the channel) bounded; Kinesis allows up to 10,000.
pub const READ_LIMIT: i32 = 1_000;
/// A handler that takes longer than this is stuck, not slow.
pub const HANDLER_TIMEOUT: Duration = Duration::from_secs(30);
/// One outbound HTTP request (connect, first byte, between bytes).
pub const HTTP_TIMEOUT: Duration = Duration::from_secs(5);
/// Most response body bytes a plugin reads per HTTP request.
pub const HTTP_MAX_RESPONSE: u64 = 1 << 20;
/// First retry backoff.
pub const RETRY_BACKOFF_INITIAL: Duration = Duration::from_millis(100);
/// Retry backoff cap.
pub const RETRY_BACKOFF_MAX: Duration = Duration::from_secs(30);
/// Time given to in-flight records on shutdown.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);
/// A batch waits at most this long for more records after its first.
/// (Not Lambda's default: Lambda's batching window defaults to 0 and
/// passes what one read returned; 50 ms fills batches across reads of
/// several shards for a small latency.)
pub const BATCH_WINDOW: Duration = Duration::from_millis(50);
/// Most lanes a subscription may run: each owns a Wasm instance.
pub const MAX_WORKERS: i64 = 256;
/// Most records per batch (Lambda's Kinesis maximum).
pub const MAX_BATCH_SIZE: i64 = 10_000;
/// Most bytes per batch: Lambda's 6 MB invocation payload, and well
/// inside the default `max_memory`, so a full batch can be lowered
/// into the guest.
pub const MAX_BATCH_BYTES: usize = 6 << 20;
/// A TCP (and TLS) connection to an AWS endpoint normally takes
/// milliseconds; 3 s is many round trips on a slow network, and an
/// endpoint that accepts nothing for that long is down.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Kinesis and DynamoDB answer in tens of milliseconds; 10 s leaves
/// room for seconds of added network latency, and a renewal still
/// lands within the default lease duration.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// One attempt: connection plus a whole answer (a GetRecords answer is
/// up to 10 MB).
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(15);
/// One call with the SDK's retries (three attempts).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// An artifact store (S3, a registry, a folder) that accepts no
/// connection for 3 s is down, as an AWS endpoint is.
pub const ARTIFACT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// A store that has not started answering in 10 s (or stalls that long
/// mid-answer) is hung: the fetch is tried again after a backoff.
pub const ARTIFACT_FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(10);
/// A whole store or fetch: a 64 MiB component (the largest a plugin may
/// be) at about 1 MiB/s, so a slow link completes and a hung one is cut.
pub const ARTIFACT_TRANSFER_TIMEOUT: Duration = Duration::from_secs(60);
/// KCL's default: a lease whose counter has not moved for 10 s is free.
pub const LEASE_DURATION: Duration = Duration::from_secs(10);
/// Renew three times per lease duration, so one slow renewal is harmless.
pub const RENEW_EVERY: Duration = Duration::from_secs(3);
/// Picks up new shards after a reshard within this interval.
pub const SHARD_SYNC_EVERY: Duration = Duration::from_secs(10);
/// Memory per guest instance: ample for handlers in Rust (about 1 MiB)
/// and Python or JavaScript (tens of MiB), small enough that a runaway
/// guest cannot exhaust the host.
pub const MAX_MEMORY: usize = 128 << 20;
/// Guest log lines per second per instance; a burst of twice that is
/// allowed. Enough for a line per record at a thousand records a second
/// per lane; a guest logging in a loop is cut off.
pub const LOG_RATE: u32 = 1_000;
/// How often metrics are written as CloudWatch EMF (`[metrics] emf_every`):
/// CloudWatch's standard resolution.
pub const EMF_EVERY: Duration = Duration::from_secs(60);
/// Where the operations server listens: loopback only.
pub const ADMIN_LISTEN: &str = "127.0.0.1:9090";
/// Where the file lease store keeps its database.
pub const FILE_STORE_PATH: &str = "shardlane-state";
/// Core module instances per component: the Rust and JavaScript
/// examples have 3, the C ones 4, the Python ones (componentize-py
/// 0.25) 14; room to spare for larger runtimes.
pub const MAX_CORE_INSTANCES: u32 = 64;
/// The most `engine.max_core_instances` may be: each slot of the pool
/// reserves room for this many instances.
pub const MAX_CORE_INSTANCES_LIMIT: u32 = 1_024;

/// Largest value a `state.set` may write.
pub const STATE_MAX_VALUE: u64 = 64 << 10;

/// Most bytes one partition key's state may hold (names and values, and 24
/// bytes per value).
pub const STATE_MAX_PER_KEY: u64 = 128 << 10;

/// The most `state.max_per_key` may be with the DynamoDB store: a key's
/// item holds its committed and its pending state, in at most 400 KB.
pub const STATE_MAX_PER_KEY_DYNAMODB: u64 = 192 << 10;

/// Records a canary's candidate must have handled, fleet-wide, before its
/// rules judge it: at 100 a 5-point rule is not tripped by a handful of
/// unlucky records, and a busy stream reaches it in seconds.
pub const CANARY_MIN_RECORDS: u64 = 100;

/// Keys a subscription's quarantine parks at once (`quarantine.max_keys`):
/// a few poison keys are an incident, a hundred an outage better blocked
/// and looked at. Each parked key is an item of its own (one small write
/// to park it), so the bound is about attention, not storage.
pub const QUARANTINE_MAX_KEYS: usize = 100;
/// The most `quarantine.max_keys` may be: a shard's reader reads every
/// parked key before it starts (100,000 keys of 256 bytes are about 60 MB
/// to read and 30 MB to hold).
pub const QUARANTINE_MAX_KEYS_LIMIT: usize = 100_000;

/// Records one parked key holds (`quarantine.max_records`): each costs a
/// conditional lease-store write and a dead-letter put.
pub const QUARANTINE_MAX_RECORDS: u64 = 100_000;

/// How long past its end a window stays open on a quiet shard.
pub const WINDOW_GRACE: Duration = Duration::from_secs(1);
/// The longest window (Lambda's `TumblingWindowInSeconds` bound).
pub const WINDOW_MAX_SIZE: Duration = Duration::from_secs(900);
