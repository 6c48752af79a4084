//! `BlobService`: large payloads in and out of the blob store, streamed
//! (decision 0047). The caller's namespace is the only one it reaches.

use std::pin::Pin;

use bytes::{Bytes, BytesMut};
use composer_coordinator::Coordinator;
use composer_proto::v1::{
    BlobRef, DownloadBlobRequest, DownloadBlobResponse, FinishBlobUploadRequest,
    FinishBlobUploadResponse, GetBlobUrlRequest, GetBlobUrlResponse, StartBlobUploadRequest,
    StartBlobUploadResponse, UploadBlobRequest, UploadBlobResponse,
    blob_service_server::BlobService,
};
use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use crate::{
    caller::caller,
    status::{from_coordinator, invalid_field},
};

/// The largest chunk either way.
pub(crate) const MAX_CHUNK_BYTES: usize = 1024 * 1024;

/// How long an upload may wait for its next chunk before it is given up
/// (the call itself has no deadline: a gibibyte takes its time).
const UPLOAD_IDLE: std::time::Duration = std::time::Duration::from_secs(60);

/// The BlobService implementation.
#[derive(Clone)]
pub(crate) struct BlobApi {
    pub(crate) coordinator: Coordinator,
}

type DownloadStream = Pin<Box<dyn Stream<Item = Result<DownloadBlobResponse, Status>> + Send>>;

#[tonic::async_trait]
impl BlobService for BlobApi {
    async fn upload_blob(
        &self,
        request: Request<Streaming<UploadBlobRequest>>,
    ) -> Result<Response<UploadBlobResponse>, Status> {
        let caller = caller(&request)?;
        // a chunk over the limit or a broken stream ends the upload: the
        // coordinator aborts it and names `data`
        let chunks = idle_bounded(request.into_inner(), UPLOAD_IDLE).map(|chunk| match chunk {
            Ok(chunk) if chunk.data.len() > MAX_CHUNK_BYTES => Err(format!(
                "a chunk of {} bytes, over the limit of {MAX_CHUNK_BYTES}",
                chunk.data.len()
            )),
            Ok(chunk) => Ok(chunk.data),
            Err(status) => Err(status.message().to_owned()),
        });
        let stored = self
            .coordinator
            .upload_blob(&caller.namespace, chunks)
            .await;
        let stored = stored.map_err(from_coordinator)?;
        Ok(Response::new(UploadBlobResponse {
            blob: Some(blob_ref(stored)),
        }))
    }

    async fn get_blob_url(
        &self,
        request: Request<GetBlobUrlRequest>,
    ) -> Result<Response<GetBlobUrlResponse>, Status> {
        let caller = caller(&request)?;
        let (url, size) = self
            .coordinator
            .blob_url(&caller.namespace, &request.get_ref().sha256)
            .await
            .map_err(from_coordinator)?;
        Ok(Response::new(GetBlobUrlResponse {
            url: url.url,
            expires_at: Some(prost_types::Timestamp::from(url.expires_at)),
            size: i64::try_from(size).unwrap_or(i64::MAX),
        }))
    }

    async fn start_blob_upload(
        &self,
        request: Request<StartBlobUploadRequest>,
    ) -> Result<Response<StartBlobUploadResponse>, Status> {
        let caller = caller(&request)?;
        let upload = self
            .coordinator
            .start_blob_upload(&caller.namespace)
            .await
            .map_err(from_coordinator)?;
        Ok(Response::new(StartBlobUploadResponse {
            upload_id: upload.upload_id,
            url: upload.url.url,
            expires_at: Some(prost_types::Timestamp::from(upload.url.expires_at)),
        }))
    }

