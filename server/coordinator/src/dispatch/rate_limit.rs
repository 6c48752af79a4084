//! Rate limits per queue and per key (decision 0021): each server caches
//! the limits of the queues its polls wait on (refreshed every second from
//! Postgres), and takes tokens from buckets in Redis shared by every
//! server, with one script call per hand-out.

use std::{collections::HashMap, sync::Mutex, time::Duration};

use crate::dispatch::redis_conn::RedisConnection;
use composer_store::{Store, StoreError, rate_limits};

use crate::dispatch::streams::stream_key;

/// (namespace, queue)
pub(crate) type QueueKey = (String, String);

/// How often each server reads the limits of the queues it serves again:
/// a change takes effect on every server within about this long.
pub const REFRESH: Duration = Duration::from_secs(1);

/// The longest rate-limit key kept (bytes); a longer value is cut at a
/// character boundary, so a template cannot grow Redis keys without bound.
pub const MAX_KEY_BYTES: usize = 200;

/// The longest a bucket takes to refill from empty to full (`burst /
/// rate`), in seconds: a day. A bucket idle that long is full, the same
/// as no bucket, so its Redis key expires then at the latest: no bucket
/// lives in Redis longer than a day, whatever its rate.
pub const MAX_REFILL_SECS: f64 = 86_400.0;

/// The lowest rate a limit may name: one task a day.
pub const MIN_RATE_PER_SECOND: f64 = 1.0 / MAX_REFILL_SECS;

/// The highest rate a limit may name.
pub const MAX_RATE_PER_SECOND: f64 = 100_000.0;

/// The longest a bucket's key lives in Redis, in milliseconds.
pub const MAX_BUCKET_TTL_MS: i64 = 86_400_000;

/// A rate as the buckets apply it: within [`MIN_RATE_PER_SECOND`] and
/// [`MAX_RATE_PER_SECOND`] (the API refuses others; a limit stored before
/// the minimum existed, or edited by hand, is applied at the nearest
/// bound rather than handed to the script, where a rate like 1e-300 made
/// numbers no Redis reply can carry).
pub fn applied_rate(per_second: f64) -> f64 {
    if per_second.is_nan() {
        return MIN_RATE_PER_SECOND;
    }
    per_second.clamp(MIN_RATE_PER_SECOND, MAX_RATE_PER_SECOND)
}

/// One queue's limit, as the hub applies it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limit {
    /// Queue bucket: tasks per second (0: no queue-wide limit).
    pub per_second: f64,
    /// Queue bucket: most grants in any one-second window.
    pub burst: u32,
    /// Per key: tasks per second and burst, if limited.
    pub per_key: Option<(f64, u32)>,
}

impl From<&rate_limits::RateLimitRow> for Limit {
    fn from(row: &rate_limits::RateLimitRow) -> Self {
        Limit {
            // 0: no queue-wide limit
            per_second: if row.per_second > 0.0 {
                applied_rate(row.per_second)
            } else {
                0.0
            },
            burst: u32::try_from(row.burst).unwrap_or(1).max(1),
            per_key: row.per_key_per_second.map(|rate| {
                let rate = applied_rate(rate);
                let burst = row
                    .per_key_burst
                    .and_then(|b| u32::try_from(b).ok())
                    .unwrap_or_else(|| default_burst(rate));
                (rate, burst.max(1))
            }),
        }
    }
}

/// The burst of a limit that names none: the rate rounded up.
pub fn default_burst(per_second: f64) -> u32 {
    // bounded by the API (per_second <= 100,000): the cast cannot overflow
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let burst = per_second.ceil() as u32;
    burst.max(1)
}

/// Cuts a rate-limit key to [`MAX_KEY_BYTES`].
pub fn bounded_key(mut key: String) -> String {
    if key.len() > MAX_KEY_BYTES {
        let mut end = MAX_KEY_BYTES;
        while !key.is_char_boundary(end) {
            end -= 1;
        }
        key.truncate(end);
    }
    key
}

/// The limits of the queues this server serves; `None`: known unlimited.
#[derive(Default)]
pub(crate) struct LimitCache {
    limits: Mutex<HashMap<QueueKey, Option<Limit>>>,
}

