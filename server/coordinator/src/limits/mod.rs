//! How much one namespace or one request may take: namespace quotas and
//! the CPU pool that CPU-heavy checks wait their turn in.

pub mod cpu_pool;
pub mod quotas;
