//! `ServerService`: what this server is and speaks.

use composer_proto::v1::{
    GetServerInfoRequest, GetServerInfoResponse, server_service_server::ServerService,
};
use tonic::{Request, Response, Status};

/// Answers GetServerInfo from build-time facts and the configured features.
#[derive(Debug, Clone)]
pub(crate) struct ServerInfoService {
    pub(crate) features: Vec<String>,
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
        }))
    }
}
