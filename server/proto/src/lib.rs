//! composer-proto
