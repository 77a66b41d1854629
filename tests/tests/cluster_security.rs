//! Who may talk to a worker, and what a hostile peer can do to it.
//!
//! - `strangers_are_refused_while_the_cluster_keeps_working`: a worker with
//!   another cluster key is refused by the coordinator (and refuses it);
//!   UDP garbage, a QUIC client speaking garbage and a client with a wrong
//!   key proof are closed with a reason naming the problem; the coordinator
//!   and the other workers go on and produce the reference ids.
//! - `malformed_and_oversized_frames_close_only_that_connection`: from an
//!   authenticated client, a frame announcing 1 GiB, a frame of another
//!   protocol version, a request with an out-of-range row, and a message
//!   that does not belong on a request stream each close that connection
//!   with the matching code and reason (the out-of-range row gets an error
//!   reply instead: the frame itself was sound); a stranger's oversized first frame
//!   is refused before authentication; the worker's peak memory grows by
//!   less than 32 MiB, and it still serves a generation afterwards.
//! - `a_worker_holding_another_model_is_refused_by_fingerprint`: alone, the
//!   coordinator fails with one line saying "different model"; next to a
//!   good worker it is left out with a warning and the run succeeds.
//! - `many_coordinators_share_workers_safely`: three coordinator processes
//!   at once on the same two workers all get the reference ids.

mod cluster_support;

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use charm_proto::frame::encode;
use charm_proto::{Auth, ErrorKind, ExpertBatch, ExpertGroup, Message, Role, RunExperts};
use charm_tests::{fixture, Reference};
use charm_worker::net::fingerprint::model_fingerprint;
use charm_worker::net::{handshake, tls, ClusterKey};
use cluster_support::*;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// A QUIC + TLS connection to a worker, without the charm handshake.
async fn raw(addr: SocketAddr) -> quinn::Connection {
    let ep = tls::client_endpoint("127.0.0.1:0".parse().unwrap()).unwrap();
    ep.connect(addr, tls::SERVER_NAME).unwrap().await.unwrap()
}

/// Sends `bytes` on a new stream and returns how the worker closed the
/// connection: (error code, reason).
async fn send_and_get_closed(conn: &quinn::Connection, bytes: &[u8]) -> (u32, String) {
    let (mut send, _recv) = conn.open_bi().await.unwrap();
    let _ = send.write_all(bytes).await;
    let _ = send.finish();
    closed(conn).await
}

async fn closed(conn: &quinn::Connection) -> (u32, String) {
    match tokio::time::timeout(Duration::from_secs(10), conn.closed()).await {
        Ok(quinn::ConnectionError::ApplicationClosed(c)) => (
            c.error_code.into_inner() as u32,
            String::from_utf8_lossy(&c.reason).into_owned(),
        ),
        Ok(other) => panic!("closed without a reason: {other}"),
        Err(_) => panic!("the worker did not close the connection"),
    }
}

