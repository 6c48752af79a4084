//! `QueueService`: queue rate limits (decision 0021).

use composer_coordinator::{
    Coordinator,
    dispatch::rate_limit::{
        MAX_RATE_PER_SECOND, MAX_REFILL_SECS, MIN_RATE_PER_SECOND, default_burst,
    },
};
use composer_proto::v1::{
    DeleteQueueRateLimitRequest, DeleteQueueRateLimitResponse, GetQueueRateLimitRequest,
    GetQueueRateLimitResponse, ListQueueRateLimitsRequest, ListQueueRateLimitsResponse,
    QueueRateLimit, SetQueueRateLimitRequest, SetQueueRateLimitResponse,
    queue_service_server::QueueService,
};
use composer_store::rate_limits::{RateLimitRow, RateLimitSetting};
use tonic::{Request, Response, Status};

use crate::{
    caller::caller,
    convert::{keyset_page, page_size, page_token, timestamp},
    status::{check_name, from_coordinator, invalid_field},
};

/// The highest rate a limit may name.
pub const MAX_RATE: f64 = MAX_RATE_PER_SECOND;
/// The highest burst a limit may name.
pub const MAX_BURST: i32 = 100_000;

/// The QueueService implementation.
#[derive(Clone)]
pub(crate) struct QueueApi {
    pub(crate) coordinator: Coordinator,
}

/// A rate: 0 (none), or finite from one a day ([`MIN_RATE_PER_SECOND`])
/// to [`MAX_RATE`] per second.
fn check_rate(field: &str, rate: f64) -> Result<Option<f64>, Status> {
    if rate == 0.0 {
        return Ok(None);
    }
    if !rate.is_finite() || rate < 0.0 {
        return Err(invalid_field(
            field,
            "must be a positive number of tasks per second",
        ));
    }
    // a day's worth, with room for the rounding of 1/86400 as written
    if rate * MAX_REFILL_SECS < 1.0 - 1e-9 {
        return Err(invalid_field(
            field,
            format!(
                "must be at least one task a day ({MIN_RATE_PER_SECOND:e} per second): \
                 a bucket refills within a day, so Redis keeps none longer"
            ),
        ));
    }
    if rate > MAX_RATE {
        return Err(invalid_field(
            field,
            format!("must be at most {MAX_RATE} per second"),
        ));
    }
    Ok(Some(rate))
}

/// A burst for `rate`: 0 takes the rate rounded up; otherwise at least
/// that and at most [`MAX_BURST`].
fn check_burst(
    field: &str,
    burst: i32,
    rate: Option<f64>,
    rate_field: &str,
) -> Result<i32, Status> {
    let Some(rate) = rate else {
        if burst != 0 {
            return Err(invalid_field(field, format!("needs {rate_field}")));
        }
        return Ok(0);
    };
    let least = i32::try_from(default_burst(rate)).unwrap_or(MAX_BURST);
    match burst {
        0 => Ok(least),
        b if !(1..=MAX_BURST).contains(&b) => Err(invalid_field(
            field,
            format!("must be between 1 and {MAX_BURST}"),
        )),
        b if b < least => Err(invalid_field(
            field,
            format!(
                "must be at least {rate_field} rounded up ({least}): it is the most tasks in one second"
            ),
        )),
        b if f64::from(b) / rate > MAX_REFILL_SECS * (1.0 + 1e-9) => Err(invalid_field(
            field,
            format!(
                "is {b}: at {rate} per second a bucket that size takes {:.0} s to refill; \
                 at most a day ({MAX_REFILL_SECS} s), so at most {} for this rate",
                f64::from(b) / rate,
                largest_burst(rate),
            ),
        )),
        b => Ok(b),
    }
}

/// The largest burst `rate` refills within a day.
fn largest_burst(rate: f64) -> i64 {
    // bounded: rate <= MAX_RATE, so the product fits
    #[allow(clippy::cast_possible_truncation)]
    let largest = (rate * MAX_REFILL_SECS * (1.0 + 1e-9)).floor() as i64;
    largest.max(1)
}

