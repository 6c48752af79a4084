//! The loops the clock drives: schedules that start runs, and recovery of
//! due timers, lapsed leases and lost messages.

pub mod recovery;
pub mod schedules;
