//! What an HTTP request carries: its one path segment, its query parameters, a lock's value (in the query
//! or as the raw body) and, for admin calls, who sends it. Every malformed one is refused as a problem of its
//! kind.

use std::collections::HashMap;
use std::convert::Infallible;
use std::marker::PhantomData;
use std::net::IpAddr;

use axum::extract::{FromRequestParts, Path};
use axum::http::request::Parts;
use axum::http::HeaderMap;
use holdfast_core::Token;

use super::port::peer_ip;
use crate::api::error::ApiError;
use crate::api::{admin, locks};
use crate::front::problem::path_rejection;

/// The `Authorization` header's value, if it is text.
pub fn authorization(headers: &HeaderMap) -> Option<&str> {
    headers.get(axum::http::header::AUTHORIZATION).and_then(|v| v.to_str().ok())
}

/// A request's `Authorization` header, taken alone: not the whole header map, which axum's `HeaderMap`
/// extractor copies for every request.
pub struct Credentials(pub Option<String>);

impl<S: Send + Sync> FromRequestParts<S> for Credentials {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Infallible> {
        Ok(Credentials(authorization(&parts.headers).map(str::to_owned)))
    }
}

/// What an admin check needs of an HTTP request: its `Authorization` header and where it came from.
pub struct AdminCall {
    authorization: Option<String>,
    peer: Option<IpAddr>,
}

impl AdminCall {
    pub fn caller(&self) -> admin::Caller<'_> {
        admin::Caller { authorization: self.authorization.as_deref(), peer: self.peer }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for AdminCall {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Infallible> {
        let authorization = authorization(&parts.headers).map(str::to_owned);
        Ok(AdminCall { authorization, peer: peer_ip(&parts.extensions) })
    }
}

/// A route's one path parameter, as text: a lock name, a tenant or a member id (`K` says which). One that
/// is not UTF-8 once percent-decoded (`%ff`) is refused as bad input of its kind, a problem like every
/// other answer; axum's own rejection would be plain text.
pub struct Segment<K>(pub String, pub PhantomData<K>);

/// What a path parameter is, for the problem that refuses it.
pub trait SegmentKind {
    /// The problem type's slug.
    const SLUG: &'static str;
    /// The parameter, for people.
    const WHAT: &'static str;
}

/// `/v1/locks/{name}…`
pub struct LockName;
/// `/v1/keys/{tenant}`
pub struct Tenant;
/// `/v1/cluster/members/{id}`
pub struct MemberId;

impl SegmentKind for LockName {
    const SLUG: &'static str = "invalid-name";
    const WHAT: &'static str = "the lock name";
}

impl SegmentKind for Tenant {
    const SLUG: &'static str = "invalid-tenant";
    const WHAT: &'static str = "the tenant";
}

impl SegmentKind for MemberId {
    const SLUG: &'static str = "invalid-member";
    const WHAT: &'static str = "the member id";
}

impl<S: Send + Sync, K: SegmentKind + Send> FromRequestParts<S> for Segment<K> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Path::<String>::from_request_parts(parts, state).await {
            Ok(Path(text)) => Ok(Segment(text, PhantomData)),
            Err(rejection) => Err(path_rejection(K::SLUG, K::WHAT, rejection)),
        }
    }
}

/// The query string's parameters, decoded as HTML forms encode them (`+` is a space, `%XX` a byte; a `%`
/// not followed by two hex digits stands for itself). A query that is not UTF-8 once decoded, or that gives
/// a parameter twice, is refused (when the handler first reads it, so that an admin call without its key
/// is refused for that first): a value must not be silently replaced (`%ff` by U+FFFD), nor one of two
/// values silently chosen.
pub struct Params(Result<HashMap<String, String>, ApiError>);

impl<S: Send + Sync> FromRequestParts<S> for Params {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Infallible> {
        Ok(Params(parse_query(parts.uri.query().unwrap_or(""))))
    }
}

fn parse_query(query: &str) -> Result<HashMap<String, String>, ApiError> {
    let mut params = HashMap::new();
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let (key, value) = (form_decode(key)?, form_decode(value)?);
        if params.contains_key(&key) {
            return Err(ApiError::invalid("invalid-query", format!("parameter {key:?} is given more than once")));
        }
        params.insert(key, value);
    }
    Ok(params)
}

