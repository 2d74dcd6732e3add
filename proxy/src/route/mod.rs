//! Where a listener's requests go.
//!
//! - [`table`]: a listener's routes compiled for matching: by host, then in file order on the
//!   normalised path, method and headers.
//! - [`decision`]: a request's route (its upstream, or a local answer, and its edits), and the
//!   rules for a listener's clients, read anew per request so open connections follow a reload.

pub(crate) mod decision;
pub(crate) mod table;
