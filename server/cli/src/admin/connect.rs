//! The connection every admin command makes: one channel to `--address`,
//! with the token and namespace sent on every call.

use std::{path::PathBuf, time::Duration};

use clap::Args;
use composer_grpc::auth::NAMESPACE_HEADER;
use composer_proto::v1::{
    queue_service_client::QueueServiceClient, run_service_client::RunServiceClient,
    schedule_service_client::ScheduleServiceClient, secret_service_client::SecretServiceClient,
    server_service_client::ServerServiceClient, workflow_service_client::WorkflowServiceClient,
};
use tonic::{
    Request, Status,
    metadata::AsciiMetadataValue,
    service::{Interceptor, interceptor::InterceptedService},
    transport::{Certificate, Channel, ClientTlsConfig, Endpoint},
};

use super::AdminError;

/// The address `composer serve` listens on by default.
pub const DEFAULT_ADDRESS: &str = "http://127.0.0.1:7070";

/// Largest answer accepted (a run of a wide MAP carries one state per branch).
const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;

/// Where the server is and who the caller is.
#[derive(Debug, Clone, Args)]
pub struct ConnectArgs {
    /// The server's gRPC address, e.g. `http://composer.internal:7070`;
    /// `https://` speaks TLS, checked against the system's roots.
    #[arg(long, env = "COMPOSER_ADDRESS", default_value = DEFAULT_ADDRESS)]
    pub address: String,

    /// A PEM file of CA certificates to trust for an `https://` address,
    /// besides the system's (a private CA).
    #[arg(long, env = "COMPOSER_CA_CERT")]
    pub ca_cert: Option<PathBuf>,

    /// A token (JWT) sent as `authorization: Bearer <token>`; `composer
    /// token` mints one. Not needed by a server started with `--insecure`.
    #[arg(long, env = "COMPOSER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,

    /// Act in this namespace instead of the token's (admins only; sent as
    /// the `x-composer-namespace` header).
    #[arg(long, env = "COMPOSER_NAMESPACE")]
    pub namespace: Option<String>,
}

/// Adds the token and the namespace to every call.
#[derive(Debug, Clone, Default)]
pub struct CallMetadata {
    authorization: Option<AsciiMetadataValue>,
    namespace: Option<AsciiMetadataValue>,
}

impl Interceptor for CallMetadata {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let metadata = request.metadata_mut();
        if let Some(value) = &self.authorization {
            metadata.insert("authorization", value.clone());
        }
        if let Some(value) = &self.namespace {
            metadata.insert(NAMESPACE_HEADER, value.clone());
        }
        Ok(request)
    }
}

type Transport = InterceptedService<Channel, CallMetadata>;

/// The clients of the three public services, on one connection.
#[derive(Debug, Clone)]
pub struct Api {
    /// WorkflowService.
    pub workflows: WorkflowServiceClient<Transport>,
    /// RunService.
    pub runs: RunServiceClient<Transport>,
    /// ScheduleService.
    pub schedules: ScheduleServiceClient<Transport>,
    /// QueueService.
    pub queues: QueueServiceClient<Transport>,
    /// SecretService.
    pub secrets: SecretServiceClient<Transport>,
    /// ServerService.
    pub server: ServerServiceClient<Transport>,
}

impl Api {
    /// Connects to `--address`; an unreachable server is UNAVAILABLE.
    pub async fn connect(args: &ConnectArgs) -> Result<Self, AdminError> {
        let metadata = call_metadata(args)?;
        let address = with_scheme(&args.address)?;
        let mut endpoint = Endpoint::from_shared(address.clone())
            .map_err(|e| AdminError::Usage(format!("--address `{}`: {e}", args.address)))?
            .connect_timeout(Duration::from_secs(10));
        if address.starts_with("https://") {
            endpoint = endpoint
                .tls_config(tls(args)?)
                .map_err(|e| AdminError::Usage(format!("--address `{address}`: {e}")))?;
        }
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| AdminError::Unreachable {
                address,
                reason: transport_reason(&e),
            })?;
        let transport = InterceptedService::new(channel, metadata);
        Ok(Self {
            workflows: WorkflowServiceClient::new(transport.clone())
                .max_decoding_message_size(MAX_ANSWER_BYTES),
            runs: RunServiceClient::new(transport.clone())
                .max_decoding_message_size(MAX_ANSWER_BYTES),
            schedules: ScheduleServiceClient::new(transport.clone())
                .max_decoding_message_size(MAX_ANSWER_BYTES),
            queues: QueueServiceClient::new(transport.clone())
                .max_decoding_message_size(MAX_ANSWER_BYTES),
            secrets: SecretServiceClient::new(transport.clone())
                .max_decoding_message_size(MAX_ANSWER_BYTES),
            server: ServerServiceClient::new(transport).max_decoding_message_size(MAX_ANSWER_BYTES),
        })
    }
}

fn call_metadata(args: &ConnectArgs) -> Result<CallMetadata, AdminError> {
    let authorization = args
        .token
        .as_deref()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|token| {
            format!("Bearer {token}")
                .parse()
                .map_err(|_| AdminError::Usage("--token holds characters a header cannot".into()))
        })
        .transpose()?;
    let namespace = args
        .namespace
        .as_deref()
        .map(|ns| {
            ns.parse().map_err(|_| {
                AdminError::Usage(format!(
                    "--namespace `{ns}` holds characters a header cannot"
                ))
            })
        })
        .transpose()?;
    Ok(CallMetadata {
        authorization,
        namespace,
    })
}

/// `host:port` means `http://host:port`.
fn with_scheme(address: &str) -> Result<String, AdminError> {
    match address.split_once("://") {
        Some(("http" | "https", _)) => Ok(address.to_owned()),
        Some((scheme, _)) => Err(AdminError::Usage(format!(
            "--address `{address}`: the scheme must be http or https, not {scheme}"
        ))),
        None => Ok(format!("http://{address}")),
    }
}

/// The system's roots, and `--ca-cert` if given.
fn tls(args: &ConnectArgs) -> Result<ClientTlsConfig, AdminError> {
    let config = ClientTlsConfig::new().with_native_roots();
    let Some(path) = &args.ca_cert else {
        return Ok(config);
    };
    let pem = std::fs::read(path)
        .map_err(|e| AdminError::local(format!("--ca-cert {}", path.display()), e))?;
    Ok(config.ca_certificate(Certificate::from_pem(pem)))
}

/// The innermost cause (e.g. `Connection refused`), not tonic's wrapper.
fn transport_reason(error: &tonic::transport::Error) -> String {
    let mut source: &dyn std::error::Error = error;
    while let Some(next) = source.source() {
        source = next;
    }
    source.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_without_a_scheme_is_plain_http_and_other_schemes_are_refused() {
        assert_eq!(
            with_scheme("127.0.0.1:7070").ok().as_deref(),
            Some("http://127.0.0.1:7070")
        );
        assert_eq!(
            with_scheme("http://h:1").ok().as_deref(),
            Some("http://h:1")
        );
        assert_eq!(
            with_scheme("https://h:1").ok().as_deref(),
            Some("https://h:1")
        );
        assert!(matches!(
            with_scheme("ftp://h:1"),
            Err(AdminError::Usage(_))
        ));
    }
}
