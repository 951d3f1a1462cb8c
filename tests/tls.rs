//! TLS on the client port and mutual TLS between peers, on a real 3-node cluster: it works end to end (a
//! leader is elected and writes replicate over mTLS, a follower forwards over it, the CLI speaks it), and it
//! refuses what it must: plain HTTP, a client without a certificate, a client or a peer whose certificate
//! another CA signed. Certificates are reloaded on SIGHUP.

use std::path::{Path, PathBuf};
use std::process::Command;

use holdfast_server::peer::codec::Call;
use holdfast_server::tls::Tls;
use openraft::error::RaftError;
use openraft::raft::{VoteRequest, VoteResponse};
use openraft::Vote;
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};

use crate::common::{wait_for, Cluster, Grant, READY_BOUND};

/// A CA that signs certificates.
struct Ca {
    params: CertificateParams,
    key: KeyPair,
    pem: String,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let pem = params.clone().self_signed(&key).unwrap().pem();
        Ca { params, key, pem }
    }

    /// A certificate for `names` (DNS names or IP addresses), good for servers and clients; its PEM and key.
    fn issue(&self, names: &[&str]) -> (String, String) {
        let issuer = self.params.clone().self_signed(&self.key).unwrap();
        let mut params = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name.push(DnType::CommonName, names.first().copied().unwrap_or("client"));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &issuer, &self.key).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn https_client(ca_pem: &str, identity: Option<(&str, &str)>) -> reqwest::Client {
    let mut builder = reqwest::Client::builder()
        .use_rustls_tls()
        .no_proxy()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap())
        .timeout(std::time::Duration::from_secs(10));
    if let Some((cert, key)) = identity {
        builder = builder.identity(reqwest::Identity::from_pem(format!("{cert}{key}").as_bytes()).unwrap());
    }
    builder.build().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_cluster_serves_clients_with_certificates_and_refuses_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("holdfast test CA");
    let rogue = Ca::new("someone else's CA");
    let (node_cert, node_key) = ca.issue(&["localhost", "127.0.0.1"]);
    let (client_cert, client_key) = ca.issue(&["worker-1"]);
    let (rogue_cert, rogue_key) = rogue.issue(&["worker-1", "127.0.0.1"]);
    let ca_path = write(dir.path(), "ca.pem", &ca.pem);
    let cert_path = write(dir.path(), "node.pem", &node_cert);
    let key_path = write(dir.path(), "node.key", &node_key);
    let client_cert_path = write(dir.path(), "client.pem", &client_cert);
    let client_key_path = write(dir.path(), "client.key", &client_key);

    let good = https_client(&ca.pem, Some((&client_cert, &client_key)));
    let cert_arg = cert_path.to_str().unwrap();
    let args = ["--tls-cert", cert_arg, "--tls-key", key_path.to_str().unwrap(), "--tls-ca", ca_path.to_str().unwrap()];
    let args: Vec<&str> = args.into_iter().chain(["--tls-client-auth"]).collect();
    // Ready means a leader was elected and the log replicated: every peer message went over mutual TLS.
    let cluster = Cluster::start_tls(3, &args, Some(good.clone())).await;
    let leader = cluster.leader().await;
    let follower = cluster.other_than(&[leader]);
    let first = Grant::from_reply(&cluster.acquire(follower, "tls-job", "worker-1", "30s").await, "over TLS");
    assert!(first.fence > 0);

    // Refused: plain HTTP on the TLS port, no client certificate, a certificate from another CA.
    let addr = cluster.client_addr(follower);
    let plain = reqwest::Client::builder().no_proxy().build().unwrap();
    let answer = plain.get(format!("http://{addr}/v1/locks/tls-job")).send().await;
    assert!(answer.is_err() || !answer.unwrap().status().is_success(), "plain HTTP must not be served");
    for (what, client) in [
        ("no client certificate", https_client(&ca.pem, None)),
        ("a client certificate from another CA", https_client(&ca.pem, Some((&rogue_cert, &rogue_key)))),
    ] {
        let answer = client.get(format!("https://{addr}/v1/locks/tls-job")).send().await;
        assert!(answer.is_err(), "{what} must be refused, got {answer:?}");
    }

    // The peer port takes only certificates the cluster's CA signed. With TLS 1.3 the server checks the
    // client's certificate after the client considers the handshake done, so each dial makes a call, with
    // the nodes' own connector: a vote of term 0, which a node answers (refusing it) and which changes
    // nothing. With someone else's certificate the connection is refused.
    let peer = cluster.peer_addr(follower);
    let dial = |cert: &str, key: &str| {
        let (cert, key) = (write(dir.path(), "dial.pem", cert), write(dir.path(), "dial.key", key));
        let files = holdfast_server::tls::TlsFiles { cert, key, ca: ca_path.clone(), client_auth: false };
        let peers =
            holdfast_server::peer::client::Peers::new(Some(std::sync::Arc::new(Tls::load(files).unwrap())), None);
        let vote: VoteRequest<u64> = VoteRequest::new(Vote::new(0, 99), None);
        async move {
            let answer: Result<Result<VoteResponse<u64>, RaftError<u64>>, _> = peers
                .call(follower as u64, &peer.to_string(), Call::Vote, &vote, std::time::Duration::from_secs(5))
                .await;
            match answer {
                Ok(Ok(response)) if !response.vote_granted => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    };
    dial(&node_cert, &node_key).await.expect("a node's certificate is accepted");
    let refused = dial(&rogue_cert, &rogue_key).await;
    assert!(refused.is_err(), "a rogue peer must be refused: {refused:?}");

    // The CLI speaks TLS with --ca, --cert and --key.
    let cli = |with_cert: bool| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_holdfast"));
        command.args(["lock", "--endpoints", &addr.to_string(), "--ca", ca_path.to_str().unwrap()]);
        if with_cert {
            command.args(["--cert", client_cert_path.to_str().unwrap(), "--key", client_key_path.to_str().unwrap()]);
        }
        command.args(["get", "tls-job", "--json"]);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("HOLDFAST_") {
                command.env_remove(key);
            }
        }
        command.output().unwrap()
    };
    let output = cli(true);
    assert!(output.status.success(), "holdfast lock get over TLS: {}", String::from_utf8_lossy(&output.stderr));
    let view: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(view["locks"][0]["holder"]["fence"].as_u64(), Some(first.fence), "{view}");
    assert!(!cli(false).status.success(), "without its certificate the CLI is refused");
    let run = Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .args(["run", "tls-run", "--endpoints", &addr.to_string(), "--ca", ca_path.to_str().unwrap()])
        .args(["--cert", client_cert_path.to_str().unwrap(), "--key", client_key_path.to_str().unwrap()])
        .args(["--", "sh", "-c", "test \"$HOLDFAST_FENCE\" -gt 0"])
        .output()
        .unwrap();
    assert!(run.status.success(), "holdfast run over TLS: {}", String::from_utf8_lossy(&run.stderr));

    // Reload: the nodes' certificate file now holds one for `localhost` only (the last check: the cluster's
    // peers, which dial 127.0.0.1, would refuse it from here on). After SIGHUP, new connections to it by
    // IP fail the name check, and by name succeed: it serves the new certificate without a restart.
    let (renamed_cert, renamed_key) = ca.issue(&["localhost"]);
    std::fs::write(&key_path, &renamed_key).unwrap();
    std::fs::write(&cert_path, &renamed_cert).unwrap();
    let pid = cluster.pid(follower);
    assert!(Command::new("kill").args(["-HUP", &pid.to_string()]).status().unwrap().success());
    let by_ip = format!("https://{addr}/livez");
    let by_name = format!("https://localhost:{}/livez", addr.port());
    wait_for(READY_BOUND, "the reloaded certificate to be served", async || {
        // A new client each time: a pooled connection would keep the old certificate.
        let client = https_client(&ca.pem, Some((&client_cert, &client_key)));
        let (ip, name) = (client.get(&by_ip).send().await, client.get(&by_name).send().await);
        match (ip.is_err(), name.as_ref().map(|r| r.status().as_u16())) {
            (true, Ok(200)) => Ok(()),
            seen => Err(format!("(by IP refused, by name) = {seen:?}")),
        }
    })
    .await;
}