impl LimitCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<QueueKey, Option<Limit>>> {
        self.limits.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The queue's limit, read from Postgres the first time it is asked
    /// for (a queue never waits a refresh period unlimited).
    pub(crate) async fn get(
        &self,
        store: &Store,
        key: &QueueKey,
    ) -> Result<Option<Limit>, StoreError> {
        if let Some(limit) = self.lock().get(key) {
            return Ok(*limit);
        }
        let row = rate_limits::get_rate_limit(store.pool(), &key.0, &key.1).await?;
        let limit = row.as_ref().map(Limit::from);
        self.lock().insert(key.clone(), limit);
        Ok(limit)
    }

    /// Whether the queue is known to have no limit (unknown: false).
    pub(crate) fn is_known_unlimited(&self, key: &QueueKey) -> bool {
        self.lock().get(key).is_some_and(Option::is_none)
    }

    /// Whether the queue is known to have a limit (unknown: false).
    pub(crate) fn is_limited(&self, key: &QueueKey) -> bool {
        self.lock().get(key).is_some_and(Option::is_some)
    }

    /// Reads the limits of `queues` again and forgets every other queue.
    pub(crate) async fn refresh(
        &self,
        store: &Store,
        queues: &[QueueKey],
    ) -> Result<(), StoreError> {
        let rows = rate_limits::rate_limits_of(store.pool(), queues).await?;
        let mut fresh: HashMap<QueueKey, Option<Limit>> =
            queues.iter().map(|k| (k.clone(), None)).collect();
        for row in &rows {
            fresh.insert(
                (row.namespace.clone(), row.queue.clone()),
                Some(Limit::from(row)),
            );
        }
        *self.lock() = fresh;
        Ok(())
    }
}

/// What one take of tokens decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Grant {
    /// Indexes (into the candidates) that got a token, in order.
    pub granted: Vec<usize>,
    /// Set when the queue's bucket ran out: how long until it has a token.
    pub queue_wait: Option<Duration>,
    /// Set when some key's bucket ran out: how long until the first of
    /// those has a token.
    pub key_wait: Option<Duration>,
    /// The grant's Redis time, microseconds (what a refund names).
    pub at: i64,
    /// Candidates held back because their key would need a new bucket
    /// past the queue's `rate_limit_keys_per_queue` quota.
    pub over_key_quota: u64,
}

/// The Redis key of a queue's bucket: the hash tag of the queue's shard 0
/// stream, so a Redis Cluster keeps it (and its key buckets) with the
/// queue's priority streams.
pub fn queue_bucket_key(namespace: &str, queue: &str) -> String {
    format!("composer:rate:{}", hash_tag(namespace, queue))
}

/// The Redis key of one rate-limit key's bucket in a queue.
pub fn key_bucket_key(namespace: &str, queue: &str, key: &str) -> String {
    format!("composer:rate:{}:key:{key}", hash_tag(namespace, queue))
}

/// The Redis key of a queue's index of live key buckets (a sorted set of
/// bucket keys by expiry time), which the `rate_limit_keys_per_queue`
/// quota is counted in; in the queue's hash slot, so the script that
/// creates a bucket counts and records it at once.
pub fn key_index_key(namespace: &str, queue: &str) -> String {
    format!("composer:rate:{}:keys", hash_tag(namespace, queue))
}

fn hash_tag(namespace: &str, queue: &str) -> String {
    let stream = stream_key(namespace, queue, 0);
    stream
        .find('{')
        .map_or_else(|| stream.clone(), |at| stream[at..].to_owned())
}

