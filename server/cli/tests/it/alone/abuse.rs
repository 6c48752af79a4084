//! The abuse suite: every RPC the running server offers, found through its
//! reflection service, called with generated hostile values (empty, huge,
//! deep, NUL, invalid UTF-8, negative, unknown enums, malformed protobuf,
//! hostile workflow sources) in batches, one batch per method. It asserts
//! that no call ends INTERNAL, UNKNOWN or UNAVAILABLE (the stores are up),
//! that no error message echoes the input (at most 1,000 bytes), that
//! undecodable requests are INVALID_ARGUMENT and unknown enum numbers are
//! refused, and, after each batch, that the server still answers its health
//! check and that its RSS stays bounded.
//!
//! Values come from a seeded generator: the seed is printed, and
//! `COMPOSER_ABUSE_SEED=<n>` sends the same values again;
//! `COMPOSER_ABUSE_VERBOSE=1` prints every call and its outcome.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    fmt::Write as _,
    path::PathBuf,
    time::{Duration, Instant},
};

use composer_grpc::auth::{NewToken, RPC_ROLES, Role, SigningKey, mint};
use composer_proto::v1::{
    FailTaskRequest, GetRunRequest, PollTasksRequest, PollTasksResponse, RegisterWorkflowRequest,
    RegisterWorkflowResponse, StartRunRequest, StartRunResponse, Task, WatchRunRequest,
    run_service_client::RunServiceClient, worker_service_client::WorkerServiceClient,
    workflow_service_client::WorkflowServiceClient,
};
use composer_testkit::ServerProcess;
use futures::StreamExt;
use prost::{
    Message as _,
    bytes::{Buf, BufMut, Bytes},
};
use prost_reflect::{
    DescriptorPool, DynamicMessage, FieldDescriptor, Kind, MapKey, MessageDescriptor,
    Value as Reflected,
};
use prost_types::{ListValue, Struct, Value, value::Kind as ValueKind};
use tonic::{
    Code, Request, Status,
    codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder},
    transport::{Channel, Endpoint},
};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};
use tonic_reflection::pb::v1::{
    ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
    server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
};

const SECRET: &str = "a-test-secret-that-is-long-enough-for-hs256-0123456789";
/// Services the suite does not abuse. Health is the probe the suite asks
/// after every batch (its answer must stay trustworthy) and reflection is
/// how the suite finds the others; both are tonic's own code with no
/// Composer logic behind them.
const SKIPPED_SERVICES: &[&str] = &[
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
];
/// Codes a hostile call must never end with while Postgres and Redis are up.
const NEVER: &[Code] = &[
    Code::Internal,
    Code::Unknown,
    Code::Unavailable,
    Code::DataLoss,
    Code::Unimplemented,
    Code::Cancelled,
    Code::Unauthenticated,
    // no RPC's contract names OUT_OF_RANGE; an oversized message is
    // RESOURCE_EXHAUSTED (gRPC's own rule)
    Code::OutOfRange,
];
/// Longest error message a caller may get: longer means input is echoed.
const MAX_MESSAGE_BYTES: usize = 1_000;
/// Longest `grpc-status-details-bin` a caller may get.
const MAX_DETAILS_BYTES: usize = 8_192;
/// The server's resident memory must stay under this after every batch.
const MAX_RSS_BYTES: u64 = 300 * 1024 * 1024;
/// Client deadline of an ordinary call.
const DEADLINE: Duration = Duration::from_secs(10);
/// Client deadline of a long poll (PollTasks) or a stream (WatchRun).
const LONG_POLL_DEADLINE: Duration = Duration::from_secs(3);
/// Calls in flight at once within a batch.
const CONCURRENCY: usize = 4;
/// Cases per method that mutate several fields at once, at random.
const MIXED_CASES: usize = 30;
/// Failing calls the panic message lists one by one (all are counted).
const REPORTED_FAILURES: usize = 120;

/// Runs (each with a leased task) that the cases point at.
const SETUP_RUNS: usize = 150;
const MIB: usize = 1024 * 1024;
const QUEUE: &str = "abuse";
const WORKFLOW: &str = "abuse_flow";
const SOURCE: &str = r#"
name: abuse_flow
description: the abuse suite's workflow
nodes:
  - { id: work, type: TASK, queue: abuse, task: work, input: { n: "${input.n}" } }
  - { id: approval, type: WAIT_FOR_EVENT, event: go, timeout: 1h }
edges:
  - { from: work, to: approval }
"#;

fn composer_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_composer"))
}

// ---------------------------------------------------------------------------
// the seeded generator

/// SplitMix64: small, fast, and the same sequence for the same seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % (n.max(1) as u64)).unwrap_or(0)
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }

    /// Text from a hostile alphabet: name characters, separators, quotes,
    /// template and CEL syntax, control characters and multi-byte ones.
    fn text(&mut self, len: usize) -> String {
        const ALPHABET: &str = "aZ0_-./\\'\"`${}[]*%:@# \t\n\r\u{1b}\u{7f}éß中\u{202e}\u{200b}\u{feff}🦀\u{10ffff}\u{fffd}<>&";
        let chars: Vec<char> = ALPHABET.chars().collect();
        let mut out = String::with_capacity(len);
        while out.len() < len {
            out.push(*self.pick(&chars));
        }
        out
    }

    /// A valid name (docs/names.md) of `len` characters.
    fn name(&mut self, len: usize) -> String {
        const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-";
        (0..len)
            .map(|i| {
                let pool = if i == 0 { &CHARS[..62] } else { CHARS };
                char::from(*self.pick(pool))
            })
            .collect()
    }
}

// ---------------------------------------------------------------------------
// protobuf wire writing, for what a well-behaved encoder cannot produce

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const START_GROUP: u8 = 3;

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_tag(out: &mut Vec<u8>, number: u32, wire_type: u8) {
    put_varint(out, (u64::from(number) << 3) | u64::from(wire_type));
}

/// One length-delimited field: `number` carrying `payload`.
fn len_field(number: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 10);
    put_tag(&mut out, number, LEN);
    put_varint(&mut out, payload.len() as u64);
    out.extend_from_slice(payload);
    out
}

fn varint_field(number: u32, value: u64) -> Vec<u8> {
    let mut out = Vec::new();
    put_tag(&mut out, number, VARINT);
    put_varint(&mut out, value);
    out
}

/// A map entry (key 1, value 2) of string → string, from raw bytes.
fn map_entry(number: u32, key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut entry = len_field(1, key);
    entry.extend(len_field(2, value));
    len_field(number, &entry)
}

/// Bytes that are not UTF-8: a lone continuation byte, an overlong
/// encoding, a surrogate and a truncated sequence, around random bytes.
fn invalid_utf8(rng: &mut Rng) -> Vec<u8> {
    let mut bytes = b"abc".to_vec();
    bytes.extend([0x80, 0xc0, 0xaf, 0xed, 0xa0, 0x80]);
    bytes.extend(rng.bytes(8).into_iter().map(|b| b | 0x80));
    bytes.extend([0xe2, 0x82]);
    bytes
}

// ---------------------------------------------------------------------------
// google.protobuf.Value trees

fn string_value(text: String) -> Value {
    Value {
        kind: Some(ValueKind::StringValue(text)),
    }
}

fn number_value(n: f64) -> Value {
    Value {
        kind: Some(ValueKind::NumberValue(n)),
    }
}

fn struct_value(fields: BTreeMap<String, Value>) -> Value {
    Value {
        kind: Some(ValueKind::StructValue(Struct { fields })),
    }
}

fn list_value(values: Vec<Value>) -> Value {
    Value {
        kind: Some(ValueKind::ListValue(ListValue { values })),
    }
}

fn deep_lists(depth: usize) -> Value {
    (0..depth).fold(number_value(1.0), |inner, _| list_value(vec![inner]))
}

fn deep_structs(depth: usize) -> Value {
    (0..depth).fold(number_value(1.0), |inner, _| {
        struct_value(BTreeMap::from([("a".to_owned(), inner)]))
    })
}

fn small_input() -> Value {
    struct_value(BTreeMap::from([("n".to_owned(), number_value(1.0))]))
}

// ---------------------------------------------------------------------------
// hostile workflow sources: valid-looking YAML with a hostile piece

