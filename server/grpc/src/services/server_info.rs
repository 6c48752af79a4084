//! `ServerService`: what this server is and speaks.

use composer_proto::v1::{
    GetServerInfoRequest, GetServerInfoResponse, server_service_server::ServerService,
};
use tonic::{Request, Response, Status};

/// Answers GetServerInfo from build-time facts and the configured features.
#[derive(Debug, Clone)]
pub(crate) struct ServerInfoService {
    pub(crate) features: Vec<String>,
    pub(crate) payload_limits: PayloadLimits,
}

/// What GetServerInfo tells SDKs of payloads: when to upload, how much.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PayloadLimits {
    /// `--payload-offload-bytes` (0 when the server keeps no blob store).
    pub(crate) offload_bytes: usize,
    /// `--max-payload-bytes`.
    pub(crate) max_payload_bytes: usize,
    /// `--max-message-bytes`.
    pub(crate) max_message_bytes: usize,
    /// Whether BlobService gives presigned URLs.
    pub(crate) blob_urls: bool,
}

fn as_i64(bytes: usize) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

#[tonic::async_trait]
impl ServerService for ServerInfoService {
    async fn get_server_info(
        &self,
        _request: Request<GetServerInfoRequest>,
    ) -> Result<Response<GetServerInfoResponse>, Status> {
        Ok(Response::new(GetServerInfoResponse {
            server_version: env!("CARGO_PKG_VERSION").to_owned(),
            protocol_version: composer_proto::PROTOCOL_VERSION.to_owned(),
            features: self.features.clone(),
            payload_offload_bytes: as_i64(self.payload_limits.offload_bytes),
            max_payload_bytes: as_i64(self.payload_limits.max_payload_bytes),
            max_message_bytes: as_i64(self.payload_limits.max_message_bytes),
            blob_urls: self.payload_limits.blob_urls,
        }))
    }
}