/// Takes up to `max` tokens for `keys` (one per candidate, in hand-out
/// order: its rate-limit key, if any), from the queue's bucket and each
/// candidate's key bucket at once. A candidate whose key is out of tokens
/// is skipped and later ones may still be granted; when the queue's bucket
/// is out, nothing after is. A key with no live bucket gets one only while
/// the queue has fewer than `max_keys` (its `rate_limit_keys_per_queue`
/// quota); otherwise its task waits, as for a key out of tokens, until a
/// bucket expires.
pub(crate) async fn take_tokens(
    connection: &mut RedisConnection,
    (namespace, queue): &QueueKey,
    limit: &Limit,
    keys: &[Option<&str>],
    max: usize,
    max_keys: u32,
) -> redis::RedisResult<Grant> {
    let mut bucket_of: HashMap<&str, usize> = HashMap::new();
    let mut invocation = TAKE_SCRIPT.key(queue_bucket_key(namespace, queue));
    invocation.key(key_index_key(namespace, queue));
    let (key_rate, key_burst) = limit.per_key.unwrap_or((0.0, 0));
    invocation
        .arg(limit.per_second)
        .arg(limit.burst)
        .arg(key_rate)
        .arg(key_burst)
        .arg(max)
        .arg(max_keys);
    for key in keys {
        let index = match key {
            Some(key) if limit.per_key.is_some() => {
                let next = bucket_of.len() + 3;
                let index = *bucket_of.entry(key).or_insert(next);
                if index == next {
                    invocation.key(key_bucket_key(namespace, queue, key));
                }
                index
            }
            _ => 0,
        };
        invocation.arg(index);
    }
    let reply: Vec<i64> = invocation.invoke_async(connection).await?;
    let micros = |us: i64| (us > 0).then(|| Duration::from_micros(u64::try_from(us).unwrap_or(0)));
    Ok(Grant {
        queue_wait: reply.first().copied().and_then(micros),
        key_wait: reply.get(1).copied().and_then(micros),
        at: reply.get(2).copied().unwrap_or_default(),
        over_key_quota: reply
            .get(3)
            .and_then(|n| u64::try_from(*n).ok())
            .unwrap_or_default(),
        granted: reply
            .iter()
            .skip(4)
            .filter_map(|i| usize::try_from(*i - 1).ok())
            .collect(),
    })
}

/// Gives back the tokens of a grant made at `at` (Redis time, us) that no
/// lease used: one from the queue's bucket per entry of `keys`, and one
/// from each entry's key bucket. The grant leaves the log as if it had not
/// been made, so the window stays exact.
pub(crate) async fn refund_tokens(
    connection: &mut RedisConnection,
    (namespace, queue): &QueueKey,
    limit: &Limit,
    at: i64,
    keys: &[Option<&str>],
) -> redis::RedisResult<()> {
    let mut per_key: HashMap<&str, usize> = HashMap::new();
    if limit.per_key.is_some() {
        for key in keys.iter().flatten() {
            *per_key.entry(key).or_default() += 1;
        }
    }
    let mut invocation = REFUND_SCRIPT.key(queue_bucket_key(namespace, queue));
    invocation
        .arg(limit.per_second)
        .arg(limit.per_key.map_or(0.0, |(rate, _)| rate))
        .arg(at)
        .arg(keys.len());
    for (key, count) in &per_key {
        invocation
            .key(key_bucket_key(namespace, queue, key))
            .arg(*count);
    }
    invocation.invoke_async::<()>(connection).await
}

static REFUND_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(REFUND_LUA));

/// KEYS[1]: the queue's bucket; KEYS[2..]: key buckets. ARGV: queue rate
/// (0: none), key rate, the grant's time, tokens for the queue, then one
/// count per key bucket. The log entry of the grant (or the later one it
/// was merged into) loses the count, the rate's arrival time moves back.
const REFUND_LUA: &str = r"
local function refund(key, rate, at, n)
  if n <= 0 or rate <= 0 then
    return
  end
  local v = redis.call('HMGET', key, 'tat', 'log')
  if not v[1] then
    return
  end
  local tat = tonumber(v[1]) - n * 1000000 / rate
  local parts = {}
  local left = n
  for time, count in string.gmatch(v[2] or '', '(%d+):(%d+)') do
    time = tonumber(time)
    count = tonumber(count)
    if left > 0 and time >= at then
      local back = math.min(left, count)
      count = count - back
      left = left - back
    end
    if count > 0 then
      table.insert(parts, string.format('%.0f:%d', time, count))
    end
  end
  redis.call('HSET', key, 'tat', string.format('%.3f', tat), 'log', table.concat(parts, ','))
end

local at = tonumber(ARGV[3])
refund(KEYS[1], tonumber(ARGV[1]), at, tonumber(ARGV[4]))
for i = 2, #KEYS do
  refund(KEYS[i], tonumber(ARGV[2]), at, tonumber(ARGV[3 + i]))
end
return 0
";

/// The window that "no one-second window exceeds the burst" is checked
/// over, in microseconds: a second plus a margin for the lease statement
/// that follows a grant, so the hand-outs (not only the grants) keep it.
pub const WINDOW_MICROS: i64 = 1_025_000;

