//! The admission layer in front of a tonic gRPC server, and a class that
//! travels with a call to the next service.
//!
//! ```text
//! cargo run --release --example grpc --features tower
//! ```
//!
//! Two tonic servers on loopback, no `.proto` and no code generation (the
//! messages are raw bytes through a ten-line codec):
//!
//! * **frontend**: `demo.Frontend/Work`, behind
//!   `AdmissionLayer::for_controller(..).http()`, the same layer as the axum
//!   example. Its handler computes for a millisecond, gives its slot back
//!   (`admission::tower::release_slot`: only waiting is left), then calls
//!   the backend through a channel wrapped in `PropagateLayer`, so the call
//!   carries the request's tenant, priority and *remaining* deadline.
//! * **backend**: `demo.Backend/Echo` answers with the class headers it
//!   received.
//!
//! The client makes one high-priority call with a 200 ms `grpc-timeout` and
//! prints what the backend saw (the priority, and a `grpc-timeout` shorter
//! than 200 ms: what was left when the frontend called it), then sends the
//! frontend waves of bulk calls with 20 ms deadlines and counts the gRPC
//! statuses: refusals come back as `UNAVAILABLE` with
//! `grpc-retry-pushback-ms`, the gRPC form of `Retry-After`; `Cancelled` is
//! tonic's client giving up at its own deadline while the call still waited
//! in the frontend's queue (the server's clock for the deadline starts when
//! the call arrives, a little after the client's).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use admission::cpu::Controller;
use admission::tower::{AdmissionLayer, HttpClassifier, PropagateLayer, PropagateService};
use admission::Priority;
use bytes::{Buf, BufMut, Bytes};
use http::uri::PathAndQuery;
use tonic::body::Body;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic::{Code, Status};
use tower::{Service, ServiceBuilder};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The bulk flood: this many waves of this many concurrent calls.
const WAVES: usize = 10;
const WAVE: usize = 100;

/// Raw bytes as gRPC messages, so that the example needs no protobuf.
#[derive(Clone, Copy, Debug, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }

    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// One unary method served by `handler`: what tonic's generated code does
/// for every method of a service, by hand.
#[derive(Clone)]
struct Unary<H> {
    path: &'static str,
    handler: H,
}

impl<H, F> Service<http::Request<Body>> for Unary<H>
where
    H: FnMut(tonic::Request<Bytes>) -> F + Clone + Send + 'static,
    F: Future<Output = Result<tonic::Response<Bytes>, Status>> + Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        if request.uri().path() != self.path {
            let unknown = Status::unimplemented(request.uri().path().to_owned());
            return Box::pin(async move { Ok(unknown.into_http()) });
        }
        let handler = self.handler.clone();
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(RawCodec);
            Ok(grpc.unary(Method(handler), request).await)
        })
    }
}

struct Method<H>(H);

impl<H, F> tonic::server::UnaryService<Bytes> for Method<H>
where
    H: FnMut(tonic::Request<Bytes>) -> F,
    F: Future<Output = Result<tonic::Response<Bytes>, Status>> + Send + 'static,
{
    type Response = Bytes;
    type Future = F;

    fn call(&mut self, request: tonic::Request<Bytes>) -> F {
        (self.0)(request)
    }
}

/// The backend's answer: the class headers its caller sent.
async fn echo(request: tonic::Request<Bytes>) -> Result<tonic::Response<Bytes>, Status> {
    let header = |name: &str| {
        request
            .metadata()
            .get(name)
            .and_then(|value| value.to_str().ok())
            .unwrap_or("-")
            .to_owned()
    };
    let seen = format!(
        "priority={} tenant={} grpc-timeout={}",
        header("x-admission-priority"),
        header("x-admission-tenant"),
        header("grpc-timeout"),
    );
    Ok(tonic::Response::new(Bytes::from(seen)))
}

/// Serves `service` on a loopback port chosen by the OS, behind `layer`.
async fn serve<S, L>(layer: L, service: S) -> Result<SocketAddr, Box<dyn std::error::Error>>
where
    L: tower::Layer<S> + Clone + Send + Sync + 'static,
    S: Send + 'static,
    L::Service:
        Service<http::Request<Body>, Response = http::Response<Body>> + Clone + Send + 'static,
    <L::Service as Service<http::Request<Body>>>::Future: Send,
    <L::Service as Service<http::Request<Body>>>::Error: Into<tower::BoxError> + Send,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let incoming = TcpIncoming::from(listener);
    tokio::spawn(async move {
        if let Err(error) = Server::builder()
            .layer(layer)
            .serve_with_incoming(service, incoming)
            .await
        {
            eprintln!("server on {address} stopped: {error}");
        }
    });
    Ok(address)
}

