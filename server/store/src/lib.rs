//! composer-store
