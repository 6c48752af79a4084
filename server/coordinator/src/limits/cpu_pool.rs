//! The CPU pool (decision 0036): the CPU-heavy checks of request input
//! (compiling a definition, its CEL and JSON Schema, searching a cron
//! expression's fires, validating an input against a schema with regular
//! expressions) run here, on threads of their own, never on the runtime's
//! workers that serve every other call. The threads run at a lower
//! scheduling priority (`--cpu-pool-nice`, nice 5 by default): when the
//! machine is busy, serving calls comes first, so one namespace's checks
//! cost that namespace time.
//!
//! A fixed number of checks run at once (`--cpu-pool-threads`, the cores
//! by default); one namespace holds at most half of them (rounded up), so
//! a burst of expensive requests from one namespace costs that namespace
//! time and leaves the other half to everyone else. Each namespace may have
//! `--cpu-pool-queue` checks waiting, all namespaces eight times that; a
//! check past either is refused at once (RESOURCE_EXHAUSTED with a retry
//! delay) instead of queueing without end. Work a server needs for itself
//! (compiling a stored definition the cache lacks) waits instead of being
//! refused.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

/// Waiting checks of all namespaces together, as a multiple of what one
/// namespace may have waiting.
pub const WAITING_PER_NAMESPACE_QUEUES: usize = 8;

/// How long a refused caller is told to wait: checks take milliseconds.
pub const RETRY_AFTER: Duration = Duration::from_millis(200);

/// The pool's size, queue bounds and priority.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuPoolConfig {
    /// Checks that run at once: the pool's threads.
    pub threads: usize,
    /// Checks one namespace may have waiting.
    pub queue_per_namespace: usize,
    /// The nice value of the pool's threads (0 to 19; higher runs less
    /// when the machine is busy).
    pub nice: i32,
    /// The longest a caller's check waits for a thread before it is
    /// refused: shorter than the call's deadline, so a queue that does
    /// not move is RESOURCE_EXHAUSTED, not a timeout.
    pub max_wait: Duration,
}

impl Default for CpuPoolConfig {
    fn default() -> Self {
        Self {
            threads: std::thread::available_parallelism().map_or(2, usize::from),
            queue_per_namespace: 32,
            nice: 5,
            max_wait: Duration::from_millis(1_250),
        }
    }
}

/// A check handed to the pool's threads.
type Job = Box<dyn FnOnce() + Send + 'static>;

/// What a check does when the pool is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// A caller's request: refused when its namespace (or the pool) has
    /// as many checks waiting as it may.
    RefuseWhenFull,
    /// The server's own work: waits for a thread whatever the queue.
    Wait,
}

/// Why a check did not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CpuPoolError {
    /// The namespace already has as many checks waiting as it may.
    #[error(
        "namespace {namespace:?} has {waiting} CPU-heavy checks waiting already \
         (at most {limit}: --cpu-pool-queue); retry later"
    )]
    NamespaceQueueFull {
        /// The namespace.
        namespace: String,
        /// Its checks waiting.
        waiting: usize,
        /// What it may have waiting.
        limit: usize,
    },
    /// The server has as many checks waiting as it may.
    #[error("this server has {waiting} CPU-heavy checks waiting already; retry later")]
    ServerQueueFull {
        /// Checks waiting.
        waiting: usize,
    },
    /// The check waited its longest for a thread: the namespace's earlier
    /// checks (or everyone's) hold them.
    #[error(
        "a CPU-heavy check of namespace {namespace:?} waited {waited_ms} ms for a thread \
         without getting one; retry later"
    )]
    WaitedTooLong {
        /// The namespace.
        namespace: String,
        /// How long it waited.
        waited_ms: u128,
    },
    /// The check panicked (a bug): its request fails, the server goes on.
    #[error("a CPU-heavy check panicked")]
    Panicked,
}

/// One namespace's share of the pool.
#[derive(Debug)]
struct Lane {
    permits: Arc<Semaphore>,
    waiting: AtomicUsize,
}

#[derive(Debug)]
struct Inner {
    config: CpuPoolConfig,
    /// To the pool's threads; they end when the pool is dropped.
    jobs: std::sync::mpsc::Sender<Job>,
    /// Threads one namespace may hold.
    share: usize,
    permits: Arc<Semaphore>,
    waiting: AtomicUsize,
    /// Lanes of namespaces with checks waiting or running; a lane goes
    /// when its last check ends, so the map holds no namespace for long.
    lanes: Mutex<HashMap<String, Arc<Lane>>>,
}

