//! Helpers shared by the integration tests.
pub mod data;
pub mod s3s;
