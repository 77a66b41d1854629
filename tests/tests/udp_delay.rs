//! The benchmark's UDP delay line (`udp-delay`, used by
//! `scripts/bench_cluster.sh` where the kernel has no netem): it forwards
//! both ways, adds its delay each way, and refuses bad arguments.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_udp-delay");

/// A running helper, killed on drop.
struct Helper(Child);

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `udp-delay ARGS` and returns it with the address its first line ends with.
fn start(args: &[&str]) -> (Helper, SocketAddr) {
    let mut child = Command::new(BIN)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("udp-delay starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    // "echoing on ADDR" / "relaying ADDR <-> ..."
    let addr = line
        .split_whitespace()
        .find_map(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    (Helper(child), addr)
}

#[test]
fn relay_forwards_both_ways_after_its_delay() {
    let (_echo, echo) = start(&["echo", "--listen", "127.0.0.1:0"]);
    let echo_s = echo.to_string();
    let (_relay, relay) = start(&["relay", "--listen", "127.0.0.1:0", "--to", &echo_s, "--delay-ms", "20"]);
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 2048];
    for size in [1usize, 1200, 2000] {
        let msg: Vec<u8> = (0..size).map(|i| (i * 7 + size) as u8).collect();
        let t = Instant::now();
        sock.send_to(&msg, relay).unwrap();
        let (n, from) = sock.recv_from(&mut buf).expect("an answer through the relay");
        let rtt = t.elapsed();
        assert_eq!(from, relay, "answers come back from the relay");
        assert_eq!(&buf[..n], &msg[..], "datagram of {size} bytes unchanged");
        // 20 ms out and 20 ms back, at least.
        assert!(rtt >= Duration::from_millis(40), "round trip {rtt:?} < 2 × 20 ms");
    }

    // `ping` through the relay reports at least the two delays.
    let relay_s = relay.to_string();
    let out = Command::new(BIN)
        .args(["ping", "--to", &relay_s, "--count", "5"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let median: f64 = text
        .split_whitespace()
        .nth(2)
        .and_then(|v| v.parse().ok())
        .expect(&text);
    assert!(median >= 40.0, "{text}");
}

#[test]
fn bad_arguments_are_refused_with_one_line() {
    for args in [
        &[
            "relay",
            "--listen",
            "127.0.0.1:0",
            "--to",
            "127.0.0.1:9",
            "--delay-ms=-1",
        ][..],
        &[
            "relay",
            "--listen",
            "127.0.0.1:0",
            "--to",
            "127.0.0.1:9",
            "--delay-ms=NaN",
        ][..],
        &["ping", "--to", "127.0.0.1:9", "--count", "0"][..],
    ] {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert!(err.starts_with("udp-delay: ") && err.lines().count() == 1, "{err}");
    }
}
