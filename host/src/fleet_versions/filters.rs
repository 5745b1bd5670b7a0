//! The filter rules of a subscription's fleet versions (see "A filter is
//! part of the version" in [`super`]): the stable version's filter set
//! and its text kept, the texts a rollback may return to, and the filters
//! configs declared.

use super::{DECLARED_KEPT, FILTERS_KEPT, FleetVersions, VersionsError};
use crate::filter::FilterText;
use crate::ids::FilterDigest;

impl FleetVersions {
    /// Makes `text` the stable version's filter, keeping its text.
    pub(super) fn set_filter(&mut self, text: Option<FilterText>) {
        self.filter_declared = true;
        self.filter = text.as_ref().map(|t| t.digest.clone());
        if let Some(text) = text
            && !self.filters.iter().any(|t| t.digest == text.digest)
        {
            self.filters.push(text);
        }
    }

    /// Keeps the texts of the stable filter and of the latest distinct
    /// ones before it ([`FILTERS_KEPT`] in all).
    pub(super) fn keep_filters(&mut self) {
        let mut wanted: Vec<&FilterDigest> = self.filter.iter().collect();
        for change in self.history.iter().rev().filter(|c| c.made_stable()) {
            if wanted.len() >= FILTERS_KEPT {
                break;
            }
            if let Some(digest) = &change.filter
                && !wanted.contains(&digest)
            {
                wanted.push(digest);
            }
        }
        let wanted: Vec<FilterDigest> = wanted.into_iter().cloned().collect();
        self.filters.retain(|t| wanted.contains(&t.digest));
    }

    /// The text of the stable version's filter (`None`: no filter).
    ///
    /// # Errors
    /// [`VersionsError::FilterGone`] when its text is missing (a value
    /// written by hand).
    pub fn stable_filter(&self) -> Result<Option<&FilterText>, VersionsError> {
        match &self.filter {
            None => Ok(None),
            Some(digest) => self
                .filters
                .iter()
                .find(|t| &t.digest == digest)
                .map(Some)
                .ok_or_else(|| VersionsError::FilterGone(digest.clone())),
        }
    }

    /// Notes that a config declared the filter `digest` (the last
    /// [`DECLARED_KEPT`]).
    pub(super) fn remember_declared_filter(&mut self, digest: Option<FilterDigest>) {
        self.declared_filters.retain(|d| d != &digest);
        self.declared_filters.push(digest);
        if self.declared_filters.len() > DECLARED_KEPT {
            self.declared_filters.remove(0);
        }
    }
}

/// A filter in words, for notes and messages.
pub(super) fn filter_words(filter: Option<&FilterDigest>) -> String {
    match filter {
        Some(digest) => format!("filter {}", digest.short()),
        None => "no filter".to_owned(),
    }
}
