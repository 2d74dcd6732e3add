//! What the configuration file is made of, below the tables that use it: the errors that point
//! into the file, and the value types several tables share. `config` and the feature modules
//! (`modules`) both build on it, so neither needs the other's internals for these.
//!
//! - [`error`]: a configuration error and where in the file it points; every error at once.
//! - [`values`]: durations and sizes as the file writes them.
//! - [`keys`]: every table's keys, read from the serde types that read the file.
//! - [`template`]: a text with `{variables}` from the request it is written for.
//! - [`request_key`]: what a request is known by (its client, target, a header, a cookie), for
//!   `hash` balancing and rate zones.

pub mod error;
pub(crate) mod keys;
pub mod request_key;
pub mod template;
pub mod values;