#[test]
fn strangers_are_refused_while_the_cluster_keeps_working() {
    let dir = fixture("olmoe");
    let r = Reference::load("olmoe");
    let tmp = tempfile::tempdir().unwrap();
    let key = keygen(tmp.path(), "cluster.key");
    let other_key = keygen(tmp.path(), "other.key");
    let mut w1 = Worker::start(&dir, &key, &[]);
    let mut w2 = Worker::start(&dir, &key, &[]);
    let stranger = Worker::start(&dir, &other_key, &[]);

    // UDP garbage: not even QUIC. Dropped without a word.
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    for i in 0..50u8 {
        udp.send_to(&[i; 200], w1.addr).unwrap();
    }
    let rt = rt();
    let fp = model_fingerprint(&dir).unwrap();
    rt.block_on(async {
        // QUIC, then an HTTP request instead of the handshake.
        let conn = raw(w1.addr).await;
        let (code, reason) = send_and_get_closed(&conn, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert_eq!(code, ErrorKind::Malformed.code(), "{reason}");
        assert!(reason.contains("not a charm frame"), "{reason}");
        // A well-formed Auth whose proof was made with another key.
        let conn = raw(w2.addr).await;
        let secret = handshake::session_secret(&conn).unwrap();
        let wrong = ClusterKey::load(&other_key).unwrap().proof(Role::Coordinator, &secret);
        let frame = encode(&Message::Auth(Auth {
            role: Role::Coordinator,
            proof: wrong,
            fingerprint: fp.clone(),
        }))
        .unwrap();
        let (code, reason) = send_and_get_closed(&conn, &frame).await;
        assert_eq!(code, ErrorKind::Unauthenticated.code(), "{reason}");
        assert!(reason.contains("cluster key"), "{reason}");
    });
    assert!(w1
        .wait_log("not a charm frame", Duration::from_secs(5))
        .contains("refused"));
    assert!(w2
        .wait_log("cluster key", Duration::from_secs(5))
        .contains("cluster key proof did not verify"));

    let specs = format!("{},{},{}", w1.spec(), w2.spec(), stranger.spec());
    let out = coordinator(&[
        "--model",
        dir.to_str().unwrap(),
        "--cluster-key-file",
        key.to_str().unwrap(),
        "--workers",
        &specs,
        "--min-workers",
        "2",
        "generate",
        "--prompt-ids",
        &csv(&r.prompt_ids),
        "--max-tokens",
        "16",
        "--ignore-eos",
        "--json",
    ]);
    let v = json_out(&out);
    assert_eq!(json_ids(&v), r.greedy_ids);
    let used: Vec<&str> = v["stats"]["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["address"].as_str().unwrap())
        .collect();
    assert_eq!(used.len(), 2, "{used:?}");
    assert!(!used.contains(&stranger.spec().as_str()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The stranger may not have been reached before the run ended; when it
    // was, the refusal names it and the key.
    if stderr.contains(&format!("refused worker {}", stranger.spec())) {
        assert!(stderr.contains("cluster key"), "{stderr}");
        assert!(stranger.log().contains("cluster key proof did not verify"));
    }
    assert!(w1.alive() && w2.alive());

    // Asked for three workers, the coordinator names why it has two.
    let out = coordinator(&[
        "--model",
        dir.to_str().unwrap(),
        "--cluster-key-file",
        key.to_str().unwrap(),
        "--workers",
        &specs,
        "--min-workers",
        "3",
        "--discovery-timeout-s",
        "3",
        "generate",
        "--prompt-ids",
        "1",
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.starts_with("error: 2 of 3 workers usable"), "{stderr}");
    assert!(
        last.contains(&stranger.spec()) && last.contains("cluster key"),
        "{last}"
    );
    assert!(stranger
        .wait_log("cluster key proof did not verify", Duration::from_secs(5))
        .contains("refused"));
}

#[test]
fn malformed_and_oversized_frames_close_only_that_connection() {
    let dir = fixture("olmoe");
    let r = Reference::load("olmoe");
    let tmp = tempfile::tempdir().unwrap();
    let key_path = keygen(tmp.path(), "cluster.key");
    let key = ClusterKey::load(&key_path).unwrap();
    let mut w = Worker::start(&dir, &key_path, &[]);
    let fp = model_fingerprint(&dir).unwrap();
    let rss_before = w.peak_rss_kib();
    let rt = rt();
    rt.block_on(async {
        let ep = tls::client_endpoint("127.0.0.1:0".parse().unwrap()).unwrap();
        let authed = || async {
            let (conn, hello) = handshake::connect(&ep, w.addr, &key, &fp).await.unwrap();
            assert_eq!(hello.fingerprint, fp);
            conn
        };
        let good = encode(&Message::RunExperts(RunExperts {
            step: 1,
            batch: ExpertBatch {
                layer: 0,
                hidden: 64,
                rows: vec![0.5; 64],
                groups: vec![ExpertGroup {
                    expert: 3,
                    rows: vec![0],
                    weights: vec![1.0],
                }],
                next: None,
            },
        }))
        .unwrap();

        // 1 GiB announced: refused from the header, nothing buffered.
        let conn = authed().await;
        let mut huge = good[..12].to_vec();
        huge[8..12].copy_from_slice(&(1u32 << 30).to_le_bytes());
        huge.extend_from_slice(&[0u8; 4096]);
        let (code, reason) = send_and_get_closed(&conn, &huge).await;
        assert_eq!(code, ErrorKind::TooLarge.code(), "{reason}");
        assert!(reason.contains("exceeds the limit"), "{reason}");

        // Another protocol version, refused by number.
        let conn = authed().await;
        let mut v9 = good.clone();
        v9[4] = 9;
        let (code, reason) = send_and_get_closed(&conn, &v9).await;
        assert_eq!(code, ErrorKind::UnsupportedVersion.code(), "{reason}");
        assert!(reason.contains("version 9"), "{reason}");

        // A request naming a row it does not carry: an error reply for that
        // request only (tests/cluster_hostile.rs checks the connection lives).
        let conn = authed().await;
        let bad_row = encode(&Message::RunExperts(RunExperts {
            step: 2,
            batch: ExpertBatch {
                layer: 0,
                hidden: 64,
                rows: vec![0.5; 64],
                groups: vec![ExpertGroup {
                    expert: 3,
                    rows: vec![7],
                    weights: vec![1.0],
                }],
                next: None,
            },
        }))
        .unwrap();
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        send.write_all(&bad_row).await.unwrap();
        send.finish().unwrap();
        let (reply, _) = charm_worker::net::frames::read_frame(&mut recv, charm_proto::MAX_FRAME_LEN)
            .await
            .unwrap();
        let Message::Error(e) = reply else {
            panic!("expected an Error reply, got {reply:?}")
        };
        assert_eq!(e.kind, ErrorKind::Malformed);
        assert!(
            e.message.contains("invalid RunExperts") && e.message.contains("row 7"),
            "{e:?}"
        );

        // A message that has no business on a request stream.
        let conn = authed().await;
        let auth_again = encode(&Message::Auth(Auth {
            role: Role::Coordinator,
            proof: [0; 32],
            fingerprint: fp.clone(),
        }))
        .unwrap();
        let (code, reason) = send_and_get_closed(&conn, &auth_again).await;
        assert_eq!(code, ErrorKind::Malformed.code(), "{reason}");
        assert!(reason.contains("unexpected Auth"), "{reason}");

        // Before authentication the limit is 64 KiB.
        let conn = raw(w.addr).await;
        let mut big_auth = encode(&Message::Auth(Auth {
            role: Role::Coordinator,
            proof: [0; 32],
            fingerprint: fp.clone(),
        }))
        .unwrap();
        big_auth[8..12].copy_from_slice(&(100u32 << 10).to_le_bytes());
        let (code, reason) = send_and_get_closed(&conn, &big_auth).await;
        assert_eq!(code, ErrorKind::TooLarge.code(), "{reason}");
        assert!(reason.contains("65536"), "{reason}");

        // A good request on a good connection is answered.
        let conn = authed().await;
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        send.write_all(&good).await.unwrap();
        send.finish().unwrap();
        let (reply, _) = charm_worker::net::frames::read_frame(&mut recv, charm_proto::MAX_FRAME_LEN)
            .await
            .unwrap();
        let Message::ExpertsOut(out) = reply else {
            panic!("expected ExpertsOut, got {reply:?}")
        };
        assert_eq!(out.step, 1);
        assert_eq!(out.outputs.groups[0].out.len(), 64);
    });
    assert!(w.alive(), "the worker survived");
    let grew = w.peak_rss_kib().saturating_sub(rss_before);
    assert!(grew < 32 << 10, "peak memory grew by {grew} KiB");
    let log = w.log();
    assert!(log.contains("closing the connection from"), "{log}");

    // And it still serves a whole generation.
    let svc = service(&dir, &key_path, &[w.addr], Duration::from_secs(10), false);
    svc.wait_for_workers(1, Duration::from_secs(10)).unwrap();
    assert_eq!(greedy(&engine(&dir, svc), &r.prompt_ids, 16), r.greedy_ids);
}

#[test]
fn a_worker_holding_another_model_is_refused_by_fingerprint() {
    let tmp = tempfile::tempdir().unwrap();
    let key = keygen(tmp.path(), "cluster.key");
    let olmoe = fixture("olmoe");
    let r = Reference::load("olmoe");
    let mixtral = Worker::start(&fixture("mixtral"), &key, &[]);
    let (d, k) = (olmoe.to_str().unwrap(), key.to_str().unwrap());
    let out = coordinator(&[
        "--model",
        d,
        "--cluster-key-file",
        k,
        "--workers",
        &mixtral.spec(),
        "--discovery-timeout-s",
        "3",
        "generate",
        "--prompt-ids",
        "1,2,3",
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.starts_with("error: 0 of 1 workers usable"), "{stderr}");
    assert!(
        last.contains("different model") && last.contains(&mixtral.spec()),
        "{last}"
    );
    assert!(!stderr.contains("panicked"));
    assert!(mixtral
        .wait_log("different model", Duration::from_secs(5))
        .contains("this worker holds a different model"));

    let good = Worker::start(&olmoe, &key, &[]);
    let out = coordinator(&[
        "--model",
        d,
        "--cluster-key-file",
        k,
        "--workers",
        &format!("{},{}", mixtral.spec(), good.spec()),
        "generate",
        "--prompt-ids",
        &csv(&r.prompt_ids),
        "--max-tokens",
        "16",
        "--ignore-eos",
        "--json",
    ]);
    let v = json_out(&out);
    assert_eq!(json_ids(&v), r.greedy_ids);
    let ws = v["stats"]["workers"].as_array().unwrap();
    assert_eq!(ws.len(), 1);
    assert_eq!(ws[0]["address"], good.spec().as_str());
}

#[test]
fn many_coordinators_share_workers_safely() {
    let dir = fixture("olmoe");
    let r = Reference::load("olmoe");
    let tmp = tempfile::tempdir().unwrap();
    let key = keygen(tmp.path(), "cluster.key");
    let a = Worker::start(&dir, &key, &[]);
    let b = Worker::start(&dir, &key, &[]);
    let specs = format!("{},{}", a.spec(), b.spec());
    let p = csv(&r.prompt_ids);
    let runs: Vec<_> = (0..3)
        .map(|_| {
            std::process::Command::new(bin("coordinator"))
                .arg("--model")
                .arg(&dir)
                .arg("--cluster-key-file")
                .arg(&key)
                .args([
                    "--workers",
                    &specs,
                    "--min-workers",
                    "2",
                    "generate",
                    "--prompt-ids",
                    &p,
                ])
                .args(["--max-tokens", "16", "--ignore-eos", "--json"])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in runs {
        let out = child.wait_with_output().unwrap();
        assert_eq!(json_ids(&json_out(&out)), r.greedy_ids);
    }
    let log = a.log();
    assert_eq!(log.matches("connected").count(), 3, "{log}");
}