/// The pool; cheap to clone (clones share it).
#[derive(Debug, Clone)]
pub struct CpuPool {
    inner: Arc<Inner>,
}

impl Default for CpuPool {
    fn default() -> Self {
        Self::new(CpuPoolConfig::default())
    }
}

/// A namespace's lane held by one check: drops the lane from the map when
/// no other check holds it.
struct LaneHold {
    inner: Arc<Inner>,
    namespace: String,
    lane: Arc<Lane>,
}

impl Drop for LaneHold {
    fn drop(&mut self) {
        let mut lanes = self.inner.lock_lanes();
        // the map's reference and this one: no other check holds the lane
        // (a new one would take it from the map, under this lock)
        if Arc::strong_count(&self.lane) == 2 {
            lanes.remove(&self.namespace);
        }
    }
}

/// A check counted as waiting, in its namespace and in the pool, until it
/// runs or its caller goes away.
struct Waiting<'a> {
    pool: &'a AtomicUsize,
    lane: &'a AtomicUsize,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.pool.fetch_sub(1, Ordering::AcqRel);
        self.lane.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Inner {
    fn lock_lanes(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Lane>>> {
        self.lanes.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl CpuPool {
    /// A pool of `config.threads` (at least one) threads, started now.
    pub fn new(config: CpuPoolConfig) -> Self {
        let threads = config.threads.max(1);
        let nice = config.nice.clamp(0, 19);
        let (jobs, queue) = std::sync::mpsc::channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        for index in 0..threads {
            let queue = Arc::clone(&queue);
            let spawned = std::thread::Builder::new()
                .name(format!("composer-cpu-{index}"))
                .spawn(move || work_through(&queue, nice));
            if let Err(error) = spawned {
                tracing::error!(%error, "could not start a cpu pool thread");
            }
        }
        Self {
            inner: Arc::new(Inner {
                config: CpuPoolConfig {
                    threads,
                    nice,
                    ..config
                },
                jobs,
                share: threads.div_ceil(2),
                permits: Arc::new(Semaphore::new(threads)),
                waiting: AtomicUsize::new(0),
                lanes: Mutex::default(),
            }),
        }
    }

    /// The pool's settings.
    pub fn config(&self) -> CpuPoolConfig {
        self.inner.config
    }

    /// Namespaces with checks waiting or running now.
    pub fn namespaces_in_use(&self) -> usize {
        self.inner.lock_lanes().len()
    }

    /// Runs `work` on one of the pool's threads once `namespace` may use
    /// one, and returns what it returned. The thread is held until `work`
    /// ends even if the caller goes away first, so the bound holds.
    pub async fn run<T: Send + 'static>(
        &self,
        namespace: &str,
        admission: Admission,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, CpuPoolError> {
        let hold = self.hold_lane(namespace);
        let (lane_permit, permit) = {
            let _waiting = self.wait_in_line(&hold, admission)?;
            let permits = async {
                let lane_permit = Arc::clone(&hold.lane.permits).acquire_owned().await;
                let permit = Arc::clone(&self.inner.permits).acquire_owned().await;
                match (lane_permit, permit) {
                    (Ok(lane_permit), Ok(permit)) => Ok((lane_permit, permit)),
                    _ => Err(CpuPoolError::Panicked),
                }
            };
            match admission {
                Admission::Wait => permits.await?,
                Admission::RefuseWhenFull => {
                    let max_wait = self.inner.config.max_wait;
                    match tokio::time::timeout(max_wait, permits).await {
                        Ok(permits) => permits?,
                        Err(_) => {
                            crate::observe::metrics::cpu_check_refused(namespace);
                            return Err(CpuPoolError::WaitedTooLong {
                                namespace: namespace.to_owned(),
                                waited_ms: max_wait.as_millis(),
                            });
                        }
                    }
                }
            }
        };
        let (answer, answered) = oneshot::channel();
        let job: Job = Box::new(move || {
            let held: (LaneHold, OwnedSemaphorePermit, OwnedSemaphorePermit) =
                (hold, lane_permit, permit);
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
            drop(held);
            // the caller may have gone: nobody to tell
            let _ = answer.send(outcome);
        });
        self.inner
            .jobs
            .send(job)
            .map_err(|_| CpuPoolError::Panicked)?;
        match answered.await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(_)) | Err(_) => Err(CpuPoolError::Panicked),
        }
    }

    fn hold_lane(&self, namespace: &str) -> LaneHold {
        let lane = {
            let mut lanes = self.inner.lock_lanes();
            Arc::clone(lanes.entry(namespace.to_owned()).or_insert_with(|| {
                Arc::new(Lane {
                    permits: Arc::new(Semaphore::new(self.inner.share)),
                    waiting: AtomicUsize::new(0),
                })
            }))
        };
        LaneHold {
            inner: Arc::clone(&self.inner),
            namespace: namespace.to_owned(),
            lane,
        }
    }

    /// Counts the check as waiting, or refuses it when its namespace or
    /// the pool has as many waiting as it may.
    fn wait_in_line<'a>(
        &'a self,
        hold: &'a LaneHold,
        admission: Admission,
    ) -> Result<Waiting<'a>, CpuPoolError> {
        let in_lane = hold.lane.waiting.fetch_add(1, Ordering::AcqRel);
        let in_pool = self.inner.waiting.fetch_add(1, Ordering::AcqRel);
        let waiting = Waiting {
            pool: &self.inner.waiting,
            lane: &hold.lane.waiting,
        };
        if admission == Admission::Wait {
            return Ok(waiting);
        }
        let limit = self.inner.config.queue_per_namespace;
        if in_lane >= limit {
            crate::observe::metrics::cpu_check_refused(&hold.namespace);
            return Err(CpuPoolError::NamespaceQueueFull {
                namespace: hold.namespace.clone(),
                waiting: in_lane,
                limit,
            });
        }
        if in_pool >= limit.saturating_mul(WAITING_PER_NAMESPACE_QUEUES) {
            crate::observe::metrics::cpu_check_refused(&hold.namespace);
            return Err(CpuPoolError::ServerQueueFull { waiting: in_pool });
        }
        Ok(waiting)
    }
}

