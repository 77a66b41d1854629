//! What a hostile or broken peer can cost a worker: nothing but an error
//! reply, and nothing at all before it proves the cluster key.
//!
//! - `an_invalid_request_is_refused_and_the_connection_serves_on`: a row
//!   repeated in a group, an expert id beyond the model, more routes than
//!   top-k allows, a row the batch does not carry and an expert the worker
//!   does not hold each get an `Error` reply for that request only; the
//!   same connection then gets a good request answered.
//! - `strangers_get_nothing_before_the_key_proof` (the flood test): 200
//!   unauthenticated QUIC connections, half of them trying to push
//!   megabytes before any proof, while a keyed coordinator generates: its
//!   ids are the reference ones, a new keyed coordinator still connects
//!   during the flood, every silent stranger is closed for not
//!   authenticating within the handshake timeout (every pushing one for its
//!   malformed first frame), and the worker's peak RSS grows by less than
//!   32 MiB.
//! - `half_open_connections_beyond_the_cap_are_refused`: an in-process
//!   server allowing 2 unauthenticated connections refuses the third before
//!   its handshake, and takes new ones once the first two timed out.

mod cluster_support;

use std::net::SocketAddr;
use std::time::Duration;

use charm_proto::frame::encode;
use charm_proto::{ErrorKind, ExpertBatch, ExpertGroup, Message, RunExperts, MAX_FRAME_LEN};
use charm_tests::{fixture, Reference};
use charm_worker::net::fingerprint::model_fingerprint;
use charm_worker::net::frames::read_frame;
use charm_worker::net::{handshake, tls, ClusterKey};
use cluster_support::*;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The olmoe fixture's width.
const HIDDEN: u32 = 64;

fn request(step: u64, n_rows: usize, groups: Vec<(u32, Vec<u32>)>) -> Vec<u8> {
    encode(&Message::RunExperts(RunExperts {
        step,
        batch: ExpertBatch {
            layer: 0,
            hidden: HIDDEN,
            rows: vec![0.25; n_rows * HIDDEN as usize],
            groups: groups
                .into_iter()
                .map(|(expert, rows)| ExpertGroup {
                    expert,
                    weights: vec![0.5; rows.len()],
                    rows,
                })
                .collect(),
            next: None,
        },
    }))
    .unwrap()
}

/// Sends one request on a new stream of `conn` and returns the reply.
async fn ask(conn: &quinn::Connection, frame: &[u8]) -> Message {
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    send.write_all(frame).await.unwrap();
    send.finish().unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), read_frame(&mut recv, MAX_FRAME_LEN)).await;
    got.expect("an answer in time").expect("a reply frame").0
}

#[test]
fn an_invalid_request_is_refused_and_the_connection_serves_on() {
    let tmp = tempfile::tempdir().unwrap();
    let key_path = keygen(tmp.path(), "cluster.key");
    let key = ClusterKey::load(&key_path).unwrap();
    let full = convert_bf16(&fixture("olmoe"), tmp.path(), "olmoe-bf16");
    // Holds every expert but layer 0's expert 5.
    let part = partial_container(&full, tmp.path(), "part", |l, e| !(l == 0 && e == 5));
    let w = Worker::start(&part, &key_path, &[]);
    let fp = model_fingerprint(&part).unwrap();
    rt().block_on(async {
        let ep = tls::client_endpoint("127.0.0.1:0".parse().unwrap()).unwrap();
        let (conn, _) = handshake::connect(&ep, w.addr, &key, &fp).await.unwrap();
        let bad = [
            ("row 1 appears twice", request(1, 2, vec![(3, vec![1, 0, 1])])),
            ("expert 8 out of range", request(2, 1, vec![(8, vec![0])])),
            ("expert 999 out of range", request(3, 1, vec![(999, vec![0])])),
            (
                "more than 2 experts per row",
                request(4, 1, vec![(1, vec![0]), (2, vec![0]), (3, vec![0])]),
            ),
            ("row 7 out of range", request(5, 1, vec![(3, vec![7])])),
            ("does not hold layer 0 expert 5", request(6, 1, vec![(5, vec![0])])),
        ];
        for (why, frame) in &bad {
            match ask(&conn, frame).await {
                Message::Error(e) => {
                    assert!(e.message.contains(why), "{why}: {e:?}");
                    assert!(matches!(e.kind, ErrorKind::Malformed | ErrorKind::Failed), "{e:?}");
                }
                other => panic!("{why}: expected an Error reply, got {other:?}"),
            }
        }
        // The same connection still serves, and the expert next to the
        // missing one is not stuck behind a read that was never sent.
        match ask(&conn, &request(7, 2, vec![(4, vec![0, 1]), (6, vec![1])])).await {
            Message::ExpertsOut(o) => {
                assert_eq!(o.step, 7);
                assert_eq!(o.outputs.groups.len(), 2);
            }
            other => panic!("expected ExpertsOut, got {other:?}"),
        }
        assert!(conn.close_reason().is_none(), "the connection lives");
    });
    assert!(w.log().contains("refused a request") || w.log().contains("failed"));
}

