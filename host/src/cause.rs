//! What caused an error: [`Cause`], an external error kept whole as the
//! `source` of the host's typed errors (never flattened to text), and
//! [`kinds`], the one shape of every table that maps an SDK's modeled
//! errors to the kinds a caller acts on (Kinesis's in
//! `kinesis/error.rs`, DynamoDB's in `lease/dynamodb/error.rs`).
//!
//! Floor 1 (ground values) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

use std::fmt;
use std::sync::Arc;

/// What caused an error of the host's (a [`crate::kinesis::KinesisError`],
/// a [`crate::lease::LeaseError`]): an SDK's error (shown with its whole
/// chain of causes, as the SDKs' `DisplayErrorContext` shows it), or a
/// message of the host's own. Cheap to clone.
#[derive(Clone)]
pub struct Cause(Arc<dyn std::error::Error + Send + Sync>);

impl Cause {
    /// The cause `error`.
    pub(crate) fn new(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self(Arc::new(error))
    }

    /// The error itself (to inspect its type).
    #[cfg(test)]
    pub(crate) fn get(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }
}

/// A cause of the host's own, said in words.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Message(String);

impl From<String> for Cause {
    fn from(message: String) -> Self {
        Self::new(Message(message))
    }
}

impl From<&str> for Cause {
    fn from(message: &str) -> Self {
        Self::from(message.to_owned())
    }
}

/// The error and its causes, `: `-separated, on one line.
impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

impl fmt::Debug for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

/// A leaf of the error chain: its `Display` already shows the whole chain
/// of the error it holds (one line, as a log line needs it), so walking
/// on would show that chain again. The error itself stays inside (tests
/// inspect its type through `Cause::get`).
impl std::error::Error for Cause {}

/// An SDK operation's modeled error, by the kind `K` its caller acts on
/// (`None`: none of them).
pub(crate) trait Classify<K> {
    /// The kind of this error.
    fn kind(&self) -> Option<K>;
}

/// Implements [`Classify`] for each operation error type listed: which of
/// its typed predicates (`is_*_exception`) mean which kind, tried in
/// order.
macro_rules! kinds {
    ($kind:ident; $($error:ty => [$($predicate:ident => $variant:ident),* $(,)?],)*) => {
        $(impl $crate::cause::Classify<$kind> for $error {
            fn kind(&self) -> Option<$kind> {
                $(if self.$predicate() {
                    return Some($kind::$variant);
                })*
                None
            }
        })*
    };
}
pub(crate) use kinds;
