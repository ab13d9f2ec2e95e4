//! The layer that puts a client's checks in front of an outbound service.

use tower_layer::Layer;

use super::downstreams::Downstreams;
use super::service::DownstreamService;

/// Wraps an outbound service (a hyper-util client, a tonic channel, any
/// `Service<http::Request<B>>` answering `http::Response`s) with what a
/// [`Downstreams`] knows; built by [`Downstreams::layer`]. See
/// [`DownstreamService`] for what each call goes through.
#[derive(Clone, Debug)]
pub struct DownstreamLayer {
    downstreams: Downstreams,
}

impl DownstreamLayer {
    pub(super) fn new(downstreams: Downstreams) -> Self {
        DownstreamLayer { downstreams }
    }
}

impl<S> Layer<S> for DownstreamLayer {
    type Service = DownstreamService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        DownstreamService::new(inner, self.downstreams.clone())
    }
}
