//! The `composer.v1` API as Rust types and tonic services, generated at build
//! time from `api/composer/v1`. Nothing here is written by hand but this file.

#![allow(clippy::all, missing_docs)]

/// Messages and services of package `composer.v1`.
pub mod v1 {
    tonic::include_proto!("composer.v1");
}

/// The encoded `FileDescriptorSet` of the API (with comments), served by the
/// reflection service so `grpcurl` needs no proto files.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/composer_descriptor.bin"));

/// The protocol version this build speaks, `<major>.<minor>`.
pub const PROTOCOL_VERSION: &str = "1.0";
