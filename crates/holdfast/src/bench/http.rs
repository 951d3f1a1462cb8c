//! `uncontended --http` and `contended --http`: the same loops through the HTTP API, as a fleet that
//! speaks `curl` does, on keep-alive HTTP/1.1 connections spread evenly over the endpoints given (client
//! `i` on endpoint `i mod n`: give every node for a load balancer's spread, one node for that node alone).
//!
//! The connection is a few lines of HTTP/1.1 written here rather than a general client: the generator
//! shares the host's cores with the nodes it measures, so it writes one request and reads one answer per
//! call (a `Content-Length` body; holdfast's answers always have one) and parses no more JSON than the
//! token it needs, to keep its own cost per request out of the figures. Every call is bounded by
//! [`CALL_TIMEOUT`], and a connection that failed is made anew.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::loops::{finish, HandOffs, Window};
use super::{authority, Report, Samples};

/// The longest one call may take, connecting included.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer head (status line and headers) and body taken.
const HEAD_BYTES_MAX: usize = 16 * 1024;
const BODY_BYTES_MAX: usize = 1 << 20;

/// One keep-alive HTTP/1.1 connection to a node's client port, one call at a time.
pub struct Conn {
    host: String,
    stream: Option<BufReader<TcpStream>>,
    request: Vec<u8>,
    line: String,
    body: Vec<u8>,
}

impl Conn {
    /// A connection to `endpoint` (`host:port`, or `http://host:port`), made at the first call.
    pub fn new(endpoint: &str) -> Conn {
        Conn {
            host: authority(endpoint).to_owned(),
            stream: None,
            request: Vec::new(),
            line: String::new(),
            body: Vec::new(),
        }
    }

    /// Sends `method path` and answers the status and the body. On any error the connection is dropped,
    /// and the next call makes a new one.
    pub async fn call(&mut self, method: &str, path: &str) -> io::Result<(u16, &[u8])> {
        match tokio::time::timeout(CALL_TIMEOUT, self.exchange(method, path)).await {
            Ok(Ok(status)) => Ok((status, &self.body)),
            Ok(Err(e)) => {
                self.stream = None;
                Err(e)
            }
            Err(_) => {
                self.stream = None;
                Err(io::Error::new(io::ErrorKind::TimedOut, format!("{method} {path}: no answer in {CALL_TIMEOUT:?}")))
            }
        }
    }

    async fn exchange(&mut self, method: &str, path: &str) -> io::Result<u16> {
        if self.stream.is_none() {
            let tcp = TcpStream::connect(&self.host).await?;
            tcp.set_nodelay(true)?;
            self.stream = Some(BufReader::new(tcp));
        }
        let stream = self.stream.as_mut().expect("connected above");
        self.request.clear();
        let head = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: 0\r\n\r\n", self.host);
        self.request.extend_from_slice(head.as_bytes());
        stream.get_mut().write_all(&self.request).await?;
        let (status, length, close) = read_head(stream, &mut self.line).await?;
        self.body.clear();
        self.body.resize(length, 0);
        stream.read_exact(&mut self.body).await?;
        if close {
            self.stream = None;
        }
        Ok(status)
    }
}

/// Reads an answer's head: its status, its body's length and whether the server closes the connection.
async fn read_head(stream: &mut BufReader<TcpStream>, line: &mut String) -> io::Result<(u16, usize, bool)> {
    let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_owned());
    let (mut status, mut length, mut close, mut read) = (None, None, false, 0);
    loop {
        line.clear();
        let n = stream.read_line(line).await?;
        read += n;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the node closed the connection"));
        }
        if read > HEAD_BYTES_MAX {
            return Err(invalid("an answer head over 16 KiB"));
        }
        let text = line.trim_end();
        if text.is_empty() {
            break;
        }
        if status.is_none() {
            status = text.split_whitespace().nth(1).and_then(|code| code.parse::<u16>().ok());
            status.ok_or_else(|| invalid("not an HTTP status line"))?;
            continue;
        }
        let Some((name, value)) = text.split_once(':') else { continue };
        if name.eq_ignore_ascii_case("content-length") {
            length = value.trim().parse::<usize>().ok().filter(|n| *n <= BODY_BYTES_MAX);
            length.ok_or_else(|| invalid("a Content-Length over 1 MiB, or none that parses"))?;
        } else if name.eq_ignore_ascii_case("connection") && value.trim().eq_ignore_ascii_case("close") {
            close = true;
        }
    }
    let status = status.ok_or_else(|| invalid("no status line"))?;
    Ok((status, length.ok_or_else(|| invalid("an answer without Content-Length"))?, close))
}

/// The `"token"` field of a grant's JSON body.
fn token(body: &[u8]) -> Option<&str> {
    let body = std::str::from_utf8(body).ok()?;
    let start = body.find("\"token\":\"")? + "\"token\":\"".len();
    let len = body[start..].find('"')?;
    Some(&body[start..start + len])
}

