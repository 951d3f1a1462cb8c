//! The OpenAPI document of the HTTP API (`crates/holdfast-server/openapi.json`, served at
//! `GET /v1/openapi.json`):
//!
//! 1. It is an OpenAPI 3.1 document whose every `$ref` resolves, and whose every problem type is one of
//!    docs/http-api.md's Errors table (and every type of that table that HTTP can answer is in it).
//! 2. **It lists exactly the routes the node has**: the `.route("PATH", METHODS)` calls of the client port's
//!    router (front/http/*.rs, and front/health.rs and front/page/mod.rs, whose routes it merges), read from their source text as
//!    tests/layout.rs reads sources, against the document's `paths` and their methods. A route the document
//!    lacks fails, and so does a path or method the document has and the router does not.
//! 3. A running node serves the same bytes, as `application/json`, without an API key even under `--auth`.
//!
//! `tests/openapi-fuzz` (at the repository's root) validates the document with openapi-spec-validator and
//! fuzzes a real node with it (schemathesis).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

mod common;

/// The document, as the node embeds it.
const OPENAPI_JSON: &str = include_str!("../openapi.json");
/// The methods an OpenAPI path item may have.
const METHODS: [&str; 8] = ["get", "put", "post", "delete", "patch", "head", "options", "trace"];

fn document() -> Value {
    serde_json::from_str(OPENAPI_JSON).expect("openapi.json is JSON")
}

// ---------------------------------------------------------------------------------------------------
// 1. An OpenAPI 3.1 document.
// ---------------------------------------------------------------------------------------------------

#[test]
fn the_document_is_openapi_3_1() {
    let doc = document();
    let version = doc["openapi"].as_str().expect("an `openapi` field");
    assert!(version.starts_with("3.1."), "OpenAPI 3.1, not {version}");
    assert!(doc["info"]["title"].is_string() && doc["info"]["version"].is_string(), "info has title and version");
    let paths = doc["paths"].as_object().expect("paths");
    assert!(!paths.is_empty(), "paths are listed");
    for key in ["schemas", "parameters", "securitySchemes"] {
        assert!(doc["components"][key].as_object().is_some_and(|o| !o.is_empty()), "components.{key}");
    }
    for (path, item) in paths {
        assert!(path.starts_with('/'), "{path}: a path starts with /");
        for (method, op) in item.as_object().unwrap().iter().filter(|(m, _)| METHODS.contains(&m.as_str())) {
            let responses = op["responses"].as_object().unwrap_or_else(|| panic!("{method} {path}: responses"));
            assert!(!responses.is_empty(), "{method} {path}: at least one response");
            for (status, response) in responses {
                assert!(
                    response["description"].is_string() || response.get("$ref").is_some(),
                    "{method} {path} {status}: a description"
                );
            }
        }
    }
}

#[test]
fn every_reference_resolves() {
    let doc = document();
    let mut refs = Vec::new();
    collect_refs(&doc, &mut refs);
    assert!(!refs.is_empty());
    let dangling: Vec<&String> = refs.iter().filter(|r| resolve(&doc, r).is_none()).collect();
    assert!(dangling.is_empty(), "references to nothing: {dangling:?}");
}

fn collect_refs(value: &Value, refs: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            if let Some(Value::String(r)) = map.get("$ref") {
                refs.push(r.clone());
            }
            map.values().for_each(|v| collect_refs(v, refs));
        }
        Value::Array(items) => items.iter().for_each(|v| collect_refs(v, refs)),
        _ => {}
    }
}

fn resolve<'a>(doc: &'a Value, reference: &str) -> Option<&'a Value> {
    doc.pointer(reference.strip_prefix('#')?)
}

/// Problem types in docs/http-api.md's Errors table that no HTTP endpoint answers as an operation's answer:
/// the gRPC sessions' own, the end of a watch stream (an event, not an answer), and those any path may
/// answer (described once, in the document's `info`).
const NOT_PER_OPERATION: [&str; 10] = [
    "invalid-session",
    "session-gone",
    "wrong-session-secret",
    "invalid-secret",
    "too-many-sessions",
    "too-many-claims",
    "watch-behind",
    "no-route",
    "method-not-allowed",
    "internal",
];

#[test]
fn problem_types_are_those_of_the_errors_table() {
    let mut in_spec = BTreeSet::new();
    collect_problem_types(&document(), &mut in_spec);
    let table = errors_table();
    let unknown: Vec<&String> = in_spec.difference(&table).collect();
    assert!(
        unknown.is_empty(),
        "problem types the document names but docs/http-api.md's Errors table lacks: {unknown:?}"
    );
    let missing: Vec<&String> =
        table.iter().filter(|t| !in_spec.contains(*t) && !NOT_PER_OPERATION.contains(&t.as_str())).collect();
    assert!(
        missing.is_empty(),
        "problem types of the Errors table that no operation of the document answers: {missing:?}"
    );
}