static TAKE_SCRIPT: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(
        &TAKE_LUA
            .replace("WINDOW_MICROS", &WINDOW_MICROS.to_string())
            .replace("MAX_BUCKET_TTL_MS", &MAX_BUCKET_TTL_MS.to_string()),
    )
});

/// A bucket is two limits at once, both in Redis time (TIME), so every
/// server sees one clock:
/// - a rate: a token bucket of `burst` tokens refilled at `rate` per second,
///   kept as its theoretical arrival time `tat` (GCRA);
/// - a window: the grants of the last WINDOW_MICROS, as `time:count` pairs
///   (at most 64: past that the oldest pair is merged into the next, its
///   grants counted as later, which only makes the window stricter);
///   a grant is refused when the window already holds `burst`.
///
/// A bucket expires once it is full again and its window empty, so an
/// idle key costs no memory. Every key bucket saved is recorded in the
/// queue's key index with its expiry time; a key with no bucket gets one
/// only while fewer than the quota are live there, else it waits until the
/// first of them expires. KEYS[1]: the queue's bucket; KEYS[2]: the key
/// index; KEYS[3..]: key buckets. ARGV: queue rate (0: none), queue burst,
/// key rate, key burst, most grants, most live key buckets, then per
/// candidate the KEYS index of its key bucket (0: none). Returns {queue
/// wait us, key wait us, now, candidates over the key quota, granted
/// candidate numbers}.
const TAKE_LUA: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local window = WINDOW_MICROS
local max_log = 64

local key_index = KEYS[2]
local max_keys = tonumber(ARGV[6])
local live_keys = nil
local over_key_quota = 0

-- live key buckets of the queue, the expired ones dropped first
local function keys_in_use()
  if not live_keys then
    redis.call('ZREMRANGEBYSCORE', key_index, '-inf', now)
    live_keys = redis.call('ZCARD', key_index)
  end
  return live_keys
end

-- how long until the first live key bucket expires
local function key_quota_wait()
  local first = redis.call('ZRANGE', key_index, 0, 0, 'WITHSCORES')
  if first[2] then
    return math.max(math.ceil(tonumber(first[2]) - now), 1000)
  end
  return 1000000
end

-- records a key bucket with the expiry its save just set; the index
-- itself expires with its last bucket
local function index_bucket(key)
  local ttl = redis.call('PTTL', key)
  redis.call('ZADD', key_index, string.format('%.0f', now + ttl * 1000), key)
  local last = redis.call('ZRANGE', key_index, -1, -1, 'WITHSCORES')
  local until_last = math.ceil((tonumber(last[2]) - now) / 1000)
  redis.call('PEXPIRE', key_index, math.max(until_last, 1) + 1000)
end

local function load(key, rate, burst)
  local v = redis.call('HMGET', key, 'tat', 'log')
  local b = {key = key, step = 1000000 / rate, burst = burst, tat = tonumber(v[1]) or 0,
             times = {}, counts = {}, sum = 0, taken = 0, new = not v[1]}
  if v[2] then
    for time, count in string.gmatch(v[2], '(%d+):(%d+)') do
      time = tonumber(time)
      count = tonumber(count)
      if time > now - window then
        table.insert(b.times, time)
        table.insert(b.counts, count)
        b.sum = b.sum + count
      end
    end
  end
  return b
end

local function wait(b)
  local rate_wait = math.max(b.tat, now) + b.step - b.burst * b.step - now
  local window_wait = 0
  if b.sum + 1 > b.burst then
    local excess = b.sum + 1 - b.burst
    for i = 1, #b.times do
      excess = excess - b.counts[i]
      if excess <= 0 then
        window_wait = b.times[i] + window - now
        break
      end
    end
  end
  return math.ceil(math.max(rate_wait, window_wait, 0))
end

local function take(b)
  b.tat = math.max(b.tat, now) + b.step
  b.sum = b.sum + 1
  b.taken = b.taken + 1
end

local function save(b)
  if b.taken == 0 then
    return
  end
  table.insert(b.times, now)
  table.insert(b.counts, b.taken)
  while #b.times > max_log do
    b.counts[2] = b.counts[2] + b.counts[1]
    table.remove(b.times, 1)
    table.remove(b.counts, 1)
  end
  local parts = {}
  for i = 1, #b.times do
    parts[i] = string.format('%.0f:%d', b.times[i], b.counts[i])
  end
  redis.call('HSET', b.key, 'tat', string.format('%.3f', b.tat), 'log', table.concat(parts, ','))
  -- full again (and its window empty) once idle this long; never more
  -- than a day (the API keeps a refill within a day, so that is exact)
  local idle = math.max(b.tat - now, 0) + window
  redis.call('PEXPIRE', b.key, math.min(math.ceil(idle / 1000) + 1000, MAX_BUCKET_TTL_MS))
  if b.indexed then
    index_bucket(b.key)
  end
