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

/// The admin key every simulated node runs with. Its clients reach the nodes from hosts of their own (not
/// loopback), where admin calls need the key; every call sends it (lock calls ignore it, auth being off),
/// so the workload's and the scenarios' membership changes are made as an operator's would be.
pub const ADMIN_KEY: &str = "holdfast-sim-admin-key";

/// Sends `method path` to `addr` and answers the status and the JSON body (`Null` if none).
pub async fn call(addr: &str, method: Method, path: &str) -> anyhow::Result<(StatusCode, Value)> {
    let (status, body) = bounded(addr, method, path).await?;
    let json = if body.is_empty() { Value::Null } else { serde_json::from_slice(&body)? };
    Ok((status, json))
}

/// Sends `GET path` to `addr` and answers the status and the body as text (`/metrics`).
pub async fn text(addr: &str, path: &str) -> anyhow::Result<(StatusCode, String)> {
    let (status, body) = bounded(addr, Method::GET, path).await?;
    Ok((status, String::from_utf8(body.to_vec())?))
}

async fn bounded(addr: &str, method: Method, path: &str) -> anyhow::Result<(StatusCode, Bytes)> {
    tokio::time::timeout(CALL_TIMEOUT, unbounded(addr, method, path))
        .await
        .map_err(|_| anyhow::anyhow!("no answer from {addr} within {CALL_TIMEOUT:?}"))?
}

async fn unbounded(addr: &str, method: Method, path: &str) -> anyhow::Result<(StatusCode, Bytes)> {
    let stream = turmoil::net::TcpStream::connect(addr).await?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    let connection = tokio::spawn(connection);
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr)
        .header("authorization", format!("Bearer {ADMIN_KEY}"))
        .body(Empty::<Bytes>::new())?;
    let response = sender.send_request(request).await;
    let result = async {
        let response = response?;
        let status = response.status();
        Ok((status, response.into_body().collect().await?.to_bytes()))
    }
    .await;
    connection.abort();
    result
}