/// Every `urn:holdfast:…` string in the document (the `enum`s of its problem responses).
fn collect_problem_types(value: &Value, types: &mut BTreeSet<String>) {
    match value {
        Value::String(s) => {
            if let Some(slug) = s.strip_prefix("urn:holdfast:") {
                types.insert(slug.to_owned());
            }
        }
        Value::Object(map) => map.values().for_each(|v| collect_problem_types(v, types)),
        Value::Array(items) => items.iter().for_each(|v| collect_problem_types(v, types)),
        _ => {}
    }
}

/// The problem types of docs/http-api.md's Errors table: the code spans of its first column.
fn errors_table() -> BTreeSet<String> {
    let text = fs::read_to_string(repo_root().join("docs/http-api.md")).expect("docs/http-api.md");
    let section = text.split("\n## Errors\n").nth(1).expect("an Errors section");
    let section = section.split("\n## ").next().unwrap();
    let mut types = BTreeSet::new();
    // The rows below the header's `|---|` line.
    let rows = section.lines().skip_while(|l| !l.starts_with("|---")).skip(1).take_while(|l| l.starts_with('|'));
    for row in rows {
        let first = row.split('|').nth(1).unwrap();
        types.extend(first.split('`').skip(1).step_by(2).map(str::to_owned));
    }
    assert!(types.len() > 20, "the Errors table was found: {types:?}");
    types
}

// ---------------------------------------------------------------------------------------------------
// 2. The routes and the document's paths are the same.
// ---------------------------------------------------------------------------------------------------

#[test]
fn the_document_lists_exactly_the_routes() {
    let routes = router_routes();
    assert!(routes.contains_key("/v1/locks/{name}"), "the routes were found: {routes:?}");
    let documented = documented_routes(&document());
    let mut errors = Vec::new();
    for (path, methods) in &routes {
        match documented.get(path) {
            None => errors.push(format!("the route {path} ({methods:?}) is not in openapi.json")),
            Some(doc_methods) if doc_methods != methods => {
                errors.push(format!("{path}: the router takes {methods:?}, openapi.json documents {doc_methods:?}"))
            }
            Some(_) => {}
        }
    }
    for path in documented.keys().filter(|p| !routes.contains_key(*p)) {
        errors.push(format!("openapi.json documents {path}, which no route serves"));
    }
    assert!(errors.is_empty(), "openapi.json and the router disagree:\n{}", errors.join("\n"));
}

/// The document's paths and, for each, its methods (upper case).
fn documented_routes(doc: &Value) -> BTreeMap<String, BTreeSet<String>> {
    doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(path, item)| {
            let methods = item
                .as_object()
                .unwrap()
                .keys()
                .filter(|k| METHODS.contains(&k.as_str()))
                .map(|k| k.to_uppercase())
                .collect();
            (path.clone(), methods)
        })
        .collect()
}

/// The client port's HTTP routes: every `.route("PATH", METHODS)` in the files its router is built from.
fn router_routes() -> BTreeMap<String, BTreeSet<String>> {
    let front = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/front");
    let mut files: Vec<PathBuf> = fs::read_dir(front.join("http"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect();
    files.push(front.join("health.rs"));
    files.push(front.join("page/mod.rs"));
    files.sort();
    let mut routes = BTreeMap::new();
    for file in files {
        for (path, methods) in parse_routes(&fs::read_to_string(&file).unwrap()) {
            routes.entry(path).or_insert_with(BTreeSet::new).extend(methods);
        }
    }
    routes
}

/// Each `.route("PATH", METHOD_ROUTER)` call of `source` (comments ignored): the path, and the methods its
/// method router names (`get(h)`, `post(a).delete(b)`, `axum::routing::delete(h)`).
fn parse_routes(source: &str) -> Vec<(String, BTreeSet<String>)> {
    let code = blank_comments(source);
    let mut routes = Vec::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find(".route(") {
        rest = &rest[at + ".route(".len()..];
        let args = &rest[..closing_paren(rest)];
        let Some(path) = args.trim_start().strip_prefix('"').and_then(|a| a.split('"').next()) else {
            continue;
        };
        let method_router = &args[args.find(',').expect("route(PATH, METHODS)") + 1..];
        let methods = method_calls(method_router);
        assert!(!methods.is_empty(), "no method in the route {path}: {method_router}");
        routes.push((path.to_owned(), methods));
    }
    routes
}

/// The names in `METHODS` called in `code` (`get(`, `.post(`), as whole words, outside string literals.
fn method_calls(code: &str) -> BTreeSet<String> {
    let code = blank_strings(code);
    let bytes = code.as_bytes();
    let mut found = BTreeSet::new();
    for method in METHODS {
        let mut from = 0;
        while let Some(at) = code[from..].find(method).map(|i| i + from) {
            from = at + method.len();
            let before_ok = at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_');
            let after_ok = code[from..].trim_start().starts_with('(');
            if before_ok && after_ok {
                found.insert(method.to_uppercase());
            }
        }
    }
    found
}

/// The index of the `)` that closes the call whose arguments `text` starts with.
fn closing_paren(text: &str) -> usize {
    let code = blank_strings(text);
    let mut depth = 1;
    for (i, c) in code.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
    }
    panic!("an unclosed call: {text}");
}

/// `source` with its comments replaced by spaces (string literals kept).
fn blank_comments(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut chars = source.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                out.push(c);
                while let Some(s) = chars.next() {
                    out.push(s);
                    match s {
                        '\\' => out.extend(chars.next()),
                        '"' => break,
                        _ => {}
                    }
                }
            }
            '/' if chars.peek() == Some(&'/') => {
                for s in chars.by_ref() {
                    if s == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                let mut last = ' ';
                for s in chars.by_ref() {
                    if last == '*' && s == '/' {
                        break;
                    }
                    last = s;
                }
                out.push(' ');
            }
            _ => out.push(c),
        }
    }
    out
}

