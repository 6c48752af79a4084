//! composer-engine