end

local queue = nil
if tonumber(ARGV[1]) > 0 then
  queue = load(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]))
end
local key_rate = tonumber(ARGV[3])
local key_burst = tonumber(ARGV[4])
local max = tonumber(ARGV[5])
local buckets = {}
local granted = {}
local queue_wait = 0
local key_wait = 0
for i = 7, #ARGV do
  if #granted >= max then
    break
  end
  if queue then
    local w = wait(queue)
    if w > 0 then
      queue_wait = w
      break
    end
  end
  local k = tonumber(ARGV[i])
  local b = nil
  if k > 0 and key_rate > 0 then
    b = buckets[k]
    if not b then
      b = load(KEYS[k], key_rate, key_burst)
      b.indexed = true
      if b.new then
        if keys_in_use() >= max_keys then
          b.over_quota = true
        else
          live_keys = live_keys + 1
        end
      end
      buckets[k] = b
    end
  end
  local w = 0
  if b and b.over_quota then
    w = key_quota_wait()
    over_key_quota = over_key_quota + 1
  elseif b then
    w = wait(b)
  end
  if w > 0 then
    if key_wait == 0 or w < key_wait then
      key_wait = w
    end
  else
    if queue then
      take(queue)
    end
    if b then
      take(b)
    end
    table.insert(granted, i - 6)
  end
end
if queue then
  save(queue)
end
for _, b in pairs(buckets) do
  save(b)
end
local reply = {queue_wait, key_wait, now, over_key_quota}
for _, g in ipairs(granted) do
  table.insert(reply, g)
end
return reply
";

impl crate::Coordinator {
    /// Creates or replaces a queue's limit (checked by the caller); a new
    /// one over the namespace's `queue_rate_limits` quota is refused.
    pub async fn set_queue_rate_limit(
        &self,
        limit: &rate_limits::RateLimitSetting<'_>,
    ) -> Result<rate_limits::RateLimitRow, crate::CoordinatorError> {
        let quotas = self.quotas().of(limit.namespace);
        let mut tx = self.store.begin().await?;
        let cap = i64::from(quotas.queue_rate_limits);
        match rate_limits::set_rate_limit(&mut tx, limit, cap).await? {
            rate_limits::Set::Written(row) => {
                tx.commit().await?;
                Ok(*row)
            }
            rate_limits::Set::Full => Err(crate::limits::quotas::QuotaExceeded::counted(
                crate::limits::quotas::Quota::QueueRateLimits,
                crate::limits::quotas::Subject::Namespace(limit.namespace.to_owned()),
                &quotas,
                // a place frees only when a limit is deleted
                Duration::from_secs(60),
            )
            .into()),
        }
    }

    /// A queue's limit.
    pub async fn get_queue_rate_limit(
        &self,
        namespace: &str,
        queue: &str,
    ) -> Result<rate_limits::RateLimitRow, crate::CoordinatorError> {
        rate_limits::get_rate_limit(self.store.pool(), namespace, queue)
            .await?
            .ok_or_else(|| crate::CoordinatorError::RateLimitNotFound(queue.to_owned()))
    }

    /// One page of the namespace's limits, by queue.
    pub async fn list_queue_rate_limits(
        &self,
        namespace: &str,
        after_queue: Option<&str>,
        limit: i64,
    ) -> Result<Vec<rate_limits::RateLimitRow>, crate::CoordinatorError> {
        Ok(rate_limits::list_rate_limits(self.store.pool(), namespace, after_queue, limit).await?)
    }

    /// Deletes a queue's limit.
    pub async fn delete_queue_rate_limit(
        &self,
        namespace: &str,
        queue: &str,
    ) -> Result<(), crate::CoordinatorError> {
        if rate_limits::delete_rate_limit(self.store.pool(), namespace, queue).await? {
            Ok(())
        } else {
            Err(crate::CoordinatorError::RateLimitNotFound(queue.to_owned()))
        }
    }
}