/// The HTTP twin of `uncontended`: each client acquires (`POST`, a 30 s TTL) and releases (`DELETE` with
/// the token) its own lock until `duration` is over.
pub async fn uncontended(endpoints: &[String], run_id: u32, clients: usize, duration: Duration) -> Report {
    let window = Window::start(duration, "cycles");
    let (counters, deadline) = (window.counters.clone(), window.deadline);
    let mut tasks = Vec::new();
    for i in 0..clients {
        let (mut conn, counters) = (Conn::new(&endpoints[i % endpoints.len()]), counters.clone());
        tasks.push(tokio::spawn(async move {
            let mut samples = Samples::default();
            let name = format!("bench-{run_id:08x}-{i}");
            let (acquire, mut release) = (format!("/v1/locks/{name}?ttl=30s&owner=bench-{i}"), String::new());
            while Instant::now() < deadline {
                let t = Instant::now();
                let granted = match conn.call("POST", &acquire).await {
                    Ok((200, body)) => token(body).map(|token| format!("/v1/locks/{name}?token={token}")),
                    _ => None,
                };
                let Some(path) = granted else {
                    counters.add_error();
                    continue;
                };
                release.clone_from(&path);
                match conn.call("DELETE", &release).await {
                    Ok((200, _)) => {
                        samples.push(t.elapsed());
                        counters.add_done();
                    }
                    _ => counters.add_error(),
                }
            }
            samples
        }));
    }
    let mut samples = Samples::default();
    for task in tasks {
        if let Ok(s) = task.await {
            samples.extend(s);
        }
    }
    let mut report =
        finish("uncontended", "uncontended acquire+release over HTTP", "cycles/s", clients, &window, &samples);
    http_fields(&mut report, endpoints);
    report
}

/// The HTTP twin of `contended`: every client wants one lock, waiting for it in its queue with `wait=`
/// (what is left of `duration`), and releases it as soon as it holds it. Hand-overs/s and the hand-over
/// latency (release sent → the next holder's grant read).
pub async fn contended(endpoints: &[String], run_id: u32, clients: usize, duration: Duration) -> Report {
    let window = Window::start(duration, "hand-overs");
    let (counters, deadline) = (window.counters.clone(), window.deadline);
    let handoffs = Arc::new(HandOffs::default());
    let mut tasks = Vec::new();
    for i in 0..clients {
        let mut conn = Conn::new(&endpoints[i % endpoints.len()]);
        let (counters, handoffs) = (counters.clone(), handoffs.clone());
        tasks.push(tokio::spawn(async move {
            let name = format!("bench-{run_id:08x}-contended");
            while Instant::now() < deadline {
                let wait_ms = deadline.saturating_duration_since(Instant::now()).as_millis();
                let acquire = format!("/v1/locks/{name}?ttl=30s&owner=bench-{i}&wait={wait_ms}ms");
                let release = match conn.call("POST", &acquire).await {
                    Ok((200, body)) => token(body).map(|token| format!("/v1/locks/{name}?token={token}")),
                    // The wait ran out: the run is over.
                    Ok((409, _)) => break,
                    _ => None,
                };
                let Some(release) = release else {
                    counters.add_error();
                    continue;
                };
                handoffs.granted(&counters);
                handoffs.releasing();
                if !matches!(conn.call("DELETE", &release).await, Ok((200, _))) {
                    counters.add_error();
                }
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    let samples = handoffs.samples();
    let mut report =
        finish("contended", "contended hand-over over HTTP (wait=)", "handovers/s", clients, &window, &samples);
    http_fields(&mut report, endpoints);
    report
}

/// What an HTTP run adds to its report: the interface, and how many nodes its clients were spread over.
fn http_fields(report: &mut Report, endpoints: &[String]) {
    report.field("interface", "http");
    report.field("endpoints", endpoints.len());
    report.row("interface", format!("HTTP/1.1 keep-alive, clients spread over {} endpoint(s)", endpoints.len()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_read_from_a_grant_and_nothing_else_is() {
        let grant = br#"{"expires_at":"x","fence":2,"name":"a","token":"fa2ec0ea492a7dd2ef53d421ee4f3cb6","ttl_ms":1}"#;
        assert_eq!(token(grant), Some("fa2ec0ea492a7dd2ef53d421ee4f3cb6"));
        assert_eq!(token(br#"{"type":"urn:holdfast:busy"}"#), None);
        assert_eq!(token(br#"{"token":"unterminated"#), None);
    }

    #[tokio::test]
    async fn a_keep_alive_connection_reads_answers_by_their_length_and_reconnects_after_a_close() {
        use std::sync::atomic::{AtomicUsize, Ordering};

        // Each connection answers its first request 409 and keeps the connection, its second 200 with
        // `Connection: close`, and closes it.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut tcp = BufReader::new(tcp);
                    for (status, connection) in [("409 Conflict", ""), ("200 OK", "Connection: close\r\n")] {
                        let mut line = String::new();
                        while line != "\r\n" {
                            line.clear();
                            if tcp.read_line(&mut line).await.unwrap() == 0 {
                                return;
                            }
                        }
                        let body = format!("{{\"token\":\"{status}\"}}");
                        let answer =
                            format!("HTTP/1.1 {status}\r\n{connection}Content-Length: {}\r\n\r\n{body}", body.len());
                        tcp.get_mut().write_all(answer.as_bytes()).await.unwrap();
                    }
                });
            }
        });
        let mut conn = Conn::new(&addr);
        let (status, body) = conn.call("POST", "/a").await.unwrap();
        assert_eq!((status, token(body)), (409, Some("409 Conflict")));
        let (status, body) = conn.call("DELETE", "/a").await.unwrap();
        assert_eq!((status, token(body)), (200, Some("200 OK")), "the second answer, on the same connection");
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        let (status, _) = conn.call("POST", "/a").await.unwrap();
        assert_eq!(status, 409, "after the server's close, a new connection");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }
}