/// A pool thread: lowers its own priority, then runs checks until the
/// pool is dropped.
fn work_through(queue: &Mutex<std::sync::mpsc::Receiver<Job>>, nice: i32) {
    // on Linux the nice value is a thread's own: this one only
    if nice > 0
        && let Err(error) = rustix::process::setpriority_process(None, nice)
    {
        tracing::warn!(%error, nice, "cpu pool thread keeps its priority");
    }
    loop {
        let next = queue.lock().unwrap_or_else(|p| p.into_inner()).recv();
        match next {
            Ok(job) => job(),
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;

    fn pool(threads: usize, queue_per_namespace: usize) -> CpuPool {
        CpuPool::new(CpuPoolConfig {
            threads,
            queue_per_namespace,
            nice: 10,
            max_wait: Duration::from_secs(60),
        })
    }

    /// A check that holds its thread until `release` is set.
    fn blocking(release: &Arc<AtomicBool>) -> impl FnOnce() + Send + 'static {
        let release = Arc::clone(release);
        move || {
            while !release.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    async fn until(what: impl Fn() -> bool) {
        for _ in 0..5_000 {
            if what() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("never happened");
    }

    #[tokio::test]
    async fn a_check_runs_off_the_runtime_and_returns_its_answer() {
        let pool = pool(2, 4);
        let runtime_thread = std::thread::current().id();
        let ran_on = pool
            .run("a", Admission::RefuseWhenFull, || {
                std::thread::current().id()
            })
            .await
            .expect("ran");
        assert_ne!(ran_on, runtime_thread);
        assert_eq!(
            pool.namespaces_in_use(),
            0,
            "the lane goes with its last check"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_namespace_holds_half_the_threads_and_another_still_runs() {
        let pool = pool(2, 8);
        let release = Arc::new(AtomicBool::new(false));
        let running = Arc::new(AtomicUsize::new(0));
        let mut greedy = Vec::new();
        for _ in 0..4 {
            let (pool, release, running) = (pool.clone(), release.clone(), running.clone());
            greedy.push(tokio::spawn(async move {
                pool.run("a", Admission::RefuseWhenFull, move || {
                    running.fetch_add(1, Ordering::AcqRel);
                    blocking(&release)();
                    running.fetch_sub(1, Ordering::AcqRel);
                })
                .await
            }));
        }
        until(|| running.load(Ordering::Acquire) == 1).await;
        // namespace a waits for its one thread; b gets the other at once
        let answer = tokio::time::timeout(
            Duration::from_secs(10),
            pool.run("b", Admission::RefuseWhenFull, || 42),
        )
        .await
        .expect("b is not held behind a")
        .expect("ran");
        assert_eq!(answer, 42);
        assert_eq!(
            running.load(Ordering::Acquire),
            1,
            "a never held two threads"
        );
        release.store(true, Ordering::Release);
        for check in greedy {
            check.await.expect("joined").expect("ran");
        }
        assert_eq!(pool.namespaces_in_use(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_namespace_past_its_queue_is_refused_at_once_and_the_server_waits() {
        let pool = pool(1, 2);
        let release = Arc::new(AtomicBool::new(false));
        let mut held = Vec::new();
        // one runs, two wait: the queue is full
        for _ in 0..3 {
            let (pool, release) = (pool.clone(), release.clone());
            held.push(tokio::spawn(async move {
                pool.run("a", Admission::RefuseWhenFull, blocking(&release))
                    .await
            }));
        }
        until(|| {
            pool.inner
                .lock_lanes()
                .get("a")
                .is_some_and(|lane| lane.waiting.load(Ordering::Acquire) == 2)
        })
        .await;
        let refused = pool
            .run("a", Admission::RefuseWhenFull, || ())
            .await
            .expect_err("refused");
        assert!(
            matches!(
                refused,
                CpuPoolError::NamespaceQueueFull {
                    waiting: 2,
                    limit: 2,
                    ..
                }
            ),
            "{refused:?}"
        );
        // the server's own work waits its turn instead
        let (waiter_pool, waited) = (pool.clone(), Arc::new(AtomicBool::new(false)));
        let waited_flag = waited.clone();
        let server_work = tokio::spawn(async move {
            waiter_pool
                .run("a", Admission::Wait, move || {
                    waited_flag.store(true, Ordering::Release)
                })
                .await
        });
        release.store(true, Ordering::Release);
        for check in held {
            check.await.expect("joined").expect("ran");
        }
        server_work.await.expect("joined").expect("ran");
        assert!(waited.load(Ordering::Acquire));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_caller_that_goes_away_leaves_the_thread_held_until_the_check_ends() {
        let pool = pool(1, 4);
        let release = Arc::new(AtomicBool::new(false));
        let started = Arc::new(AtomicBool::new(false));
        let (started_flag, work) = (started.clone(), blocking(&release));
        let caller = tokio::spawn({
            let pool = pool.clone();
            async move {
                pool.run("a", Admission::RefuseWhenFull, move || {
                    started_flag.store(true, Ordering::Release);
                    work()
                })
                .await
            }
        });
        until(|| started.load(Ordering::Acquire)).await;
        caller.abort();
        let _ = caller.await;
        assert_eq!(pool.inner.permits.available_permits(), 0);
        release.store(true, Ordering::Release);
        until(|| pool.inner.permits.available_permits() == 1).await;
        until(|| pool.namespaces_in_use() == 0).await;
    }

    #[tokio::test]
    async fn checks_run_at_the_pool_s_lower_priority_and_the_runtime_keeps_its_own() {
        let pool = pool(1, 4);
        let nice = pool
            .run("a", Admission::RefuseWhenFull, || {
                rustix::process::getpriority_process(None)
            })
            .await
            .expect("ran")
            .expect("getpriority");
        assert_eq!(nice, 10);
        let here = rustix::process::getpriority_process(None).expect("getpriority");
        assert_eq!(here, 0, "the caller's thread is untouched");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_check_that_waits_its_longest_for_a_thread_is_refused() {
        let pool = CpuPool::new(CpuPoolConfig {
            threads: 1,
            queue_per_namespace: 8,
            nice: 10,
            max_wait: Duration::from_millis(50),
        });
        let release = Arc::new(AtomicBool::new(false));
        let held = tokio::spawn({
            let (pool, work) = (pool.clone(), blocking(&release));
            async move { pool.run("a", Admission::RefuseWhenFull, work).await }
        });
        until(|| pool.inner.permits.available_permits() == 0).await;
        let refused = pool
            .run("b", Admission::RefuseWhenFull, || ())
            .await
            .expect_err("refused");
        assert!(
            matches!(refused, CpuPoolError::WaitedTooLong { ref namespace, .. } if namespace == "b"),
            "{refused:?}"
        );
        release.store(true, Ordering::Release);
        held.await.expect("joined").expect("ran");
    }

    #[tokio::test]
    async fn a_check_that_panics_fails_its_request_only() {
        let pool = pool(1, 4);
        let failed = pool
            .run("a", Admission::RefuseWhenFull, || panic!("a bug"))
            .await;
        assert_eq!(failed, Err::<(), _>(CpuPoolError::Panicked));
        assert_eq!(pool.run("a", Admission::RefuseWhenFull, || 1).await, Ok(1));
    }
}
