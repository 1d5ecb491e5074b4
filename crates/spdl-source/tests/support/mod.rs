//! Helpers shared by the integration tests.
pub mod s3s;