    async fn finish_blob_upload(
        &self,
        request: Request<FinishBlobUploadRequest>,
    ) -> Result<Response<FinishBlobUploadResponse>, Status> {
        let caller = caller(&request)?;
        let upload_id = &request.get_ref().upload_id;
        if uuid::Uuid::parse_str(upload_id).is_err() {
            return Err(invalid_field(
                "upload_id",
                "must be the id StartBlobUpload gave (a UUID)",
            ));
        }
        let stored = self
            .coordinator
            .finish_blob_upload(&caller.namespace, upload_id)
            .await
            .map_err(from_coordinator)?;
        Ok(Response::new(FinishBlobUploadResponse {
            blob: Some(blob_ref(stored)),
        }))
    }

    async fn download_blob(
        &self,
        request: Request<DownloadBlobRequest>,
    ) -> Result<Response<DownloadStream>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let offset = u64::try_from(request.offset)
            .map_err(|_| invalid_field("offset", "must not be negative"))?;
        let (size, bytes) = self
            .coordinator
            .download_blob(&caller.namespace, &request.sha256, offset)
            .await
            .map_err(from_coordinator)?;
        let size = i64::try_from(size).unwrap_or(i64::MAX);
        let chunks = rechunked(bytes.map(|chunk| {
            chunk.map_err(|error| {
                tracing::error!(%error, "blob store read failed");
                Status::unavailable(
                    "the blob store failed while reading, retry from the offset reached",
                )
            })
        }));
        let mut first = true;
        let messages = chunks.map(move |chunk| {
            let size = if std::mem::take(&mut first) { size } else { 0 };
            chunk.map(|data| DownloadBlobResponse { data, size })
        });
        // an empty blob still tells its size
        let messages: DownloadStream = if size == 0 {
            Box::pin(futures::stream::once(async {
                Ok(DownloadBlobResponse {
                    data: Bytes::new(),
                    size: 0,
                })
            }))
        } else {
            Box::pin(messages)
        };
        Ok(Response::new(messages))
    }
}

fn blob_ref(stored: composer_coordinator::payloads::StoredBlob) -> BlobRef {
    BlobRef {
        sha256: stored.sha256,
        size: i64::try_from(stored.size).unwrap_or(i64::MAX),
        head: stored.head,
    }
}

/// `inner`, ended with an error when its next item takes longer than `idle`.
fn idle_bounded<S>(
    inner: S,
    idle: std::time::Duration,
) -> impl Stream<Item = Result<UploadBlobRequest, Status>> + Send
where
    S: Stream<Item = Result<UploadBlobRequest, Status>> + Send + 'static,
{
    futures::stream::unfold(Some(Box::pin(inner)), move |inner| async move {
        let mut inner = inner?;
        match tokio::time::timeout(idle, inner.next()).await {
            Ok(Some(item)) => Some((item, Some(inner))),
            Ok(None) => None,
            Err(_) => Some((
                Err(Status::deadline_exceeded(format!(
                    "no chunk for {}s: the upload is given up",
                    idle.as_secs()
                ))),
                None,
            )),
        }
    })
}

/// The store's chunks (as small as 8 KiB from a local disk) gathered into
/// messages of up to [`MAX_CHUNK_BYTES`].
fn rechunked<S>(inner: S) -> impl Stream<Item = Result<Bytes, Status>> + Send
where
    S: Stream<Item = Result<Bytes, Status>> + Send + 'static,
{
    futures::stream::unfold(
        (Box::pin(inner), BytesMut::new(), false),
        |(mut inner, mut buffer, mut ended)| async move {
            while !ended && buffer.len() < MAX_CHUNK_BYTES {
                match inner.next().await {
                    Some(Ok(chunk)) => buffer.extend_from_slice(&chunk),
                    Some(Err(status)) => {
                        buffer.clear();
                        return Some((Err(status), (inner, buffer, true)));
                    }
                    None => ended = true,
                }
            }
            if buffer.is_empty() {
                return None;
            }
            let take = buffer.len().min(MAX_CHUNK_BYTES);
            let chunk = buffer.split_to(take).freeze();
            Some((Ok(chunk), (inner, buffer, ended)))
        },
    )
}
