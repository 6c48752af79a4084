//! The OTLP exporter of traces, installed only when `--otlp-endpoint`
//! (`COMPOSER_OTLP_ENDPOINT`) is set. The spans are the coordinator's
//! (`composer_coordinator::observe::traces`); this is where they leave the process.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{SpanExporter, WithExportConfig};
use opentelemetry_sdk::{
    Resource,
    trace::{Sampler, SdkTracerProvider},
};
use tracing_subscriber::{Layer, Registry, filter::Targets};

/// Why traces could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("--otlp-endpoint {endpoint:?}: {reason}")]
pub struct TraceSetupError {
    endpoint: String,
    reason: String,
}

/// Flushes and stops the exporter when dropped. Drop it outside the async
/// runtime: the exporter's HTTP client blocks.
pub struct TraceExporter {
    provider: SdkTracerProvider,
}

impl Drop for TraceExporter {
    fn drop(&mut self) {
        if let Err(error) = self.provider.shutdown() {
            eprintln!("composer: traces not all exported at exit: {error}");
        }
    }
}

/// The OTLP/HTTP URL of a collector's base URL.
fn traces_url(endpoint: &str) -> String {
    let base = endpoint.trim_end_matches('/');
    if base.ends_with("/v1/traces") {
        base.to_owned()
    } else {
        format!("{base}/v1/traces")
    }
}

/// Builds the exporter and the `tracing` layer that feeds it the
/// coordinator's spans (and only those). Call outside the async runtime.
pub fn install(
    endpoint: &str,
    sample_ratio: f64,
) -> Result<(TraceExporter, Box<dyn Layer<Registry> + Send + Sync>), TraceSetupError> {
    let error = |reason: String| TraceSetupError {
        endpoint: endpoint.to_owned(),
        reason,
    };
    let url = traces_url(endpoint);
    let parsed: http::Uri = url.parse().map_err(|e| error(format!("{e}")))?;
    if !matches!(parsed.scheme_str(), Some("http" | "https")) {
        return Err(error("must be an http:// or https:// URL".to_owned()));
    }
    let exporter = SpanExporter::builder()
        .with_http()
        .with_endpoint(url)
        .build()
        .map_err(|e| error(e.to_string()))?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            sample_ratio,
        ))))
        .with_resource(Resource::builder().with_service_name("composer").build())
        .build();
    let layer = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("composer"))
        .with_filter(Targets::new().with_target(
            composer_coordinator::observe::traces::TARGET,
            tracing::Level::INFO,
        ))
        .boxed();
    composer_coordinator::observe::traces::enable();
    Ok((TraceExporter { provider }, layer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signal_path_is_appended_once() {
        assert_eq!(traces_url("http://c:4318"), "http://c:4318/v1/traces");
        assert_eq!(traces_url("http://c:4318/"), "http://c:4318/v1/traces");
        assert_eq!(
            traces_url("http://c:4318/v1/traces"),
            "http://c:4318/v1/traces"
        );
    }

    #[test]
    fn a_bad_endpoint_is_refused_naming_it() {
        let refused = install("ftp://c:21", 1.0).err().expect("refused");
        assert!(refused.to_string().contains("ftp://c:21"), "{refused}");
    }
}