async fn channel(address: SocketAddr) -> Result<Channel, Box<dyn std::error::Error>> {
    Ok(Channel::from_shared(format!("http://{address}"))?
        .connect()
        .await?)
}

/// Computes for `work` without yielding: the frontend's own CPU cost.
fn compute(work: Duration) {
    let start = Instant::now();
    while start.elapsed() < work {
        std::hint::spin_loop();
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let backend = serve(
        tower::layer::util::Identity::new(),
        Unary {
            path: "/demo.Backend/Echo",
            handler: echo,
        },
    )
    .await?;

    // The frontend's outgoing calls carry the class of the request being
    // served (priority, tenant, what is left of the deadline).
    let to_backend: tonic::client::Grpc<PropagateService<Channel>> = tonic::client::Grpc::new(
        ServiceBuilder::new()
            .layer(PropagateLayer)
            .service(channel(backend).await?),
    );
    let work = move |request: tonic::Request<Bytes>| {
        let mut to_backend = to_backend.clone();
        async move {
            compute(Duration::from_millis(1));
            // The computing is done: what is left is waiting on the
            // backend, which the slot would only hold idle.
            admission::tower::release_slot();
            to_backend
                .ready()
                .await
                .map_err(|error| Status::unavailable(error.to_string()))?;
            let call = tonic::Request::new(request.into_inner());
            let path = PathAndQuery::from_static("/demo.Backend/Echo");
            to_backend.unary(call, path, RawCodec).await
        }
    };
    // Loopback callers are this example's own client: trusted with their
    // class headers (see the trust model in the `tower` module docs).
    let classifier = HttpClassifier::new()
        .trust(|caller| {
            caller
                .extensions
                .get::<tonic::transport::server::TcpConnectInfo>()
                .and_then(|info| info.remote_addr())
                .is_some_and(|peer| peer.ip().is_loopback())
        })
        .default_timeout(Duration::from_millis(100))?;
    let controller = Controller::for_runtime(&tokio::runtime::Handle::current()).build()?;
    let admission = AdmissionLayer::for_controller(controller, classifier).http();
    let frontend = serve(
        admission,
        Unary {
            path: "/demo.Frontend/Work",
            handler: work,
        },
    )
    .await?;

    let mut client = tonic::client::Grpc::new(channel(frontend).await?);
    let call = |priority: Priority, timeout: Duration| {
        let mut request = tonic::Request::new(Bytes::from_static(b"work"));
        request.set_timeout(timeout);
        // A rung's name; the header also takes a number.
        let name = priority.to_string();
        request.metadata_mut().insert(
            "x-admission-priority",
            name.parse().expect("a rung name is ASCII"),
        );
        request
    };
    let path = || PathAndQuery::from_static("/demo.Frontend/Work");

    client.ready().await?;
    let answer = client
        .unary(
            call(Priority::USER_HIGH, Duration::from_millis(200)),
            path(),
            RawCodec,
        )
        .await?;
    println!(
        "one user-high call with grpc-timeout 200m; the backend saw: {}",
        String::from_utf8_lossy(answer.get_ref())
    );

    // Waves of bulk calls, far more at once than the frontend's cores can
    // serve within their 20 ms each.
    let mut statuses: BTreeMap<String, u64> = BTreeMap::new();
    let mut pushback = None;
    for _ in 0..WAVES {
        let mut calls = tokio::task::JoinSet::new();
        for _ in 0..WAVE {
            let mut client = client.clone();
            calls.spawn(async move {
                client.ready().await.map_err(|error| error.to_string())?;
                let request = call(Priority::BULK_NORMAL, Duration::from_millis(20));
                match client.unary(request, path(), RawCodec).await {
                    Ok(_) => Ok((Code::Ok, None)),
                    Err(status) => {
                        let pushback = status
                            .metadata()
                            .get("grpc-retry-pushback-ms")
                            .and_then(|value| value.to_str().ok())
                            .map(str::to_owned);
                        Ok((status.code(), pushback))
                    }
                }
            });
        }
        while let Some(joined) = calls.join_next().await {
            let outcome: Result<(Code, Option<String>), String> = joined?;
            match outcome {
                Ok((code, hint)) => {
                    *statuses.entry(format!("{code:?}")).or_default() += 1;
                    pushback = pushback.or(hint);
                }
                Err(error) => *statuses.entry(format!("transport: {error}")).or_default() += 1,
            }
        }
    }
    println!("{WAVES} waves of {WAVE} bulk calls with grpc-timeout 20m: {statuses:?}");
    if let Some(ms) = pushback {
        println!("a refusal's grpc-retry-pushback-ms: {ms}");
    }
    Ok(())
}
