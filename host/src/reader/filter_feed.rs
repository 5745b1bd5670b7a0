//! The filter a subscription's readers apply, as the fleet's versions
//! change it: a filter is part of a deployed version (see
//! `crate::fleet_versions`, "A filter is part of the version"), so it
//! swaps while the readers run.
//!
//! The rollout stage owns the sending side and replaces the
//! [`ActiveFilter`] when the fleet's stable version (its plugin or its
//! filter) changes; each reader takes the latest one once per page of
//! records (one lock-free-in-practice borrow and an `Arc` clone per page),
//! so a swap takes effect at the next page, and a record is either
//! filtered or delivered by one filter, never judged twice. A replay, a
//! redrive and `shardlane test` run the one filter they were given
//! ([`ActiveFilter::fixed`]).
//!
//! Part of the reader stage (floor 6).

use std::sync::Arc;

use tokio::sync::watch;

use crate::filter::Filter;
use crate::ids::{PluginDigest, SubscriptionName};
use crate::telemetry::{Counter, Telemetry};

/// The filter in force and the counter of what it keeps out, labelled with
/// the version it belongs to.
pub(crate) struct ActiveFilter {
    /// The filter; `None` lets every record in.
    pub(crate) filter: Option<Arc<Filter>>,
    /// `shardlane_records_filtered_total` for this subscription, stable
    /// plugin and filter.
    pub(crate) filtered: Counter,
    /// The stable plugin of the version.
    version: PluginDigest,
}

/// What readers watch: the latest [`ActiveFilter`].
pub(crate) type FilterFeed = watch::Receiver<Arc<ActiveFilter>>;

impl ActiveFilter {
    /// `filter`, as part of the version whose plugin is `version`.
    pub(crate) fn new(
        telemetry: &Telemetry,
        subscription: &SubscriptionName,
        version: &PluginDigest,
        filter: Option<Arc<Filter>>,
    ) -> Self {
        let filter_label = filter
            .as_ref()
            .map_or("none", |f| f.digest().short())
            .to_owned();
        let filtered = telemetry.counter(
            "shardlane_records_filtered_total",
            "Records that matched none of the subscription's filter patterns: settled without a handler call (by the version's plugin and filter).",
            &[
                ("subscription", subscription.as_str()),
                ("version", version.short()),
                ("filter", &filter_label),
            ],
        );
        Self {
            filter,
            filtered,
            version: version.clone(),
        }
    }

    /// A feed that never changes: `filter` for a pipeline that runs one
    /// version.
    pub(crate) fn fixed(
        telemetry: &Telemetry,
        subscription: &SubscriptionName,
        version: &PluginDigest,
        filter: Option<Arc<Filter>>,
    ) -> FilterFeed {
        let active = Self::new(telemetry, subscription, version, filter);
        watch::channel(Arc::new(active)).1
    }

    /// Whether this is `filter` as part of the version whose plugin is
    /// `version`.
    pub(crate) fn is(&self, version: &PluginDigest, filter: Option<&Filter>) -> bool {
        &self.version == version
            && self.filter.as_deref().map(Filter::digest) == filter.map(Filter::digest)
    }
}