#[test]
fn strangers_get_nothing_before_the_key_proof() {
    let dir = fixture("olmoe");
    let r = Reference::load("olmoe");
    let tmp = tempfile::tempdir().unwrap();
    let key_path = keygen(tmp.path(), "cluster.key");
    let key = ClusterKey::load(&key_path).unwrap();
    let w = Worker::start(&dir, &key_path, &[]);
    let fp = model_fingerprint(&dir).unwrap();

    // Warm up: one keyed generation, so the baseline holds what serving costs.
    let svc = service(&dir, &key_path, &[w.addr], Duration::from_secs(10), false);
    svc.wait_for_workers(1, Duration::from_secs(10)).unwrap();
    let e = engine(&dir, svc.clone());
    assert_eq!(greedy(&e, &r.prompt_ids, 16), r.greedy_ids);
    let rss_before = w.peak_rss_kib();

    let addr: SocketAddr = w.addr;
    let mut auth_header = encode(&Message::Auth(charm_proto::Auth {
        role: charm_proto::Role::Coordinator,
        proof: [0; 32],
        fingerprint: fp.clone(),
    }))
    .unwrap()[..charm_proto::HEADER_LEN]
        .to_vec();
    auth_header[8..12].copy_from_slice(&(60u32 << 10).to_le_bytes());
    let rt = rt();
    let flood = rt.spawn(async move {
        let ep = tls::client_endpoint("127.0.0.1:0".parse().unwrap()).unwrap();
        let mut tasks = Vec::new();
        for i in 0..200 {
            let (ep, auth_header) = (ep.clone(), auth_header.clone());
            tasks.push(tokio::spawn(async move {
                let conn = ep.connect(addr, tls::SERVER_NAME).unwrap().await.ok()?;
                // Half of them try to push 4 MiB before any proof, behind a
                // header announcing an Auth frame just under the handshake
                // limit: the worker reads at most that frame (flow control
                // holds the rest back) and closes it as malformed.
                if i % 2 == 0 {
                    if let Ok((mut send, _recv)) = conn.open_bi().await {
                        let mut junk = auth_header.clone();
                        junk.resize(4 << 20, 0);
                        let _ = tokio::time::timeout(Duration::from_secs(4), send.write_all(&junk)).await;
                    }
                }
                let closed = tokio::time::timeout(Duration::from_secs(10), conn.closed()).await;
                Some((i % 2 == 0, closed.ok()))
            }));
        }
        let mut codes = Vec::new();
        for t in tasks {
            codes.push(t.await.unwrap());
        }
        codes
    });

    // Meanwhile: the running coordinator generates, and a new one connects.
    std::thread::sleep(Duration::from_millis(200));
    for _ in 0..3 {
        assert_eq!(greedy(&e, &r.prompt_ids, 16), r.greedy_ids);
    }
    rt.block_on(async {
        let ep = tls::client_endpoint("127.0.0.1:0".parse().unwrap()).unwrap();
        let joined = tokio::time::timeout(Duration::from_secs(5), handshake::connect(&ep, addr, &key, &fp)).await;
        let (conn, hello) = joined.expect("a keyed coordinator is served during the flood").unwrap();
        assert_eq!(hello.fingerprint, fp);
        conn.close(0u32.into(), b"done");
    });

    let codes = rt.block_on(flood).unwrap();
    let reached: Vec<_> = codes.iter().flatten().collect();
    assert!(
        reached.len() >= 100,
        "most strangers got a QUIC connection: {}",
        reached.len()
    );
    for (pushed, c) in &reached {
        match c {
            Some(quinn::ConnectionError::ApplicationClosed(a)) => {
                let code = a.error_code.into_inner() as u32;
                // A stranger that pushed bytes is closed for them (not a
                // proof), or, when the worker's machine is loaded enough that
                // its 2 s proof window ends first, for the missing proof.
                let want: &[ErrorKind] = if *pushed {
                    &[ErrorKind::Malformed, ErrorKind::Timeout]
                } else {
                    &[ErrorKind::Timeout]
                };
                assert!(want.iter().any(|k| k.code() == code), "{a:?}");
            }
            other => panic!("a stranger was not closed for its missing proof: {other:?}"),
        }
    }
    let grew = w.peak_rss_kib().saturating_sub(rss_before);
    assert!(grew < 32 << 10, "peak memory grew by {grew} KiB");
    assert_eq!(greedy(&e, &r.prompt_ids, 16), r.greedy_ids);
}

#[test]
fn half_open_connections_beyond_the_cap_are_refused() {
    use charm_worker::net::served::{ServeOptions, Served};
    use charm_worker::server::{run, ServerOptions};
    let dir = fixture("olmoe");
    let served = std::sync::Arc::new(Served::open(&dir, &ServeOptions::default()).unwrap());
    let rt = rt();
    rt.block_on(async {
        let endpoint = tls::server_endpoint("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = endpoint.local_addr().unwrap();
        let mut opts = ServerOptions::new(ClusterKey::generate());
        opts.max_half_open = 2;
        opts.handshake_timeout = Duration::from_millis(500);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(run(endpoint, served, opts, async {
            let _ = stopped.await;
        }));
        let ep = tls::client_endpoint("127.0.0.1:0".parse().unwrap()).unwrap();
        let knock = || async { ep.connect(addr, tls::SERVER_NAME).unwrap().await };
        let a = knock().await.expect("first half-open slot");
        let b = knock().await.expect("second half-open slot");
        match knock().await {
            Err(quinn::ConnectionError::ConnectionClosed(c)) => {
                assert_eq!(c.error_code, quinn::TransportErrorCode::CONNECTION_REFUSED, "{c:?}")
            }
            other => panic!("a third stranger was let in: {other:?}"),
        }
        // Both silent ones are closed at the handshake timeout; then there
        // is room again.
        for c in [a, b] {
            let why = tokio::time::timeout(Duration::from_secs(5), c.closed()).await.unwrap();
            assert!(matches!(why, quinn::ConnectionError::ApplicationClosed(_)), "{why:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        knock().await.expect("room again after the timeouts");
        let _ = stop.send(());
        let _ = server.await;
    });
}
