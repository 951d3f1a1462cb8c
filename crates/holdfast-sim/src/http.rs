//! A minimal HTTP/1.1 client over the simulated network, for the one-call API (what `curl` does in a
//! shell script): one connection per call, a bound on each call.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// How long one call may take before its outcome counts as unknown: the server's own bound on a request
/// (5 s) and some.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(6);

/// Sends `method path` to `addr` and answers the status and the JSON body (`Null` if none).
pub async fn call(addr: &str, method: Method, path: &str) -> anyhow::Result<(StatusCode, Value)> {
    tokio::time::timeout(CALL_TIMEOUT, call_unbounded(addr, method, path))
        .await
        .map_err(|_| anyhow::anyhow!("no answer from {addr} within {CALL_TIMEOUT:?}"))?
}

async fn call_unbounded(addr: &str, method: Method, path: &str) -> anyhow::Result<(StatusCode, Value)> {
    let stream = turmoil::net::TcpStream::connect(addr).await?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    let connection = tokio::spawn(connection);
    let request = Request::builder().method(method).uri(path).header("host", addr).body(Empty::<Bytes>::new())?;
    let response = sender.send_request(request).await;
    let result = async {
        let response = response?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        let json = if body.is_empty() { Value::Null } else { serde_json::from_slice(&body)? };
        Ok((status, json))
    }
    .await;
    connection.abort();
    result
}
