//! The coordinator's errors, by meaning. The gRPC layer maps each to a
//! status; nothing here knows about gRPC.

use composer_store::StoreError;

/// A problem with one field of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldProblem {
    /// The field's path, e.g. `input.amount` or `nodes[3].retry`.
    pub field: String,
    /// What is wrong.
    pub description: String,
}

/// Why a coordinator operation failed.
#[derive(Debug, thiserror::Error)]
pub enum CoordinatorError {
    /// The workflow (or that version) does not exist in the namespace.
    #[error("workflow {name:?} {version} not found")]
    WorkflowNotFound {
        /// Name.
        name: String,
        /// `version N` or `latest`.
        version: String,
    },
    /// The run does not exist in the namespace.
    #[error("run {0} not found")]
    RunNotFound(String),
    /// The schedule does not exist in the namespace.
    #[error("schedule {0:?} not found")]
    ScheduleNotFound(String),
    /// The queue has no rate limit in the namespace.
    #[error("queue {0:?} has no rate limit")]
    RateLimitNotFound(String),
    /// The namespace already has a schedule with this id.
    #[error("schedule {0:?} already exists")]
    ScheduleExists(String),
    /// What was asked would go over one of the namespace's quotas
    /// (schedules, queue rate limits, concurrency keys).
    #[error(transparent)]
    QuotaExceeded(#[from] crate::limits::quotas::QuotaExceeded),
    /// A CPU-heavy check of the request did not run: the namespace (or the
    /// server) has as many waiting as it may, or it panicked.
    #[error(transparent)]
    CpuPool(#[from] crate::limits::cpu_pool::CpuPoolError),
    /// The bulk operation does not exist in the namespace.
    #[error("bulk operation {0} not found")]
    BulkOperationNotFound(String),
    /// The bulk operation ended before the request.
    #[error("bulk operation {id} already ended {status}")]
    BulkOperationEnded {
        /// Operation.
        id: String,
        /// Its final status.
        status: String,
    },
    /// This server no longer holds the bulk operation it works on (another
    /// took it, or it was asked to stop): the run's action is rolled back.
    #[error("bulk operation {0} is no longer held by this server")]
    BulkOperationReleased(String),
    /// The task does not exist in the namespace.
    #[error("task {0} not found")]
    TaskNotFound(String),
    /// A definition did not validate.
    #[error("invalid workflow definition")]
    InvalidDefinition(Vec<FieldProblem>),
    /// A request field is invalid.
    #[error("invalid argument")]
    InvalidArgument(Vec<FieldProblem>),
    /// A payload is larger than the configured limit.
    #[error("{field} is {size} bytes, over the limit of {limit} bytes (--max-payload-bytes)")]
    PayloadTooLarge {
        /// The field.
        field: String,
        /// Its size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The report's lease is not the task's current lease.
    #[error("lease lost: task {task_id} attempt {attempt} is no longer leased with this token")]
    LeaseLost {
        /// Task.
        task_id: String,
        /// Attempt.
        attempt: i32,
    },
    /// The run is not in a status that allows the operation.
    #[error("run {run_id} is {status}: {why}")]
    WrongRunStatus {
        /// Run.
        run_id: String,
        /// Its status.
        status: String,
        /// What was asked.
        why: &'static str,
    },
    /// A migration left the run on its version: the target cannot
    /// continue it, or it cannot be moved yet.
    #[error("run {run_id} stays on its version: {why}")]
    RunNotMigrated {
        /// Run.
        run_id: String,
        /// Why, in words (the divergence when incompatible).
        why: String,
    },
    /// No secret of that name in the namespace.
    #[error("secret {0:?} not found")]
    SecretNotFound(String),
    /// The namespace holds as many secrets as it may.
    #[error("the namespace holds {limit} secrets, its most; delete one first")]
    SecretQuota {
        /// The limit.
        limit: i64,
    },
    /// A secret used in a request's text is not UTF-8.
    #[error("secret {name:?} is not UTF-8 text, so it cannot go into a request")]
    SecretNotText {
        /// The secret.
        name: String,
    },
    /// The namespace has no secrets at all yet.
    #[error("the namespace has no secrets yet")]
    NoDataKey,
    /// A key of the secret store cannot be used.
    #[error(transparent)]
    SecretKey(#[from] crate::secrets::KeyError),
    /// A reference names no blob of the namespace.
    #[error("{field} refers to blob {sha256}, which the namespace does not have")]
    BlobNotFound {
        /// The field holding the reference.
        field: String,
        /// Its digest.
        sha256: String,
    },
    /// BlobService was asked for a blob the namespace does not have.
    #[error("the namespace has no blob {0}")]
    NoSuchBlob(String),
    /// The server keeps no blob store.
    #[error("this server keeps no blob store (--blob-store)")]
    NoBlobStore,
    /// The blob store signs no URLs (a local folder), or the server gives
    /// none (`--blob-url-secs 0`).
    #[error(
        "this server gives no presigned blob URLs (a local folder, or --blob-url-secs 0): use UploadBlob and DownloadBlob"
    )]
    NoBlobUrls,
    /// FinishBlobUpload named no upload of the namespace with bytes.
    #[error("the namespace has no upload {0} with bytes PUT to it")]
    NoSuchUpload(String),
    /// The blob store failed.
    #[error("blob store: {0}")]
    BlobStore(String),
    /// Stored state could not be read back (a bug or a manual edit).
    #[error("corrupt stored state: {0}")]
    Corrupt(String),
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Redis failed or could not be reached.
    #[error("redis: {0}")]
    Redis(String),
}

impl From<sqlx::Error> for CoordinatorError {
    fn from(error: sqlx::Error) -> Self {
        Self::Store(StoreError::from(error))
    }
}

impl From<serde_json::Error> for CoordinatorError {
    fn from(error: serde_json::Error) -> Self {
        Self::Corrupt(error.to_string())
    }
}