fn form_decode(text: &str) -> Result<String, ApiError> {
    let hex = |b: u8| (b as char).to_digit(16);
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = match bytes.get(i..i + 3) {
            Some([b'%', high, low]) => hex(*high).zip(hex(*low)),
            _ => None,
        };
        match (bytes[i], escaped) {
            (_, Some((high, low))) => {
                decoded.push((high * 16 + low) as u8);
                i += 3;
            }
            (b'+', None) => {
                decoded.push(b' ');
                i += 1;
            }
            (b, None) => {
                decoded.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(decoded)
        .map_err(|_| ApiError::invalid("invalid-query", format!("{text:?} is not UTF-8 once percent-decoded")))
}

/// A request's body, read up to the longest value a lock takes: a longer one is refused, unread past that.
pub struct Body(pub axum::body::Bytes);

impl<S: Send + Sync> axum::extract::FromRequest<S> for Body {
    type Rejection = ApiError;

    async fn from_request(request: axum::extract::Request, _: &S) -> Result<Self, ApiError> {
        let max = holdfast_core::limits::VALUE_LEN_MAX;
        match axum::body::to_bytes(request.into_body(), max).await {
            Ok(bytes) => Ok(Body(bytes)),
            Err(_) => Err(ApiError::invalid(
                "invalid-value",
                format!("the body (the lock's value) could not be read, or is longer than {max} bytes"),
            )),
        }
    }
}

/// Query parameters, with unknown ones refused so that a typo (`tll=`) is not silently ignored.
pub struct Parsed<'a>(&'a HashMap<String, String>);

impl<'a> Parsed<'a> {
    pub fn new(params: &'a Params, known: &[&str]) -> Result<Self, ApiError> {
        let params = params.0.as_ref().map_err(Clone::clone)?;
        if let Some(unknown) = params.keys().find(|k| !known.contains(&k.as_str())) {
            let detail = format!("unknown parameter {unknown:?}; this endpoint takes {known:?}");
            return Err(ApiError::invalid("invalid-query", detail));
        }
        Ok(Parsed(params))
    }

    pub fn get(&self, key: &str) -> Option<&'a str> {
        self.0.get(key).map(String::as_str)
    }

    /// A duration parameter (bounds are checked by the operation).
    pub fn duration_ms(&self, key: &str, slug: &'static str) -> Result<Option<u64>, ApiError> {
        let Some(text) = self.get(key) else { return Ok(None) };
        match parse_duration_ms(text) {
            Some(ms) => Ok(Some(ms)),
            None => Err(ApiError::invalid(slug, format!("{key}={text:?}: seconds or a duration (500ms, 2s, 1m)"))),
        }
    }

    /// The value a request publishes: `value=TEXT` in the query, or the raw body sent as `text/plain` or
    /// `application/octet-stream` (any bytes), not both. Empty: none. Its length is checked by the operation.
    pub fn value(&self, headers: &HeaderMap, body: &[u8]) -> Result<Vec<u8>, ApiError> {
        let query = self.get("value");
        if body.is_empty() {
            return Ok(query.unwrap_or("").as_bytes().to_vec());
        }
        if query.is_some() {
            return Err(ApiError::invalid("invalid-value", "give the value in the query or the body, not both".into()));
        }
        let content_type = headers.get(axum::http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
        let essence = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
        if essence != "text/plain" && essence != "application/octet-stream" {
            let detail = format!(
                "a body is the lock's value, sent as text/plain or application/octet-stream, not {content_type:?}"
            );
            return Err(ApiError::invalid("invalid-value", detail));
        }
        Ok(body.to_vec())
    }

    /// `after=REVISION` (a watch's), if given: a number, as a read, a list or a watch event showed it.
    pub fn revision(&self) -> Result<Option<u64>, ApiError> {
        let Some(text) = self.get("after") else { return Ok(None) };
        let parsed = text.parse::<u64>().map_err(|_| {
            ApiError::invalid(
                "invalid-query",
                format!("after={text:?}: a revision, as a read, a list or an event showed it"),
            )
        })?;
        Ok(Some(parsed))
    }

    /// A semaphore's `limit=N` (absent: 1, a lock); its bounds are checked by the operation.
    pub fn limit(&self) -> Result<u32, ApiError> {
        let Some(text) = self.get("limit") else { return Ok(1) };
        text.parse()
            .map_err(|_| ApiError::invalid("invalid-limit", format!("limit={text:?}: a whole number of holders")))
    }

    pub fn token(&self) -> Result<Token, ApiError> {
        let Some(text) = self.get("token") else {
            return Err(ApiError::invalid("invalid-token", "token is required".into()));
        };
        locks::parse_token(text)
    }
}

/// Seconds as a bare number (`60`, `0.5`), or a duration with a unit (`500ms`, `2s`, `1m`, `1h`).
pub fn parse_duration_ms(text: &str) -> Option<u64> {
    let text = text.trim();
    if text.is_empty() || text.len() > 32 {
        return None;
    }
    if text.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        let seconds: f64 = text.parse().ok()?;
        let ms = seconds * 1000.0;
        return (ms.is_finite() && ms <= u64::MAX as f64 / 2.0).then_some(ms.round() as u64);
    }
    humantime::parse_duration(text).ok().and_then(|d| u64::try_from(d.as_millis()).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_as_documented() {
        assert_eq!(parse_duration_ms("60"), Some(60_000));
        assert_eq!(parse_duration_ms("0.5"), Some(500));
        assert_eq!(parse_duration_ms("500ms"), Some(500));
        assert_eq!(parse_duration_ms("2s"), Some(2_000));
        assert_eq!(parse_duration_ms("1m"), Some(60_000));
        assert_eq!(parse_duration_ms("1h"), Some(3_600_000));
        assert_eq!(parse_duration_ms(""), None);
        assert_eq!(parse_duration_ms("abc"), None);
        assert_eq!(parse_duration_ms("-1"), None);
        assert_eq!(parse_duration_ms("1e400"), None);
        assert_eq!(parse_duration_ms(&"9".repeat(40)), None);
        assert_eq!(locks::show_ms(1_500), "1s 500ms");
    }
}
