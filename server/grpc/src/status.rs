//! The one place where domain errors become gRPC statuses: a small set of
//! codes, field problems as google.rpc.BadRequest violations, lease
//! problems as google.rpc.ErrorInfo. Database text never reaches a caller.

use composer_coordinator::{
    CoordinatorError, FieldProblem,
    limits::cpu_pool::{CpuPoolError, RETRY_AFTER},
    limits::quotas::{QUOTA_EXCEEDED, QuotaExceeded},
};
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, FieldViolation, StatusExt};

/// The ErrorInfo domain of Composer's errors.
pub const DOMAIN: &str = "composer.dev";

/// INVALID_ARGUMENT with one field violation.
pub fn invalid_field(field: &str, description: impl Into<String>) -> Status {
    let description = description.into();
    Status::with_error_details(
        Code::InvalidArgument,
        format!("{field}: {description}"),
        ErrorDetails::with_bad_request_violation(field, description),
    )
}

/// Every field problem among `checks` in one INVALID_ARGUMENT, so a caller
/// fixes them all at once rather than one per call; the first status of
/// another code, if any, as it is.
pub fn all_field_problems(
    checks: impl IntoIterator<Item = Result<(), Status>>,
) -> Result<(), Status> {
    let mut problems = Vec::new();
    for check in checks {
        let Err(status) = check else { continue };
        let violations = match status.code() {
            Code::InvalidArgument => status.get_details_bad_request(),
            _ => None,
        };
        let Some(bad_request) = violations else {
            return Err(status);
        };
        problems.extend(
            bad_request
                .field_violations
                .into_iter()
                .map(|v| FieldProblem {
                    field: v.field,
                    description: v.description,
                }),
        );
    }
    match problems.as_slice() {
        [] => Ok(()),
        [one] => Err(invalid_field(&one.field, one.description.clone())),
        _ => Err(bad_request(&problems)),
    }
}

/// Longest idempotency key, correlation key, request id, page token or
/// label value, in bytes.
pub const MAX_KEY_BYTES: usize = 256;
/// Longest free text a caller sends (a cancel reason, a failure message).
pub const MAX_TEXT_BYTES: usize = 4096;

/// INVALID_ARGUMENT naming `field` unless `value` is at most `max` bytes and
/// holds no NUL (which Postgres cannot store in text).
pub fn check_text(field: &str, value: &str, max: usize) -> Result<(), Status> {
    if value.len() > max {
        return Err(invalid_field(
            field,
            format!("is {} bytes; at most {max} are allowed", value.len()),
        ));
    }
    if value.contains('\0') {
        return Err(invalid_field(field, "must not contain NUL characters"));
    }
    Ok(())
}

/// INVALID_ARGUMENT naming `field` when `value` breaks the name rule
/// (`docs/names.md`).
pub fn check_name(field: &str, value: &str) -> Result<(), Status> {
    composer_coordinator::names::check_name(value)
        .map_err(|problem| invalid_field(field, problem.to_string()))
}

fn bad_request(problems: &[FieldProblem]) -> Status {
    let violations: Vec<FieldViolation> = problems
        .iter()
        .map(|p| FieldViolation::new(p.field.clone(), p.description.clone()))
        .collect();
    let summary = problems
        .iter()
        .take(3)
        .map(|p| format!("{}: {}", p.field, p.description))
        .collect::<Vec<_>>()
        .join("; ");
    let more = problems.len().saturating_sub(3);
    let suffix = if more > 0 {
        format!(" (and {more} more)")
    } else {
        String::new()
    };
    Status::with_error_details(
        Code::InvalidArgument,
        format!("{summary}{suffix}"),
        ErrorDetails::with_bad_request(violations),
    )
}