fn hostile_sources(rng: &mut Rng) -> Vec<(&'static str, String)> {
    let task = |input: &str| {
        format!(
            "name: abuse_src\nnodes:\n  - id: a\n    type: TASK\n    queue: {QUEUE}\n    task: t\n    input: {input}\n"
        )
    };
    let mut block = String::from(
        "name: abuse_src\nnodes:\n  - id: a\n    type: TASK\n    queue: abuse\n    task: t\n    input:\n",
    );
    for depth in 0..400 {
        let _ = writeln!(block, "{}k{depth}:", "  ".repeat(depth + 3));
    }
    let mut bomb = String::from(
        "x0: &x0 [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
    );
    for level in 1..6 {
        let refs = vec![format!("*x{}", level - 1); 10].join(",");
        let _ = writeln!(bomb, "x{level}: &x{level} [{refs}]");
    }
    bomb.push_str(
        "name: abuse_bomb\nnodes:\n  - { id: a, type: TASK, queue: abuse, task: t, input: *x5 }\n",
    );
    let items: Vec<String> = (0..20_000).map(|i| i.to_string()).collect();
    let mut chain = String::from("name: abuse_chain\nnodes:\n");
    for i in 0..10_000 {
        let _ = writeln!(
            chain,
            "  - {{ id: n{i}, type: TASK, queue: abuse, task: t }}"
        );
    }
    chain.push_str("edges:\n");
    for i in 1..10_000 {
        let _ = writeln!(chain, "  - {{ from: n{}, to: n{i} }}", i - 1);
    }
    let random_name = rng.text(64);
    vec![
        (
            "yaml-deep-flow-5000",
            task(&format!("{}1{}", "[".repeat(5_000), "]".repeat(5_000))),
        ),
        (
            "yaml-deep-flow-map-3000",
            task(&format!("{}1{}", "{a: ".repeat(3_000), "}".repeat(3_000))),
        ),
        ("yaml-deep-block-400", block),
        ("yaml-alias-bomb-10^6", bomb),
        (
            "yaml-wait-26687997791d",
            "name: abuse_wait\nnodes:\n  - { id: nap, type: WAIT, duration: 26687997791d }\n"
                .to_owned(),
        ),
        (
            "yaml-wait-negative",
            "name: abuse_wait\nnodes:\n  - { id: nap, type: WAIT, duration: -5s }\n".to_owned(),
        ),
        (
            "yaml-map-items-literal-20000",
            format!(
                "name: abuse_map\nnodes:\n  - id: each\n    type: MAP\n    items: \"[{}]\"\n    queue: abuse\n    task: t\n",
                items.join(",")
            ),
        ),
        (
            "yaml-map-input-items-concurrency-2^31",
            "name: abuse_map_input\nnodes:\n  - id: each\n    type: MAP\n    items: input.items\n    concurrency: 2147483648\n    queue: abuse_map\n    task: t\n    input: { n: \"${item}\" }\n"
                .to_owned(),
        ),
        (
            "yaml-cel-deep-parens-2000",
            task(&format!(
                "\"${{{}1{}}}\"",
                "(".repeat(2_000),
                ")".repeat(2_000)
            )),
        ),
        (
            "yaml-cel-long-chain-2000",
            task(&format!("\"${{1{}}}\"", "+1".repeat(2_000))),
        ),
        (
            "yaml-cel-deep-unary-4000",
            task(&format!("\"${{{}true}}\"", "!".repeat(4_000))),
        ),
        ("yaml-10000-nodes-chained", chain),
        (
            "yaml-retry-extreme",
            "name: abuse_retry\nnodes:\n  - id: a\n    type: TASK\n    queue: abuse\n    task: t\n    timeout: 99999999999999h\n    heartbeat_timeout: 0s\n    retry: { max_attempts: 2147483647, initial_interval: 26687997791d, max_interval: 26687997791d, backoff: 1e308 }\n"
                .to_owned(),
        ),
        (
            "yaml-run-timeout-26687997791d",
            format!("timeout: 26687997791d\n{SOURCE}"),
        ),
        (
            "yaml-wait-0s-then-1ms",
            "name: abuse_wait_short\nnodes:\n  - { id: a, type: WAIT, duration: 0s }\n  - { id: b, type: WAIT, duration: 1ms }\nedges:\n  - { from: a, to: b }\n"
                .to_owned(),
        ),
        (
            "yaml-cycle",
            "name: abuse_cycle\nnodes:\n  - { id: a, type: TASK, queue: abuse, task: t }\n  - { id: b, type: TASK, queue: abuse, task: t }\nedges:\n  - { from: a, to: a }\n  - { from: a, to: b }\n  - { from: b, to: a }\n"
                .to_owned(),
        ),
        (
            "yaml-long-ids-100k",
            format!(
                "name: {}\nnodes:\n  - {{ id: {}, type: TASK, queue: {}, task: t }}\n",
                "n".repeat(100_000),
                "i".repeat(100_000),
                "q".repeat(100_000)
            ),
        ),
        (
            "yaml-hostile-names",
            format!(
                "name: \"{}\"\nnodes:\n  - {{ id: \"a\\0b\", type: TASK, queue: \"_http\", task: \"../x\" }}\n",
                random_name.replace(['"', '\\'], "")
            ),
        ),
        (
            "yaml-bom-tabs-and-nul",
            "\u{feff}name:\tabuse_bom\nnodes:\n\t- { id: a\0, type: TASK }\n".to_owned(),
        ),
        (
            "yaml-duplicate-and-merge-keys",
            "base: &b { type: TASK, queue: abuse, task: t }\nname: abuse_dup\nname: abuse_dup2\nnodes:\n  - { <<: *b, id: a, id: b }\n"
                .to_owned(),
        ),
        (
            "yaml-unknown-node-type",
            "name: abuse_type\nnodes:\n  - { id: a, type: \"\\u0000EXEC\", command: \"rm -rf /\" }\n"
                .to_owned(),
        ),
        (
            "yaml-comment-1MiB",
            format!("{SOURCE}# {}\n", "x".repeat(MIB)),
        ),
        (
            "json-deep-arrays-10000",
            format!(
                "{{\"name\":\"abuse_json\",\"nodes\":{}{}}}",
                "[".repeat(10_000),
                "]".repeat(10_000)
            ),
        ),
    ]
}

// ---------------------------------------------------------------------------
// calling with raw bytes

/// A tonic codec that sends and receives message bytes untouched.
#[derive(Default, Clone, Copy)]
struct RawCodec;

struct RawEncoder;
struct RawDecoder;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

impl Encoder for RawEncoder {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// One RPC the server offers.
#[derive(Clone)]
struct Method {
    /// `/package.Service/Method`.
    path: String,
    /// `Service/Method`, for the report.
    short: String,
    input: MessageDescriptor,
    server_streaming: bool,
    client_streaming: bool,
}

impl Method {
    /// Long polls and streams may legitimately run into the deadline.
    fn is_long_poll(&self) -> bool {
        self.server_streaming || self.short.contains("Poll")
    }
}

/// What one call ended with.
struct Outcome {
    code: Code,
    message: String,
    details_len: usize,
    /// The response message of an OK unary call.
    body: Option<Bytes>,
}

impl Outcome {
    fn from_status(status: &Status) -> Self {
        Self {
            code: status.code(),
            message: status.message().to_owned(),
            details_len: status.details().len(),
            body: None,
        }
    }

    fn ok() -> Self {
        Self::failed(Code::Ok, String::new())
    }

