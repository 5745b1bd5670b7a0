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

use aws_smithy_types::error::display::DisplayErrorContext;

/// What caused an error of the host's (a [`crate::kinesis::KinesisError`],
/// a [`crate::lease::LeaseError`]): an SDK's error, kept whole and shown
/// as the SDKs show one (`DisplayErrorContext`: its chain of causes, then
/// its details — the request id, the response), or a message of the
/// host's own. Cheap to clone.
#[derive(Clone)]
pub enum Cause {
    /// An error, kept whole.
    Error(Arc<dyn std::error::Error + Send + Sync>),
    /// A message of the host's own.
    Message(Arc<str>),
}

impl Cause {
    /// The cause `error`.
    pub(crate) fn new(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Error(Arc::new(error))
    }

    /// The error itself (to inspect its type); `None` for a message.
    #[cfg(test)]
    pub(crate) fn get(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        match self {
            Self::Error(error) => Some(&**error),
            Self::Message(_) => None,
        }
    }
}

impl From<String> for Cause {
    fn from(message: String) -> Self {
        Self::Message(message.into())
    }
}

impl From<&str> for Cause {
    fn from(message: &str) -> Self {
        Self::Message(message.into())
    }
}

/// One line, as a log line needs it.
impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Error(error) => write!(f, "{}", DisplayErrorContext(&**error)),
            Self::Message(message) => f.write_str(message),
        }
    }
}

impl fmt::Debug for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Error(error) => fmt::Debug::fmt(error, f),
            Self::Message(message) => fmt::Debug::fmt(message, f),
        }
    }
}

/// A leaf of the error chain: its `Display` already shows the whole chain
/// of the error it holds, so walking on would show that chain again. The
/// error itself stays inside (tests inspect its type through
/// `Cause::get`).
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