fn limit_message(row: RateLimitRow) -> QueueRateLimit {
    QueueRateLimit {
        queue: row.queue,
        per_second: row.per_second,
        burst: row.burst,
        per_key_per_second: row.per_key_per_second.unwrap_or(0.0),
        per_key_burst: row.per_key_burst.unwrap_or(0),
        create_time: Some(timestamp(row.created_at)),
        update_time: Some(timestamp(row.updated_at)),
    }
}

#[tonic::async_trait]
impl QueueService for QueueApi {
    async fn set_queue_rate_limit(
        &self,
        request: Request<SetQueueRateLimitRequest>,
    ) -> Result<Response<SetQueueRateLimitResponse>, Status> {
        let caller = caller(&request)?;
        let limit = request
            .into_inner()
            .limit
            .ok_or_else(|| invalid_field("limit", "is required"))?;
        check_name("limit.queue", &limit.queue)?;
        let per_second = check_rate("limit.per_second", limit.per_second)?;
        let burst = check_burst("limit.burst", limit.burst, per_second, "limit.per_second")?;
        let per_key = check_rate("limit.per_key_per_second", limit.per_key_per_second)?;
        let per_key_burst = check_burst(
            "limit.per_key_burst",
            limit.per_key_burst,
            per_key,
            "limit.per_key_per_second",
        )?;
        if per_second.is_none() && per_key.is_none() {
            return Err(invalid_field(
                "limit.per_second",
                "is required unless limit.per_key_per_second is set",
            ));
        }
        let row = self
            .coordinator
            .set_queue_rate_limit(&RateLimitSetting {
                namespace: &caller.namespace,
                queue: &limit.queue,
                per_second: per_second.unwrap_or(0.0),
                burst,
                per_key_per_second: per_key,
                per_key_burst: per_key.map(|_| per_key_burst),
            })
            .await
            .map_err(from_coordinator)?;
        Ok(Response::new(SetQueueRateLimitResponse {
            limit: Some(limit_message(row)),
        }))
    }

    async fn get_queue_rate_limit(
        &self,
        request: Request<GetQueueRateLimitRequest>,
    ) -> Result<Response<GetQueueRateLimitResponse>, Status> {
        let caller = caller(&request)?;
        let queue = request.into_inner().queue;
        check_name("queue", &queue)?;
        let row = self
            .coordinator
            .get_queue_rate_limit(&caller.namespace, &queue)
            .await
            .map_err(from_coordinator)?;
        Ok(Response::new(GetQueueRateLimitResponse {
            limit: Some(limit_message(row)),
        }))
    }

    async fn list_queue_rate_limits(
        &self,
        request: Request<ListQueueRateLimitsRequest>,
    ) -> Result<Response<ListQueueRateLimitsResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let limit = page_size(request.page_size)?;
        let after = page_token(&request.page_token, |token| {
            check_name("page_token", token).ok().map(|()| token)
        })?;
        let rows = self
            .coordinator
            .list_queue_rate_limits(&caller.namespace, after, limit + 1)
            .await
            .map_err(from_coordinator)?;
        let (page, next_page_token) = keyset_page(rows, limit, |last| last.queue.clone());
        Ok(Response::new(ListQueueRateLimitsResponse {
            limits: page.into_iter().map(limit_message).collect(),
            next_page_token,
        }))
    }

    async fn delete_queue_rate_limit(
        &self,
        request: Request<DeleteQueueRateLimitRequest>,
    ) -> Result<Response<DeleteQueueRateLimitResponse>, Status> {
        let caller = caller(&request)?;
        let queue = request.into_inner().queue;
        check_name("queue", &queue)?;
        self.coordinator
            .delete_queue_rate_limit(&caller.namespace, &queue)
            .await
            .map_err(from_coordinator)?;
        Ok(Response::new(DeleteQueueRateLimitResponse {}))
    }
}
