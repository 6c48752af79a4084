//! `SecretService`: a namespace's secrets (decision 0044). Values come in
//! and are never sent back; the request's value is dropped once sealed.

use composer_coordinator::{Coordinator, secrets::MAX_VALUE_BYTES};
use composer_proto::v1::{
    DeleteSecretRequest, DeleteSecretResponse, ListSecretsRequest, ListSecretsResponse,
    RewrapSecretKeysRequest, RewrapSecretKeysResponse, Secret, SetSecretRequest, SetSecretResponse,
    secret_service_server::SecretService,
};
use composer_store::secrets::SecretRow;
use tonic::{Request, Response, Status};

use crate::{
    caller::caller,
    convert::{keyset_page, page_size, page_token, timestamp},
    status::{check_name, from_coordinator, invalid_field},
};

/// The SecretService implementation.
#[derive(Clone)]
pub(crate) struct SecretApi {
    pub(crate) coordinator: Coordinator,
}

fn secret_message(row: SecretRow) -> Secret {
    Secret {
        name: row.name,
        version: row.version,
        create_time: Some(timestamp(row.created_at)),
        update_time: Some(timestamp(row.updated_at)),
        updated_by: row.updated_by,
    }
}

/// The value's bounds; the error never quotes it.
fn check_value(value: &[u8]) -> Result<(), Status> {
    if value.is_empty() {
        return Err(invalid_field("value", "must not be empty"));
    }
    if value.len() > MAX_VALUE_BYTES {
        return Err(invalid_field(
            "value",
            format!(
                "is {} bytes, over the limit of {MAX_VALUE_BYTES}",
                value.len()
            ),
        ));
    }
    Ok(())
}

#[tonic::async_trait]
impl SecretService for SecretApi {
    async fn set_secret(
        &self,
        request: Request<SetSecretRequest>,
    ) -> Result<Response<SetSecretResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        check_name("name", &request.name)?;
        check_value(&request.value)?;
        let secret = self
            .coordinator
            .set_secret(
                &caller.namespace,
                &request.name,
                &request.value,
                &caller.subject,
            )
            .await
            .map_err(from_coordinator)?;
        Ok(Response::new(SetSecretResponse {
            secret: Some(secret_message(secret)),
        }))
    }

    async fn list_secrets(
        &self,
        request: Request<ListSecretsRequest>,
    ) -> Result<Response<ListSecretsResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let limit = page_size(request.page_size)?;
        let after = page_token(&request.page_token, |token| {
            check_name("page_token", token).ok().map(|()| token)
        })?;
        let rows = self
            .coordinator
            .list_secrets(&caller.namespace, after, limit + 1)
            .await
            .map_err(from_coordinator)?;
        let (page, next_page_token) = keyset_page(rows, limit, |last| last.name.clone());
        Ok(Response::new(ListSecretsResponse {
            secrets: page.into_iter().map(secret_message).collect(),
            next_page_token,
        }))
    }

    async fn delete_secret(
        &self,
        request: Request<DeleteSecretRequest>,
    ) -> Result<Response<DeleteSecretResponse>, Status> {
        let caller = caller(&request)?;
        let name = request.into_inner().name;
        check_name("name", &name)?;
        self.coordinator
            .delete_secret(&caller.namespace, &name)
            .await
            .map_err(from_coordinator)?;
        Ok(Response::new(DeleteSecretResponse {}))
    }

    async fn rewrap_secret_keys(
        &self,
        request: Request<RewrapSecretKeysRequest>,
    ) -> Result<Response<RewrapSecretKeysResponse>, Status> {
        let caller = caller(&request)?;
        let (rewrapped, key_id) = self
            .coordinator
            .rewrap_secret_keys(&caller.namespace)
            .await
            .map_err(from_coordinator)?;
        Ok(Response::new(RewrapSecretKeysResponse {
            rewrapped: i32::try_from(rewrapped).unwrap_or(i32::MAX),
            key_id,
        }))
    }
}