    fn failed(code: Code, message: String) -> Self {
        Self {
            code,
            message,
            details_len: 0,
            body: None,
        }
    }
}

/// Calls `method` with `body` on a connection of its own, so a call that
/// breaks its connection cannot fail the calls beside it. The connection
/// accepts response headers of any size, so an echoing error message shows
/// as what it is rather than as a protocol error.
async fn call(
    endpoint: &Endpoint,
    method: &Method,
    body: Bytes,
    headers: &[(&'static str, String)],
) -> Outcome {
    let deadline = if method.is_long_poll() {
        LONG_POLL_DEADLINE
    } else {
        DEADLINE
    };
    let path = http::uri::PathAndQuery::try_from(method.path.as_str()).expect("method path");
    let attempt = async {
        let channel = match endpoint.connect().await {
            Ok(channel) => channel,
            Err(error) => {
                return Outcome::failed(Code::Unavailable, format!("could not connect: {error}"));
            }
        };
        let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(64 * MIB);
        if let Err(error) = grpc.ready().await {
            return Outcome::failed(Code::Unavailable, format!("channel not ready: {error}"));
        }
        let mut metadata = tonic::metadata::MetadataMap::new();
        for (name, value) in headers {
            metadata.insert(*name, value.parse().expect("an ASCII header value"));
        }
        if method.client_streaming {
            let mut request = Request::new(futures::stream::iter(vec![body]));
            *request.metadata_mut() = metadata;
            request.set_timeout(deadline);
            return match grpc.client_streaming(request, path, RawCodec).await {
                Ok(_) => Outcome::ok(),
                Err(status) => Outcome::from_status(&status),
            };
        }
        let mut request = Request::new(body);
        *request.metadata_mut() = metadata;
        request.set_timeout(deadline);
        if method.server_streaming {
            return match grpc.server_streaming(request, path, RawCodec).await {
                Err(status) => Outcome::from_status(&status),
                Ok(response) => {
                    let mut stream = response.into_inner();
                    match tokio::time::timeout(Duration::from_secs(2), stream.message()).await {
                        Ok(Ok(_)) => Outcome::ok(),
                        Ok(Err(status)) => Outcome::from_status(&status),
                        Err(_) => Outcome::failed(
                            Code::DeadlineExceeded,
                            "no first message within 2 s".to_owned(),
                        ),
                    }
                }
            };
        }
        match grpc.unary(request, path, RawCodec).await {
            Ok(response) => Outcome {
                body: Some(response.into_inner()),
                ..Outcome::ok()
            },
            Err(status) => Outcome::from_status(&status),
        }
    };
    match tokio::time::timeout(deadline + Duration::from_secs(5), attempt).await {
        Ok(outcome) => outcome,
        Err(_) => Outcome::failed(
            Code::DeadlineExceeded,
            "the client gave up 5 s after the deadline".to_owned(),
        ),
    }
}

// ---------------------------------------------------------------------------
// discovery through reflection

async fn reflect(channel: &Channel, request: MessageRequest) -> MessageResponse {
    let mut client = ServerReflectionClient::new(channel.clone());
    let mut responses = client
        .server_reflection_info(futures::stream::iter(vec![ServerReflectionRequest {
            host: String::new(),
            message_request: Some(request),
        }]))
        .await
        .expect("reflection answers")
        .into_inner();
    responses
        .message()
        .await
        .expect("reflection response")
        .and_then(|r| r.message_response)
        .expect("a reflection message")
}

/// Every method of every service the server serves, but the skipped ones.
async fn discover(channel: &Channel) -> Vec<Method> {
    let MessageResponse::ListServicesResponse(list) =
        reflect(channel, MessageRequest::ListServices(String::new())).await
    else {
        panic!("reflection did not list services");
    };
    let mut files: BTreeMap<String, prost_types::FileDescriptorProto> = BTreeMap::new();
    let services: Vec<String> = list
        .service
        .into_iter()
        .map(|s| s.name)
        .filter(|name| !SKIPPED_SERVICES.contains(&name.as_str()))
        .collect();
    assert!(!services.is_empty(), "reflection lists no Composer service");
    for service in &services {
        let MessageResponse::FileDescriptorResponse(found) = reflect(
            channel,
            MessageRequest::FileContainingSymbol(service.clone()),
        )
        .await
        else {
            panic!("reflection has no file for {service}");
        };
        for bytes in found.file_descriptor_proto {
            let file = prost_types::FileDescriptorProto::decode(bytes.as_slice())
                .expect("a file descriptor");
            files.insert(file.name().to_owned(), file);
        }
    }
    // the files the services' files import, and theirs, by name
    let mut missing: Vec<String> = files
        .values()
        .flat_map(|f| f.dependency.clone())
        .filter(|d| !files.contains_key(d))
        .collect();
    while let Some(name) = missing.pop() {
        if files.contains_key(&name) {
            continue;
        }
        let MessageResponse::FileDescriptorResponse(found) =
            reflect(channel, MessageRequest::FileByFilename(name.clone())).await
        else {
            panic!("reflection has no file {name}");
        };
        for bytes in found.file_descriptor_proto {
            let file = prost_types::FileDescriptorProto::decode(bytes.as_slice())
                .expect("a file descriptor");
            missing.extend(
                file.dependency
                    .iter()
                    .filter(|d| !files.contains_key(*d))
                    .cloned(),
            );
            files.insert(file.name().to_owned(), file);
        }
    }
    let mut pool = DescriptorPool::new();
    pool.add_file_descriptor_protos(files.into_values())
        .expect("the served descriptors are complete");
    let mut methods = Vec::new();
    for service in &services {
        let descriptor = pool
            .get_service_by_name(service)
            .unwrap_or_else(|| panic!("{service} listed but not described"));
        for method in descriptor.methods() {
            methods.push(Method {
                path: format!("/{}/{}", descriptor.full_name(), method.name()),
                short: format!("{}/{}", descriptor.name(), method.name()),
                input: method.input(),
                server_streaming: method.is_server_streaming(),
                client_streaming: method.is_client_streaming(),
            });
        }
    }
    methods
}

// ---------------------------------------------------------------------------
// tokens

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

fn token(role: Role) -> String {
    let now = now();
    let claims = NewToken {
        sub: format!("abuse-{}", role.as_str()),
        ns: "default".to_owned(),
        roles: vec![role.as_str().to_owned()],
        queues: (role == Role::Worker).then(|| vec![QUEUE.to_owned()]),
        iat: now,
        nbf: now,
        exp: now + 3600,
        iss: None,
        aud: None,
    };
    mint(&claims, SigningKey::Secret(SECRET.as_bytes()), None).expect("mint")
}

/// The authorization header of `token`.
fn bearer(token: &str) -> Vec<(&'static str, String)> {
    vec![("authorization", format!("Bearer {token}"))]
}

fn authed<T>(message: T, token: &str) -> Request<T> {
    let mut request = Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("header"),
    );
    request
}

/// The roles allowed to call `path`; admin alone for an RPC the table does
/// not know yet.
fn allowed_roles(path: &str) -> Vec<Role> {
    RPC_ROLES
        .iter()
        .find(|(p, _)| *p == path)
        .map_or_else(|| vec![Role::Admin], |(_, roles)| roles.to_vec())
}

// ---------------------------------------------------------------------------
// real things for the valid-looking base messages to point at

struct Context {
    run_ids: Vec<String>,
    leases: Vec<Task>,
}

async fn set_up(channel: &Channel, admin: &str) -> Context {
    WorkflowServiceClient::new(channel.clone())
        .register_workflow(authed(
            RegisterWorkflowRequest {
                source: SOURCE.to_owned(),
            },
            admin,
        ))
        .await
        .expect("register the suite's workflow");
    let mut runs = RunServiceClient::new(channel.clone());
    let mut run_ids = Vec::new();
    for i in 0..SETUP_RUNS {
        let run = runs
            .start_run(authed(
                StartRunRequest {
                    workflow_name: WORKFLOW.to_owned(),
                    version: 0,
                    input: Some(small_input()),
                    idempotency_key: format!("abuse-setup-{i}"),
                    labels: HashMap::from([("team".to_owned(), "abuse".to_owned())]),
                    priority: 0,
                },
                admin,
            ))
            .await
            .expect("start a run")
            .into_inner()
            .run
            .expect("run");
        run_ids.push(run.run_id);
    }
    let mut worker = WorkerServiceClient::new(channel.clone());
    let mut leases = Vec::new();
    for _ in 0..20 {
        let tasks = worker
            .poll_tasks(authed(
                PollTasksRequest {
                    confirm_receipt: false,
                    worker_id: "abuse-setup".to_owned(),
                    queues: vec![QUEUE.to_owned()],
                    max_tasks: 100,
                    wait: Some(prost_types::Duration {
                        seconds: 1,
                        nanos: 0,
                    }),
                },
                admin,
            ))
            .await
            .expect("poll")
            .into_inner()
            .tasks;
        leases.extend(tasks);
        if leases.len() >= SETUP_RUNS {
            break;
        }
    }
    assert!(!leases.is_empty(), "the setup runs produced no task");
    Context { run_ids, leases }
}

// ---------------------------------------------------------------------------
// base messages: valid-looking requests, chosen by field name

fn message_of(descriptor: &MessageDescriptor, encoded: &[u8]) -> Reflected {
    Reflected::Message(
        DynamicMessage::decode(descriptor.clone(), encoded).expect("a well-known message"),
    )
}

fn base_value(field: &FieldDescriptor, context: &Context, slot: usize) -> Option<Reflected> {
    let lease = &context.leases[slot % context.leases.len()];
    let run_id = &context.run_ids[slot % context.run_ids.len()];
    let text = |s: &str| Some(Reflected::String(s.to_owned()));
    if let Kind::Message(message) = field.kind() {
        if field.is_map() {
            let mut map = HashMap::new();
            map.insert(
                MapKey::String("team".to_owned()),
                Reflected::String("abuse".to_owned()),
            );
            return Some(Reflected::Map(map));
        }
        return match message.full_name() {
            "google.protobuf.Value" => Some(message_of(&message, &small_input().encode_to_vec())),
            "google.protobuf.Duration" => Some(message_of(
                &message,
                &prost_types::Duration {
                    seconds: 0,
                    nanos: 100_000_000,
                }
                .encode_to_vec(),
            )),
            _ => None,
        };
    }
    match field.name() {
        "run_id" => text(run_id),
        "workflow_name" | "name" => text(WORKFLOW),
        "name_prefix" => text("abuse"),
        "source" => text(SOURCE),
        "event_name" => text("go"),
        "worker_id" => text("abuse-worker"),
        "reason" | "message" => text("the abuse suite"),
        "error_code" => text("ABUSE"),
        "task_id" => text(&lease.task_id),
        "lease_token" => text(&lease.lease_token),
        "attempt" => Some(Reflected::I32(lease.attempt)),
        "queues" => Some(Reflected::List(vec![Reflected::String(QUEUE.to_owned())])),
        "max_tasks" => Some(Reflected::I32(1)),
        "page_size" => Some(Reflected::I32(10)),
        "retryable" => Some(Reflected::Bool(true)),
        _ => None,
    }
}

fn base_message(descriptor: &MessageDescriptor, context: &Context, slot: usize) -> DynamicMessage {
    let mut message = DynamicMessage::new(descriptor.clone());
    for field in descriptor.fields() {
        // one member of a oneof: the first that has a base value
        if let Some(oneof) = field.containing_oneof()
            && oneof.fields().any(|f| message.has_field(&f))
        {
            continue;
        }
        if let Some(value) = base_value(&field, context, slot) {
            message.set_field(&field, value);
        }
    }
    message
}

// ---------------------------------------------------------------------------
// hostile values per field

/// What a case's outcome must be, beyond never being one of `NEVER`.
#[derive(Clone, Copy, Debug)]
enum Expect {
    /// Anything else.
    Any,
    /// One of these codes.
    OneOf(&'static [Code]),
    /// Anything but OK: the value must be refused.
    Refused,
}

const INVALID: Expect = Expect::OneOf(&[Code::InvalidArgument]);
const TOO_BIG: Expect = Expect::OneOf(&[Code::ResourceExhausted, Code::InvalidArgument]);

/// One hostile value of one field: the field's bytes on the wire.
struct Hostile {
    kind: String,
    wire: Vec<u8>,
    expect: Expect,
}

fn hostile(kind: impl Into<String>, wire: Vec<u8>, expect: Expect) -> Hostile {
    Hostile {
        kind: kind.into(),
        wire,
        expect,
    }
}

/// The wire bytes of `field` set to `value`, through a DynamicMessage.
fn encoded(parent: &MessageDescriptor, field: &FieldDescriptor, value: Reflected) -> Vec<u8> {
    let mut message = DynamicMessage::new(parent.clone());
    message.set_field(field, value);
    message.encode_to_vec()
}

fn string_kinds(field: &FieldDescriptor, rng: &mut Rng) -> Vec<(String, String)> {
    let mut kinds = vec![
        ("empty".to_owned(), String::new()),
        ("nul".to_owned(), format!("abuse\0{}", rng.name(8))),
        ("nul-only".to_owned(), "\0".to_owned()),
        ("hostile-text-200".to_owned(), rng.text(200)),
        (
            "injection".to_owned(),
            rng.pick(&[
                "'; DROP TABLE runs; --",
                "../../etc/passwd",
                "${input}",
                "%s%n%x",
                "*",
                "_http",
                "composer:tasks:abuse:0",
                "\r\nX-Injected: 1",
            ])
            .to_string(),
        ),
        (
            "unicode-controls".to_owned(),
            "\u{202e}\u{200b}\u{feff}\u{1b}[31m\u{7f}".to_owned(),
        ),
        ("long-20KB".to_owned(), rng.name(20_000)),
        ("huge-1MiB".to_owned(), rng.name(MIB)),
        ("huge-3MiB".to_owned(), "x".repeat(3 * MIB)),
    ];
    let too_long = 65 + rng.below(200);
    kinds.push(("name-too-long".to_owned(), rng.name(too_long)));
    // property-based: random text of random length, a different draw per run
    for max in [64, 4_096, 65_536] {
        let len = rng.below(max);
        kinds.push((format!("random-text-{len}"), rng.text(len)));
    }
    let name = field.name();
    if name.ends_with("_id") || name == "lease_token" {
        kinds.push((
            "nil-uuid".to_owned(),
            "00000000-0000-0000-0000-000000000000".to_owned(),
        ));
        kinds.push((
            "max-uuid".to_owned(),
            "ffffffff-ffff-ffff-ffff-ffffffffffff".to_owned(),
        ));
        kinds.push((
            "braced-uuid".to_owned(),
            "{01a22912-878d-7305-883d-15381beb6288}".to_owned(),
        ));
    }
    if name.contains("page_token") {
        for token in [
            "9223372036854775807_00000000-0000-0000-0000-000000000000",
            "-9223372036854775808_ffffffff-ffff-ffff-ffff-ffffffffffff",
            "1_",
            "_",
            "99999999999999999999999999_x",
            "AAAAAAAAAAAA====",
        ] {
            kinds.push(("forged-page-token".to_owned(), token.to_owned()));
        }
        kinds.push((
            "page-token-1MiB".to_owned(),
            format!("1_{}", "9".repeat(MIB)),
        ));
    }
    kinds
}

fn integer_values(kind: &Kind, rng: &mut Rng) -> Vec<(&'static str, Reflected)> {
    match kind {
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => vec![
            ("negative", Reflected::I32(-1)),
            ("i32-min", Reflected::I32(i32::MIN)),
            ("i32-max", Reflected::I32(i32::MAX)),
            ("random-i32", Reflected::I32(rng.next() as i32)),
        ],
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => vec![
            ("negative", Reflected::I64(-1)),
            ("i64-min", Reflected::I64(i64::MIN)),
            ("i64-max", Reflected::I64(i64::MAX)),
            ("random-i64", Reflected::I64(rng.next() as i64)),
        ],
        Kind::Uint32 | Kind::Fixed32 => vec![("u32-max", Reflected::U32(u32::MAX))],
        Kind::Uint64 | Kind::Fixed64 => vec![("u64-max", Reflected::U64(u64::MAX))],
        Kind::Double => vec![
            ("nan", Reflected::F64(f64::NAN)),
            ("infinity", Reflected::F64(f64::INFINITY)),
        ],
        Kind::Float => vec![("nan", Reflected::F32(f32::NAN))],
        _ => Vec::new(),
    }
}

fn value_kinds(rng: &mut Rng) -> Vec<(String, Vec<u8>, Expect)> {
    let plain =
        |kind: &str, value: Value, expect: Expect| (kind.to_owned(), value.encode_to_vec(), expect);
    let mut many = BTreeMap::new();
    for i in 0..30_000 {
        many.insert(format!("k{i}"), number_value(f64::from(i)));
    }
    let mut bad_string = Vec::new();
    put_tag(&mut bad_string, 3, LEN);
    let bytes = invalid_utf8(rng);
    put_varint(&mut bad_string, bytes.len() as u64);
    bad_string.extend(&bytes);
    let bad_key = len_field(
        5,
        &len_field(1, &{
            let mut entry = len_field(1, &invalid_utf8(rng));
            entry.extend(len_field(2, &number_value(1.0).encode_to_vec()));
            entry
        }),
    );
    vec![
        plain("value-deep-lists-60", deep_lists(60), Expect::Any),
        plain("value-deep-structs-60", deep_structs(60), Expect::Any),
        plain("value-deep-lists-130", deep_lists(130), Expect::Any),
        plain("value-deep-structs-200", deep_structs(200), Expect::Any),
        plain("value-deep-lists-1000", deep_lists(1_000), Expect::Any),
        plain("value-nan", number_value(f64::NAN), Expect::Any),
        plain(
            "value-infinity",
            number_value(f64::NEG_INFINITY),
            Expect::Any,
        ),
        plain("value-no-kind", Value { kind: None }, Expect::Any),
        plain(
            "value-string-nul",
            string_value(format!("a\0{}", rng.text(16))),
            Expect::Any,
        ),
        plain(
            "value-key-nul",
            struct_value(BTreeMap::from([("a\0b".to_owned(), number_value(1.0))])),
            Expect::Any,
        ),
        plain(
            "value-list-20000",
            list_value((0..20_000).map(|i| number_value(f64::from(i))).collect()),
            Expect::Any,
        ),
        plain("value-struct-30000-keys", struct_value(many), Expect::Any),
        plain(
            "value-string-2.5MiB",
            string_value("v".repeat(5 * MIB / 2)),
            Expect::Any,
        ),
        plain(
            "value-string-5MiB",
            string_value("v".repeat(5 * MIB)),
            TOO_BIG,
        ),
        ("value-string-invalid-utf8".to_owned(), bad_string, INVALID),
        ("value-key-invalid-utf8".to_owned(), bad_key, INVALID),
    ]
}

fn duration_kinds() -> Vec<(&'static str, prost_types::Duration)> {
    let d = |seconds, nanos| prost_types::Duration { seconds, nanos };
    vec![
        ("duration-negative", d(-1, 0)),
        ("duration-i64-max", d(i64::MAX, 999_999_999)),
        ("duration-i64-min", d(i64::MIN, -999_999_999)),
        ("duration-nanos-out-of-range", d(0, 2_000_000_000)),
        ("duration-sign-mismatch", d(1, -1)),
        ("duration-past-10000-years", d(315_576_000_001, 0)),
    ]
}

fn timestamp_kinds() -> Vec<(&'static str, prost_types::Timestamp)> {
    let t = |seconds, nanos| prost_types::Timestamp { seconds, nanos };
    vec![
        ("timestamp-i64-min", t(i64::MIN, 0)),
        ("timestamp-i64-max", t(i64::MAX, 999_999_999)),
        ("timestamp-negative-nanos", t(0, -1)),
        ("timestamp-nanos-out-of-range", t(0, 1_000_000_000)),
        ("timestamp-year-10000", t(253_402_300_800, 0)),
        ("timestamp-before-year-1", t(-62_135_596_801, 0)),
    ]
}

/// Every hostile value of `field`, as wire bytes replacing it.
fn field_kinds(
    parent: &MessageDescriptor,
    field: &FieldDescriptor,
    depth: usize,
    rng: &mut Rng,
) -> Vec<Hostile> {
    let number = field.number();
    let mut out = Vec::new();
    let kind = field.kind();
    if field.is_map() {
        let Kind::Message(entry) = &kind else {
            return out;
        };
        let value_field = entry.map_entry_value_field();
        let key_field = entry.map_entry_key_field();
        if key_field.kind() != Kind::String {
            return out;
        }
        let string_values = value_field.kind() == Kind::String;
        let entry_of = |key: &[u8], value: &[u8]| {
            if string_values {
                map_entry(number, key, value)
            } else {
                map_entry(number, key, &[])
            }
        };
        let mut many = Vec::new();
        for i in 0..30_000 {
            many.extend(entry_of(
                format!("k{i}").as_bytes(),
                format!("v{i}").as_bytes(),
            ));
        }
        out.push(hostile("map-30000-entries", many, Expect::Any));
        out.push(hostile("map-key-empty", entry_of(b"", b"v"), Expect::Any));
        out.push(hostile("map-key-nul", entry_of(b"a\0b", b"v"), Expect::Any));
        out.push(hostile(
            "map-value-nul",
            entry_of(b"team", b"a\0b"),
            Expect::Any,
        ));
        out.push(hostile(
            "map-key-10KB",
            entry_of(rng.name(10_000).as_bytes(), b"v"),
            Expect::Any,
        ));
        out.push(hostile(
            "map-value-1MiB",
            entry_of(b"team", rng.name(MIB).as_bytes()),
            Expect::Any,
        ));
        out.push(hostile(
            "map-key-invalid-utf8",
            entry_of(&invalid_utf8(rng), b"v"),
            INVALID,
        ));
        if string_values {
            out.push(hostile(
                "map-value-invalid-utf8",
                entry_of(b"team", &invalid_utf8(rng)),
                INVALID,
            ));
        }
        return out;
    }
    let repeated = field.is_list();
    match &kind {
        Kind::String => {
            for (label, text) in string_kinds(field, rng) {
                let value = Reflected::String(text);
                let value = if repeated {
                    Reflected::List(vec![value])
                } else {
                    value
                };
                out.push(hostile(label, encoded(parent, field, value), Expect::Any));
            }
            out.push(hostile(
                "invalid-utf8",
                len_field(number, &invalid_utf8(rng)),
                INVALID,
            ));
            if repeated {
                let many = (0..20_000)
                    .map(|i| Reflected::String(format!("{QUEUE}{i}")))
                    .collect();
                out.push(hostile(
                    "repeated-20000",
                    encoded(parent, field, Reflected::List(many)),
                    Expect::Any,
                ));
                out.push(hostile(
                    "repeated-duplicates-100",
                    encoded(
                        parent,
                        field,
                        Reflected::List(vec![Reflected::String(QUEUE.to_owned()); 100]),
                    ),
                    Expect::Any,
                ));
            }
            if field.name() == "source" {
                for (label, source) in hostile_sources(rng) {
                    out.push(hostile(
                        label,
                        encoded(parent, field, Reflected::String(source)),
                        Expect::Any,
                    ));
                }
            }
        }
        Kind::Bytes => {
            out.push(hostile(
                "bytes-3MiB",
                len_field(number, &rng.bytes(3 * MIB)),
                Expect::Any,
            ));
        }
        Kind::Bool => {
            out.push(hostile("bool-is-2", varint_field(number, 2), Expect::Any));
            out.push(hostile(
                "bool-is-u64-max",
                varint_field(number, u64::MAX),
                Expect::Any,
            ));
        }
        Kind::Enum(enumeration) => {
            let unknown: Vec<i32> = [99, -1, i32::MAX]
                .into_iter()
                .filter(|n| enumeration.get_value(*n).is_none())
                .collect();
            for n in unknown {
                let value = if repeated {
                    Reflected::List(vec![Reflected::EnumNumber(n)])
                } else {
                    Reflected::EnumNumber(n)
                };
                out.push(hostile(
                    format!("unknown-enum-{n}"),
                    encoded(parent, field, value),
                    Expect::Refused,
                ));
            }
            if repeated {
                let known: Vec<i32> = enumeration.values().map(|v| v.number()).collect();
                let many = (0..20_000)
                    .map(|_| Reflected::EnumNumber(*rng.pick(&known)))
                    .collect();
                out.push(hostile(
                    "repeated-20000",
                    encoded(parent, field, Reflected::List(many)),
                    Expect::Any,
                ));
            }
        }
        Kind::Message(message) => match message.full_name() {
            "google.protobuf.Value" => {
                for (label, bytes, expect) in value_kinds(rng) {
                    out.push(hostile(label, len_field(number, &bytes), expect));
                }
            }
            "google.protobuf.Duration" => {
                for (label, duration) in duration_kinds() {
                    out.push(hostile(
                        label,
                        len_field(number, &duration.encode_to_vec()),
                        Expect::Any,
                    ));
                }
            }
            "google.protobuf.Timestamp" => {
                for (label, time) in timestamp_kinds() {
                    out.push(hostile(
                        label,
                        len_field(number, &time.encode_to_vec()),
                        Expect::Any,
                    ));
                }
            }
            _ if depth >= 2 => {}
            _ => {
                // a message of our own: its fields' hostile values inside it
                for inner in message.fields() {
                    for case in field_kinds(message, &inner, depth + 1, rng) {
                        out.push(hostile(
                            format!("{}.{}", inner.name(), case.kind),
                            len_field(number, &case.wire),
                            case.expect,
                        ));
                    }
                }
            }
        },
        scalar => {
            for (label, value) in integer_values(scalar, rng) {
                let value = if repeated {
                    Reflected::List(vec![value])
                } else {
                    value
                };
                out.push(hostile(label, encoded(parent, field, value), Expect::Any));
            }
            let mut wide = Vec::new();
            put_tag(&mut wide, number, VARINT);
            wide.extend([0xff; 9]);
            wide.push(0x01);
            if !matches!(
                scalar,
                Kind::Double
                    | Kind::Float
                    | Kind::Fixed32
                    | Kind::Fixed64
                    | Kind::Sfixed32
                    | Kind::Sfixed64
            ) {
                out.push(hostile("varint-u64-max", wide, Expect::Any));
            }
        }
    }
    // the wrong wire type for the field: fixed64 where it is not
    if !matches!(kind, Kind::Double | Kind::Fixed64 | Kind::Sfixed64) {
        let mut wrong = Vec::new();
        put_tag(&mut wrong, number, FIXED64);
        wrong.extend([0u8; 8]);
        out.push(hostile("wrong-wire-type", wrong, INVALID));
    }
    out
}

/// Hostile bytes for the whole message, not one field.
fn message_kinds(base: &[u8], rng: &mut Rng) -> Vec<Hostile> {
    let with = |tail: &[u8]| {
        let mut bytes = base.to_vec();
        bytes.extend_from_slice(tail);
        bytes
    };
    let mut past_end = Vec::new();
    put_tag(&mut past_end, 1, LEN);
    put_varint(&mut past_end, 1_000);
    past_end.extend(b"abc");
    let mut group = Vec::new();
    put_tag(&mut group, 1, START_GROUP);
    let mut huge_unknown = Vec::new();
    put_tag(&mut huge_unknown, 15_000, LEN);
    put_varint(&mut huge_unknown, (5 * MIB) as u64);
    huge_unknown.resize(huge_unknown.len() + 5 * MIB, b'u');
    vec![
        hostile("empty-message", Vec::new(), Expect::Any),
        hostile("truncated-varint", with(&[0x08, 0xff]), INVALID),
        hostile("truncated-tag", with(&[0x80]), INVALID),
        hostile("length-past-end", with(&past_end), INVALID),
        hostile("field-number-0", with(&[0x02, 0x01, 0x00]), INVALID),
        hostile("unterminated-group", with(&group), INVALID),
        hostile(
            "varint-11-bytes",
            with(&[
                0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
            ]),
            INVALID,
        ),
        hostile(
            "unknown-field-1KB",
            with(&len_field(15_000, &[b'u'; 1024])),
            Expect::Any,
        ),
        hostile("message-twice", with(base), Expect::Any),
        hostile("garbage-1MiB", rng.bytes(MIB), Expect::Any),
        hostile("message-over-4MiB", with(&huge_unknown), TOO_BIG),
    ]
}

type Metadata = Vec<(&'static str, String)>;

/// Hostile metadata: tokens that are not tokens (refused with
/// UNAUTHENTICATED) and namespaces an admin should not be able to name.
fn metadata_kinds(rng: &mut Rng) -> Vec<(&'static str, Metadata, Expect)> {
    const REFUSED: Expect = Expect::OneOf(&[Code::Unauthenticated]);
    let auth = |value: String| vec![("authorization", value)];
    let namespace = |value: String| vec![("x-composer-namespace", value)];
    vec![
        (
            "token-8KB-garbage",
            auth(format!("Bearer {}", rng.name(8_000))),
            REFUSED,
        ),
        (
            "token-not-bearer",
            auth("Basic YWRtaW46YWRtaW4=".to_owned()),
            REFUSED,
        ),
        ("token-empty", auth("Bearer ".to_owned()), REFUSED),
        ("token-three-dots", auth("Bearer ...".to_owned()), REFUSED),
        (
            "namespace-traversal",
            namespace("../../other".to_owned()),
            Expect::Any,
        ),
        ("namespace-wildcard", namespace("*".to_owned()), Expect::Any),
        ("namespace-8KB", namespace(rng.name(8_000)), Expect::Any),
        (
            "namespace-reserved",
            namespace("_system".to_owned()),
            Expect::Any,
        ),
    ]
}

// ---------------------------------------------------------------------------
// cases

struct Case {
    field: String,
    kind: String,
    role: Role,
    body: Bytes,
    /// Metadata besides the role's token (which an `authorization` here
    /// replaces).
    headers: Vec<(&'static str, String)>,
    expect: Expect,
}

/// The base message with `fields` (and their oneof siblings) removed,
/// encoded.
fn base_without(base: &DynamicMessage, fields: &[&FieldDescriptor]) -> Vec<u8> {
    let mut message = base.clone();
    for field in fields {
        match field.containing_oneof() {
            Some(oneof) => {
                for sibling in oneof.fields() {
                    message.clear_field(&sibling);
                }
            }
            None => message.clear_field(field),
        }
    }
    message.encode_to_vec()
}

fn cases_for(method: &Method, context: &Context, slot: usize, rng: &mut Rng) -> Vec<Case> {
    // each case points at a run and a lease of its own where it can, so a
    // call that ends a run or a lease leaves the next case a live one
    let base_for = |index: usize| base_message(&method.input, context, slot * 61 + index);
    let base = base_for(0);
    let roles = allowed_roles(&method.path);
    let mut cases = Vec::new();
    let push = |cases: &mut Vec<Case>, field: String, hostile: Hostile, body: Vec<u8>| {
        let index = cases.len();
        // most calls as an admin, every fourth as another allowed role
        let role = if index % 4 == 3 {
            roles[(index / 4) % roles.len()]
        } else {
            Role::Admin
        };
        cases.push(Case {
            field,
            kind: hostile.kind,
            role,
            body: Bytes::from(body),
            headers: Vec::new(),
            expect: hostile.expect,
        });
    };
    let fields: Vec<FieldDescriptor> = method.input.fields().collect();
    let mut pool: Vec<(usize, Hostile)> = Vec::new();
    for (i, field) in fields.iter().enumerate() {
        for hostile in field_kinds(&method.input, field, 0, rng) {
            let mut body = base_without(&base_for(cases.len()), &[field]);
            body.extend_from_slice(&hostile.wire);
            // keep the small ones for the mixed cases
            if hostile.wire.len() < 64 * 1024 && matches!(hostile.expect, Expect::Any) {
                pool.push((
                    i,
                    Hostile {
                        kind: hostile.kind.clone(),
                        wire: hostile.wire.clone(),
                        expect: Expect::Any,
                    },
                ));
            }
            push(&mut cases, field.name().to_owned(), hostile, body);
        }
    }
    let encoded_base = base.encode_to_vec();
    for hostile in message_kinds(&encoded_base, rng) {
        let body = hostile.wire.clone();
        push(&mut cases, "(message)".to_owned(), hostile, body);
    }
    // hostile metadata around a valid-looking message
    for (kind, headers, expect) in metadata_kinds(rng) {
        let body = Bytes::from(base_for(cases.len()).encode_to_vec());
        cases.push(Case {
            field: "(metadata)".to_owned(),
            kind: kind.to_owned(),
            role: Role::Admin,
            body,
            headers,
            expect,
        });
    }
    // several fields at once, chosen at random
    for _ in 0..MIXED_CASES {
        if pool.is_empty() {
            break;
        }
        let mut chosen: BTreeMap<usize, &Hostile> = BTreeMap::new();
        for _ in 0..3 {
            let (field, hostile) = rng.pick(&pool);
            chosen.insert(*field, hostile);
        }
        let cleared: Vec<&FieldDescriptor> = chosen.keys().map(|i| &fields[*i]).collect();
        let mut body = base_without(&base_for(cases.len()), &cleared);
        let mut names = Vec::new();
        let mut kinds = Vec::new();
        for (field, hostile) in &chosen {
            body.extend_from_slice(&hostile.wire);
            names.push(fields[*field].name());
            kinds.push(hostile.kind.as_str());
        }
        let mixed = hostile(kinds.join("+"), Vec::new(), Expect::Any);
        push(&mut cases, names.join("+"), mixed, body);
    }
    cases
}

// ---------------------------------------------------------------------------
// checks and the report

struct Failure {
    method: String,
    field: String,
    kind: String,
    role: &'static str,
    code: Code,
    message_len: usize,
    message: String,
    why: String,
}

fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((end, _)) => format!("{:?}... ({} bytes)", &text[..end], text.len()),
        None => format!("{text:?}"),
    }
}

fn judge(method: &Method, case: &Case, outcome: &Outcome) -> Option<String> {
    let code = outcome.code;
    // tonic's server answers its own end of a deadline with CANCELLED
    let stalled = matches!(code, Code::DeadlineExceeded | Code::Cancelled);
    if stalled && !method.is_long_poll() {
        return Some(format!(
            "{code:?}: the call ran into its deadline; a hostile value must not stall it"
        ));
    }
    if outcome.message.len() > MAX_MESSAGE_BYTES {
        return Some(format!(
            "message of {} bytes (> {MAX_MESSAGE_BYTES}): input echoed",
            outcome.message.len()
        ));
    }
    if outcome.details_len > MAX_DETAILS_BYTES {
        return Some(format!(
            "details of {} bytes (> {MAX_DETAILS_BYTES}): input echoed",
            outcome.details_len
        ));
    }
    // a long poll cut by its deadline never got to judge its input
    if stalled {
        return None;
    }
    if let Expect::OneOf(codes) = case.expect
        && codes.contains(&code)
    {
        return None;
    }
    if NEVER.contains(&code) {
        return Some(format!(
            "{code:?} is never an answer while the stores are up"
        ));
    }
    match case.expect {
        Expect::Any => None,
        Expect::Refused if code == Code::Ok => {
            Some("OK: the value must be refused (INVALID_ARGUMENT), not ignored".to_owned())
        }
        Expect::Refused => None,
        Expect::OneOf(codes) if !codes.contains(&code) => {
            Some(format!("{code:?}, expected one of {codes:?}"))
        }
        Expect::OneOf(_) => None,
    }
}

fn rss_bytes(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("State:") && l.contains('Z'))
        })
        .unwrap_or(true)
}

