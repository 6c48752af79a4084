//! `composer queue rate-limit set|get|list|delete`.

use clap::{Args, Subcommand};
use composer_proto::v1::{
    DeleteQueueRateLimitRequest, GetQueueRateLimitRequest, ListQueueRateLimitsRequest,
    ListQueueRateLimitsResponse, QueueRateLimit, SetQueueRateLimitRequest,
};

use super::{
    AdminError, Api, ClientArgs, Format,
    output::{Table, fields, print_json, print_text, time},
    workflow::{PageArgs, more, page_size},
};

/// The queue commands.
#[derive(Debug, Clone, Subcommand)]
pub enum QueueCommand {
    /// Limit how fast a queue's tasks are handed to workers (docs/rate-limits.md).
    #[command(subcommand)]
    RateLimit(RateLimitCommand),
}

/// The rate-limit commands.
#[derive(Debug, Clone, Subcommand)]
pub enum RateLimitCommand {
    /// Create or replace a queue's rate limit; every server applies it within a second.
    Set(SetArgs),
    /// Show a queue's rate limit.
    Get(QueueArgs),
    /// List the namespace's rate limits by queue.
    List(ListArgs),
    /// Remove a queue's rate limit.
    Delete(QueueArgs),
}

/// Options of `queue rate-limit set`.
#[derive(Debug, Clone, Args)]
pub struct SetArgs {
    /// The queue.
    pub queue: String,
    /// Tasks per second over the queue (fractions allowed, e.g. 0.5); 0: none.
    #[arg(long, default_value_t = 0.0)]
    pub per_second: f64,
    /// The most tasks in any one-second window; the rate rounded up when left out.
    #[arg(long, default_value_t = 0, hide_default_value = true)]
    pub burst: i32,
    /// Tasks per second for each distinct rate-limit key; 0: none.
    #[arg(long, default_value_t = 0.0)]
    pub per_key_per_second: f64,
    /// The most tasks of one key in any one-second window; the key rate rounded up when left out.
    #[arg(long, default_value_t = 0, hide_default_value = true)]
    pub per_key_burst: i32,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// A command about one queue.
#[derive(Debug, Clone, Args)]
pub struct QueueArgs {
    /// The queue.
    pub queue: String,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Options of `queue rate-limit list`.
#[derive(Debug, Clone, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub page: PageArgs,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Runs one queue command.
pub async fn run(command: QueueCommand) -> Result<(), AdminError> {
    match command {
        QueueCommand::RateLimit(RateLimitCommand::Set(args)) => set(args).await,
        QueueCommand::RateLimit(RateLimitCommand::Get(args)) => get(args).await,
        QueueCommand::RateLimit(RateLimitCommand::List(args)) => list(args).await,
        QueueCommand::RateLimit(RateLimitCommand::Delete(args)) => delete(args).await,
    }
}

async fn set(args: SetArgs) -> Result<(), AdminError> {
    let mut api = Api::connect(&args.client.connect).await?;
    let response = api
        .queues
        .set_queue_rate_limit(SetQueueRateLimitRequest {
            limit: Some(QueueRateLimit {
                queue: args.queue,
                per_second: args.per_second,
                burst: args.burst,
                per_key_per_second: args.per_key_per_second,
                per_key_burst: args.per_key_burst,
                ..QueueRateLimit::default()
            }),
        })
        .await?
        .into_inner();
    match args.client.output {
        Format::Json => print_json(&response),
        Format::Table => {
            let limit = response.limit.unwrap_or_default();
            print_text(&format!(
                "queue {} limited: {}\n",
                limit.queue,
                summary(&limit)
            ))
        }
    }
}

/// `20/s, burst 20; per key 5/s, burst 5`.
fn summary(limit: &QueueRateLimit) -> String {
    let queue = if limit.per_second > 0.0 {
        format!("{}/s, burst {}", limit.per_second, limit.burst)
    } else {
        "no queue-wide limit".to_owned()
    };
    if limit.per_key_per_second > 0.0 {
        format!(
            "{queue}; per key {}/s, burst {}",
            limit.per_key_per_second, limit.per_key_burst
        )
    } else {
        queue
    }
}

async fn get(args: QueueArgs) -> Result<(), AdminError> {
    let mut api = Api::connect(&args.client.connect).await?;
    let response = api
        .queues
        .get_queue_rate_limit(GetQueueRateLimitRequest { queue: args.queue })
        .await?
        .into_inner();
    if args.client.output == Format::Json {
        return print_json(&response);
    }
    let limit = response.limit.unwrap_or_default();
    print_text(&fields(&[
        ("queue", limit.queue.clone()),
        ("per second", number(limit.per_second)),
        ("burst", limit.burst.to_string()),
        ("per key per second", number(limit.per_key_per_second)),
        ("per key burst", limit.per_key_burst.to_string()),
        ("created", time(limit.create_time.as_ref())),
        ("updated", time(limit.update_time.as_ref())),
    ]))
}

fn number(rate: f64) -> String {
    if rate > 0.0 {
        rate.to_string()
    } else {
        "-".to_owned()
    }
}

async fn list(args: ListArgs) -> Result<(), AdminError> {
    let mut api = Api::connect(&args.client.connect).await?;
    let mut all = ListQueueRateLimitsResponse {
        next_page_token: args.page.page_token,
        ..Default::default()
    };
    let limit = args.page.limit as usize;
    loop {
        let page = api
            .queues
            .list_queue_rate_limits(ListQueueRateLimitsRequest {
                page_size: page_size(limit - all.limits.len()),
                page_token: all.next_page_token.clone(),
            })
            .await?
            .into_inner();
        all.limits.extend(page.limits);
        all.next_page_token = page.next_page_token;
        if all.next_page_token.is_empty() || all.limits.len() >= limit {
            break;
        }
    }
    if args.client.output == Format::Json {
        return print_json(&all);
    }
    let mut table = Table::new(&["QUEUE", "PER SECOND", "BURST", "PER KEY", "KEY BURST"]);
    for limit in &all.limits {
        table.row(vec![
            limit.queue.clone(),
            number(limit.per_second),
            limit.burst.to_string(),
            number(limit.per_key_per_second),
            limit.per_key_burst.to_string(),
        ]);
    }
    print_text(&table.render())?;
    more(&all.next_page_token)
}

async fn delete(args: QueueArgs) -> Result<(), AdminError> {
    let mut api = Api::connect(&args.client.connect).await?;
    let response = api
        .queues
        .delete_queue_rate_limit(DeleteQueueRateLimitRequest {
            queue: args.queue.clone(),
        })
        .await?
        .into_inner();
    match args.client.output {
        Format::Json => print_json(&response),
        Format::Table => print_text(&format!("queue {} no longer limited\n", args.queue)),
    }
}