/// `code` with the contents of its string literals replaced by spaces (the quotes kept), same length.
fn blank_strings(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut in_string = false;
    let mut escaped = false;
    for c in code.chars() {
        if in_string {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
                out.push('"');
                continue;
            }
            out.extend(std::iter::repeat_n(' ', c.len_utf8()));
        } else {
            in_string = c == '"';
            out.push(c);
        }
    }
    out
}

#[test]
fn the_route_parser_reads_the_router_s_forms() {
    let source = r#"
        // .route("/commented", get(nothing))
        Router::new()
            .route("/v1/a/{name}", post(acquire).delete(release).get(get_lock))
            .route("/v1/b", axum::routing::delete(revoke_key))
            .route("/livez", get(|| async { "ok (get(x)) \"\n" }))
            /* .route("/blocked", put(x)) */
            .route_service("/grpc/{*method}", service)
    "#;
    let routes = parse_routes(source);
    let set = |m: &[&str]| m.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(
        routes,
        vec![
            ("/v1/a/{name}".to_owned(), set(&["DELETE", "GET", "POST"])),
            ("/v1/b".to_owned(), set(&["DELETE"])),
            ("/livez".to_owned(), set(&["GET"])),
        ]
    );
}

#[test]
fn the_comparison_catches_a_missing_or_extra_route() {
    let mut doc = document();
    let routes = router_routes();
    assert_eq!(documented_routes(&doc), routes, "as the repository is");
    doc["paths"].as_object_mut().unwrap().remove("/v1/cluster");
    assert_ne!(documented_routes(&doc), routes, "a route the document lacks");
    let mut doc = document();
    doc["paths"]["/v1/cluster"]["post"] = doc["paths"]["/v1/cluster"]["get"].clone();
    assert_ne!(documented_routes(&doc), routes, "a method the router does not take");
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

// ---------------------------------------------------------------------------------------------------
// 3. A node serves it.
// ---------------------------------------------------------------------------------------------------

/// Bound on every wait: generous for a loaded 2-core machine.
const BOUND: Duration = Duration::from_secs(10);

#[tokio::test]
async fn a_node_serves_the_document_without_a_key() {
    let dir = tempfile::tempdir().unwrap();
    let client = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let peer = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = client.local_addr().unwrap();
    // Under --auth, to show the document needs no API key.
    let config = holdfast_server::Config {
        auth: holdfast_server::AuthConfig { enabled: true, ..Default::default() },
        ..common::one_node(peer.local_addr().unwrap().to_string(), dir.path().to_owned())
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let node = tokio::spawn(holdfast_server::run(
        config,
        holdfast_server::Listeners { client, peer, health: None },
        async move {
            let _ = stopped.await;
        },
    ));
    let http = reqwest::Client::new();
    let url = format!("http://{addr}/v1/openapi.json");
    let response = tokio::time::timeout(BOUND, async {
        loop {
            if let Ok(response) = http.get(&url).send().await {
                return response;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the node answers");
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/json");
    assert_eq!(response.text().await.unwrap(), OPENAPI_JSON, "the node serves the repository's document");
    let locks = http.get(format!("http://{addr}/v1/locks")).send().await.unwrap();
    assert_eq!(locks.status(), 401, "the node runs with --auth");
    let _ = stop.send(());
    tokio::time::timeout(BOUND, node).await.expect("the node stops").unwrap().unwrap();
}
