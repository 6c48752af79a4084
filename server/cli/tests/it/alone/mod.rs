//! Tests that need the machine to themselves: they drive a server hard
//! (the abuse suite, 10,000-run bulk operations), compare one namespace's
//! latency with another's, or count what is in the harness's Redis.
//! `make test` runs them one at a time, after the rest
//! (`cargo test -p composer-cli --test it alone:: -- --test-threads=1`).

mod abuse;
mod amplification;
mod bulk;
mod costly_requests;
mod polling;
mod quotas;
mod watch_streams;
