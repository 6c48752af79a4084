//! composer-coordinator