/// RESOURCE_EXHAUSTED for a call over one of its namespace's quotas: the
/// message names the quota, google.rpc.QuotaFailure says who it was
/// counted for and what it allows, google.rpc.RetryInfo when to try again,
/// and google.rpc.ErrorInfo (`QUOTA_EXCEEDED`) names the quota for code.
pub fn quota_exceeded(refusal: &QuotaExceeded) -> Status {
    let quota = refusal.quota.name();
    let mut details = ErrorDetails::with_quota_failure_violation(
        refusal.subject.to_string(),
        format!("{quota}: {}", refusal.description),
    );
    details.set_retry_info(Some(refusal.retry_after));
    details.set_error_info(
        QUOTA_EXCEEDED,
        DOMAIN,
        std::collections::HashMap::from([("quota".to_owned(), quota.to_owned())]),
    );
    let retry_ms = refusal.retry_after.as_millis().max(1);
    Status::with_error_details(
        Code::ResourceExhausted,
        format!("{refusal}; retry in {retry_ms} ms (docs/operations.md, Quotas)"),
        details,
    )
}

/// RESOURCE_EXHAUSTED for a request whose CPU-heavy check the CPU pool
/// refused (decision 0036): google.rpc.RetryInfo says when to try again,
/// google.rpc.ErrorInfo (`CPU_POOL_BUSY`) says why.
fn cpu_pool_busy(refusal: &CpuPoolError) -> Status {
    let mut details = ErrorDetails::with_retry_info(Some(RETRY_AFTER));
    details.set_error_info("CPU_POOL_BUSY", DOMAIN, std::collections::HashMap::new());
    Status::with_error_details(Code::ResourceExhausted, refusal.to_string(), details)
}

fn with_reason(code: Code, message: String, reason: &str) -> Status {
    Status::with_error_details(
        code,
        message,
        ErrorDetails::with_error_info(reason, DOMAIN, std::collections::HashMap::new()),
    )
}