async fn healthy(channel: &Channel) -> Result<(), String> {
    let mut health = HealthClient::new(channel.clone());
    let check = health.check(HealthCheckRequest {
        service: String::new(),
    });
    match tokio::time::timeout(Duration::from_secs(5), check).await {
        Err(_) => Err("no health answer within 5 s".to_owned()),
        Ok(Err(status)) => Err(format!("health check failed: {status}")),
        Ok(Ok(response)) if response.get_ref().status() == ServingStatus::Serving => Ok(()),
        Ok(Ok(response)) => Err(format!("health says {:?}", response.get_ref().status())),
    }
}

#[derive(Default)]
struct Tally {
    calls: usize,
    by_method: BTreeMap<String, BTreeMap<String, usize>>,
    codes: BTreeSet<String>,
    failures: Vec<Failure>,
    batch_problems: Vec<String>,
    slowest: Vec<(Duration, String)>,
    peak_rss: u64,
}

fn code_name(code: Code) -> String {
    let name = format!("{code:?}");
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

impl Tally {
    fn record(&mut self, method: &Method, case: &Case, outcome: &Outcome, took: Duration) {
        if std::env::var_os("COMPOSER_ABUSE_VERBOSE").is_some() {
            eprintln!(
                "  {} field={} kind={} role={} -> {} in {:.2} s (message {} bytes: {})",
                method.short,
                case.field,
                clip(&case.kind, 80),
                case.role.as_str(),
                code_name(outcome.code),
                took.as_secs_f64(),
                outcome.message.len(),
                clip(&outcome.message, 100)
            );
        }
        self.calls += 1;
        let code = code_name(outcome.code);
        self.codes.insert(code.clone());
        *self
            .by_method
            .entry(method.short.clone())
            .or_default()
            .entry(code)
            .or_default() += 1;
        self.slowest.push((
            took,
            format!("{} {} {}", method.short, case.field, case.kind),
        ));
        self.slowest.sort_by_key(|s| std::cmp::Reverse(s.0));
        self.slowest.truncate(5);
        if let Some(why) = judge(method, case, outcome) {
            self.failures.push(Failure {
                method: method.short.clone(),
                field: case.field.clone(),
                kind: case.kind.clone(),
                role: case.role.as_str(),
                code: outcome.code,
                message_len: outcome.message.len(),
                message: clip(&outcome.message, 160),
                why,
            });
        }
    }

    fn table(&self, seed: u64, elapsed: Duration) -> String {
        let codes: Vec<&String> = self.codes.iter().collect();
        let mut out = String::new();
        let _ = writeln!(
            out,
            "abuse suite: {} calls in {:.1} s, seed {seed} (COMPOSER_ABUSE_SEED={seed} repeats it), peak server RSS {} MiB",
            self.calls,
            elapsed.as_secs_f64(),
            self.peak_rss / (1024 * 1024)
        );
        let _ = write!(out, "{:<38} {:>6}", "method", "calls");
        for code in &codes {
            let _ = write!(out, " {:>w$}", code, w = code.len().max(5));
        }
        out.push('\n');
        let mut totals: BTreeMap<&String, usize> = BTreeMap::new();
        for (method, counts) in &self.by_method {
            let calls: usize = counts.values().sum();
            let _ = write!(out, "{method:<38} {calls:>6}");
            for code in &codes {
                let n = counts.get(*code).copied().unwrap_or(0);
                *totals.entry(code).or_default() += n;
                let _ = write!(out, " {:>w$}", n, w = code.len().max(5));
            }
            out.push('\n');
        }
        let _ = write!(out, "{:<38} {:>6}", "total", self.calls);
        for code in &codes {
            let n = totals.get(code).copied().unwrap_or(0);
            let _ = write!(out, " {:>w$}", n, w = code.len().max(5));
        }
        out.push('\n');
        let _ = writeln!(out, "slowest calls:");
        for (took, what) in &self.slowest {
            let _ = writeln!(out, "  {:>7.2} s  {}", took.as_secs_f64(), clip(what, 120));
        }
        out
    }

    fn failure_report(&self) -> String {
        let mut out = String::new();
        for problem in &self.batch_problems {
            let _ = writeln!(out, "BATCH: {problem}");
        }
        // what to fix, most widespread first: kind of value → code → where
        let mut groups: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
        for f in &self.failures {
            let kind = if f.kind.contains('+') {
                "several fields at once".to_owned()
            } else if f.kind.starts_with("random-text-") {
                "random-text".to_owned()
            } else {
                f.kind.clone()
            };
            groups
                .entry((kind, code_name(f.code)))
                .or_default()
                .insert(format!("{}.{}", f.method, f.field));
        }
        let mut groups: Vec<_> = groups.into_iter().collect();
        groups.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
        let _ = writeln!(
            out,
            "{} failing calls; by kind of value and code (fields affected):",
            self.failures.len()
        );
        for ((kind, code), fields) in &groups {
            let fields: Vec<&str> = fields.iter().map(String::as_str).collect();
            let _ = writeln!(
                out,
                "  {kind} -> {code} ({}): {}",
                fields.len(),
                clip(&fields.join(", "), 300)
            );
        }
        let mut failures: Vec<&Failure> = self.failures.iter().collect();
        failures
            .sort_by(|a, b| (&a.method, &a.field, &a.kind).cmp(&(&b.method, &b.field, &b.kind)));
        let _ = writeln!(out, "each failing call:");
        for f in failures.iter().take(REPORTED_FAILURES) {
            let _ = writeln!(
                out,
                "  {} field={} kind={} role={} -> {} (message {} bytes: {}): {}",
                f.method,
                f.field,
                clip(&f.kind, 80),
                f.role,
                code_name(f.code),
                f.message_len,
                f.message,
                f.why
            );
        }
        if failures.len() > REPORTED_FAILURES {
            let _ = writeln!(
                out,
                "  ... and {} more (COMPOSER_ABUSE_VERBOSE=1 prints every call)",
                failures.len() - REPORTED_FAILURES
            );
        }
        out
    }
}

// ---------------------------------------------------------------------------
// hostile definitions that pass validation meet the engine

/// Registers each hostile workflow source; each one the server accepts is
/// started with a 20,000-item input, read with its nodes and watched.
async fn run_hostile_workflows(
    endpoint: &Endpoint,
    methods: &[Method],
    admin: &str,
    rng: &mut Rng,
    tally: &mut Tally,
) {
    let find = |short: &str| methods.iter().find(|m| m.short == short).cloned();
    let (Some(register), Some(start), Some(get), Some(watch), Some(poll), Some(fail)) = (
        find("WorkflowService/RegisterWorkflow"),
        find("RunService/StartRun"),
        find("RunService/GetRun"),
        find("RunService/WatchRun"),
        find("WorkerService/PollTasks"),
        find("WorkerService/FailTask"),
    ) else {
        return;
    };
    let items = list_value((0..20_000).map(|i| number_value(f64::from(i))).collect());
    let input = struct_value(BTreeMap::from([
        ("n".to_owned(), number_value(1.0)),
        ("items".to_owned(), items),
    ]));
    for (kind, source) in hostile_sources(rng) {
        let mut step = async |method: &Method, body: Vec<u8>| {
            let case = Case {
                field: "scenario".to_owned(),
                kind: kind.to_owned(),
                role: Role::Admin,
                body: Bytes::from(body),
                headers: Vec::new(),
                expect: Expect::Any,
            };
            let began = Instant::now();
            let outcome = call(endpoint, method, case.body.clone(), &bearer(admin)).await;
            tally.record(method, &case, &outcome, began.elapsed());
            outcome.body
        };
        let Some(registered) = step(
            &register,
            RegisterWorkflowRequest { source }.encode_to_vec(),
        )
        .await
        else {
            continue;
        };
        let Some(name) = RegisterWorkflowResponse::decode(registered)
            .ok()
            .and_then(|r| r.workflow)
            .map(|w| w.name)
        else {
            continue;
        };
        let request = StartRunRequest {
            workflow_name: name,
            version: 0,
            input: Some(input.clone()),
            idempotency_key: String::new(),
            labels: HashMap::new(),
            priority: 0,
        };
        let Some(started) = step(&start, request.encode_to_vec()).await else {
            continue;
        };
        let Some(run_id) = StartRunResponse::decode(started)
            .ok()
            .and_then(|r| r.run)
            .map(|r| r.run_id)
        else {
            continue;
        };
        let read = GetRunRequest {
            run_id: run_id.clone(),
            skip_nodes: false,
        };
        step(&get, read.encode_to_vec()).await;
        step(&watch, WatchRunRequest { run_id }.encode_to_vec()).await;
        // its first tasks fail, so hostile retry policies get computed
        let polled = PollTasksRequest {
            confirm_receipt: false,
            worker_id: "abuse-scenario".to_owned(),
            queues: vec![QUEUE.to_owned(), "abuse_map".to_owned()],
            max_tasks: 20,
            wait: Some(prost_types::Duration {
                seconds: 0,
                nanos: 300_000_000,
            }),
        };
        let tasks = step(&poll, polled.encode_to_vec())
            .await
            .and_then(|b| PollTasksResponse::decode(b).ok())
            .map(|r| r.tasks)
            .unwrap_or_default();
        for task in tasks {
            let report = FailTaskRequest {
                task_id: task.task_id,
                attempt: task.attempt,
                lease_token: task.lease_token,
                error_code: "ABUSE".to_owned(),
                message: "failed by the abuse suite".to_owned(),
                retryable: true,
                details: None,
            };
            step(&fail, report.encode_to_vec()).await;
        }
        step(&get, read.encode_to_vec()).await;
    }
}

// ---------------------------------------------------------------------------
// the suite

/// After a batch: the server is alive, healthy within 5 s, and its RSS
/// under the bound. False when it is not worth going on.
async fn check_after_batch(
    batch: &str,
    tally: &mut Tally,
    pid: i32,
    channel: &Channel,
    calls_before: usize,
    started: Instant,
) -> bool {
    let rss = rss_bytes(pid).unwrap_or(0);
    tally.peak_rss = tally.peak_rss.max(rss);
    eprintln!(
        "abuse suite: {:<38} {:>4} calls in {:>5.1} s, RSS {} MiB",
        batch,
        tally.calls - calls_before,
        started.elapsed().as_secs_f64(),
        rss / (1024 * 1024)
    );
    if rss > MAX_RSS_BYTES {
        tally.batch_problems.push(format!(
            "after {batch}: server RSS {} MiB > {} MiB",
            rss / (1024 * 1024),
            MAX_RSS_BYTES / (1024 * 1024)
        ));
    }
    if is_zombie(pid) {
        tally
            .batch_problems
            .push(format!("after {batch}: the server process died"));
        return false;
    }
    if let Err(problem) = healthy(channel).await {
        tally
            .batch_problems
            .push(format!("after {batch}: {problem}"));
        return false;
    }
    true
}

fn seed() -> u64 {
    std::env::var("COMPOSER_ABUSE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(7)
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_survives_hostile_values_without_internal_errors_echoes_or_bloat() {
    let started = Instant::now();
    let seed = seed();
    eprintln!("abuse suite: seed {seed}");
    let mut rng = Rng(seed);
    // a debug build registers a 10,000-node definition in seconds on a
    // loaded machine: the database deadline (5 s by default) is not what
    // this suite tries, so it does not cut such a call short
    let server = ServerProcess::start(
        &composer_binary(),
        &["--auth-secret", SECRET, "--db-timeout", "30s"],
    )
    .await;
    let endpoint = Endpoint::from_shared(server.url())
        .expect("url")
        .http2_max_header_list_size(u32::try_from(64 * MIB).expect("fits"));
    let channel = endpoint.connect().await.expect("connect");
    let tokens: HashMap<&'static str, String> = Role::ALL
        .into_iter()
        .map(|role| (role.as_str(), token(role)))
        .collect();
    let methods = discover(&channel).await;
    eprintln!(
        "abuse suite: {} methods through reflection: {}",
        methods.len(),
        methods
            .iter()
            .map(|m| m.short.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let context = set_up(&channel, &tokens["admin"]).await;

    let mut tally = Tally::default();
    let pid = server.pid();
    for (slot, method) in methods.iter().enumerate() {
        let cases = cases_for(method, &context, slot, &mut rng);
        let batch_started = Instant::now();
        let outcomes: Vec<(usize, Outcome, Duration)> =
            futures::stream::iter(cases.iter().enumerate().map(|(i, case)| {
                let endpoint = &endpoint;
                let token = tokens[case.role.as_str()].clone();
                async move {
                    let began = Instant::now();
                    // the role's token, unless the case brings its own
                    let mut headers = case.headers.clone();
                    if !headers.iter().any(|(name, _)| *name == "authorization") {
                        headers.extend(bearer(&token));
                    }
                    let outcome = call(endpoint, method, case.body.clone(), &headers).await;
                    (i, outcome, began.elapsed())
                }
            }))
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        for (i, outcome, took) in &outcomes {
            tally.record(method, &cases[*i], outcome, *took);
        }
        let calls = tally.calls - outcomes.len();
        if !check_after_batch(
            &method.short,
            &mut tally,
            pid,
            &channel,
            calls,
            batch_started,
        )
        .await
        {
            break;
        }
    }

    if tally.batch_problems.is_empty() {
        let batch_started = Instant::now();
        let calls = tally.calls;
        run_hostile_workflows(&endpoint, &methods, &tokens["admin"], &mut rng, &mut tally).await;
        check_after_batch(
            "hostile workflows",
            &mut tally,
            pid,
            &channel,
            calls,
            batch_started,
        )
        .await;
    }

    let table = tally.table(seed, started.elapsed());
    // straight to the process's stderr, past the test harness's capture:
    // the counts belong in `make test`'s output even when the suite passes
    let _ = std::io::Write::write_all(&mut std::io::stderr(), format!("{table}\n").as_bytes());
    if !tally.failures.is_empty() || !tally.batch_problems.is_empty() {
        let report = tally.failure_report();
        panic!("the abuse suite found problems\n{table}\n{report}");
    }
}