/// Maps a coordinator error onto a status.
pub fn from_coordinator(error: CoordinatorError) -> Status {
    match error {
        CoordinatorError::WorkflowNotFound { .. }
        | CoordinatorError::RunNotFound(_)
        | CoordinatorError::TaskNotFound(_)
        | CoordinatorError::ScheduleNotFound(_)
        | CoordinatorError::RateLimitNotFound(_)
        | CoordinatorError::BulkOperationNotFound(_) => Status::not_found(error.to_string()),
        CoordinatorError::BulkOperationEnded { .. } => with_reason(
            Code::FailedPrecondition,
            error.to_string(),
            "BULK_OPERATION_ENDED",
        ),
        CoordinatorError::BulkOperationReleased(_) => {
            Status::unavailable("the bulk operation moved to another server, retry later")
        }
        CoordinatorError::ScheduleExists(_) => Status::already_exists(error.to_string()),
        CoordinatorError::QuotaExceeded(refusal) => quota_exceeded(&refusal),
        CoordinatorError::CpuPool(CpuPoolError::Panicked) => {
            tracing::error!("a cpu-heavy check panicked");
            Status::internal("internal error: a check of the request failed")
        }
        CoordinatorError::CpuPool(refusal) => cpu_pool_busy(&refusal),
        CoordinatorError::InvalidDefinition(problems) => bad_request(&problems),
        CoordinatorError::InvalidArgument(problems) => bad_request(&problems),
        CoordinatorError::PayloadTooLarge { ref field, .. } => {
            let message = error.to_string();
            Status::with_error_details(
                Code::ResourceExhausted,
                message.clone(),
                ErrorDetails::with_bad_request_violation(field.clone(), message),
            )
        }
        CoordinatorError::LeaseLost { .. } => {
            with_reason(Code::FailedPrecondition, error.to_string(), "LEASE_LOST")
        }
        CoordinatorError::WrongRunStatus { .. } => with_reason(
            Code::FailedPrecondition,
            error.to_string(),
            "WRONG_RUN_STATUS",
        ),
        CoordinatorError::RunNotMigrated { .. } => with_reason(
            Code::FailedPrecondition,
            error.to_string(),
            "RUN_NOT_MIGRATED",
        ),
        CoordinatorError::SecretNotFound(_) | CoordinatorError::NoSuchBlob(_) => {
            Status::not_found(error.to_string())
        }
        CoordinatorError::NoSuchUpload(_) => {
            let message = error.to_string();
            Status::with_error_details(
                Code::NotFound,
                message.clone(),
                ErrorDetails::with_bad_request_violation("upload_id", message),
            )
        }
        CoordinatorError::NoBlobUrls => {
            with_reason(Code::FailedPrecondition, error.to_string(), "NO_BLOB_URLS")
        }
        CoordinatorError::BlobNotFound { ref field, .. } => {
            let message = error.to_string();
            Status::with_error_details(
                Code::InvalidArgument,
                message.clone(),
                ErrorDetails::with_bad_request_violation(field.clone(), message),
            )
        }
        CoordinatorError::NoBlobStore => {
            with_reason(Code::FailedPrecondition, error.to_string(), "NO_BLOB_STORE")
        }
        CoordinatorError::BlobStore(ref detail) => {
            tracing::error!(%detail, "blob store error");
            Status::unavailable("the blob store is unavailable, retry later")
        }
        CoordinatorError::SecretQuota { .. } => Status::with_error_details(
            Code::ResourceExhausted,
            error.to_string(),
            ErrorDetails::with_quota_failure_violation("secrets", error.to_string()),
        ),
        CoordinatorError::SecretNotText { .. } | CoordinatorError::NoDataKey => {
            with_reason(Code::FailedPrecondition, error.to_string(), "SECRETS")
        }
        CoordinatorError::SecretKey(key_error) => secret_key_status(&key_error),
        CoordinatorError::Corrupt(detail) => {
            tracing::error!(%detail, "corrupt stored state");
            Status::internal("internal error: stored state could not be read")
        }
        CoordinatorError::Redis(detail) => {
            tracing::error!(%detail, "redis error");
            Status::unavailable("dispatch (redis) unavailable, retry later")
        }
        CoordinatorError::Store(store) if store.is_timeout() => {
            tracing::warn!(error = %store, "database too slow");
            Status::unavailable(
                "the database did not answer within --db-timeout: it is slow or unreachable; \
                 retry later",
            )
        }
        CoordinatorError::Store(store) => {
            tracing::error!(error = %store, "database error");
            Status::unavailable("database unavailable, retry later")
        }
    }
}

/// Largest definition text accepted, before parsing.
pub(crate) const MAX_SOURCE_BYTES: usize = 4 * 1024 * 1024;

/// A definition's text: not empty, within [`MAX_SOURCE_BYTES`].
pub(crate) fn check_source(source: &str) -> Result<(), Status> {
    if source.trim().is_empty() {
        return Err(invalid_field("source", "must not be empty"));
    }
    if source.len() > MAX_SOURCE_BYTES {
        return Err(invalid_field(
            "source",
            format!(
                "is {} bytes, over the limit of {MAX_SOURCE_BYTES}",
                source.len()
            ),
        ));
    }
    Ok(())
}

/// A secret-store key problem: the server's setup (no key, a key it was
/// not given) is FAILED_PRECONDITION with what to do; a value that does
/// not open is INTERNAL (it was altered in the database).
fn secret_key_status(error: &composer_coordinator::secrets::KeyError) -> Status {
    use composer_coordinator::secrets::KeyError;
    match error {
        KeyError::NoKeys | KeyError::UnknownKek(_) | KeyError::BadKeyFile { .. } => with_reason(
            Code::FailedPrecondition,
            error.to_string(),
            "SECRETS_UNAVAILABLE",
        ),
        KeyError::DoesNotOpen(_) | KeyError::NoRandom => {
            tracing::error!(%error, "secret store");
            Status::internal(error.to_string())
        }
    }
}
