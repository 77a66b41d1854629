//! `udp-delay`: a userspace delay line for UDP, for benchmarks on kernels
//! without `sch_netem` (the project's VMs). `scripts/bench_cluster.sh`
//! puts one in front of each worker of its emulated LAN.
//!
//! ```text
//! udp-delay relay --listen ADDR --to ADDR --delay-ms D
//! udp-delay echo --listen ADDR
//! udp-delay ping --to ADDR [--count N]
//! ```
//!
//! - `relay` forwards every datagram that reaches `--listen` to `--to`, and
//!   every answer from `--to` back to the peer that last sent one, each
//!   `--delay-ms` after it arrived, in arrival order: a round trip through
//!   the relay gains 2 × D. One peer at a time (a coordinator and its
//!   worker); rate limits are left to the kernel (`tc ... tbf`).
//! - `echo` answers every datagram with itself.
//! - `ping` sends `--count` small datagrams one after another and prints the
//!   median and minimum round trip in ms (the relay's own cost included,
//!   when pinging an echo server behind a relay).
//!
//! Each direction has one thread that receives (stamping the arrival time)
//! and one that sends when the stamp plus the delay is due (timer slack 1
//! µs, so a 0.1 ms delay is not rounded up to the kernel's default 50 µs
//! slack on top).

use std::net::{SocketAddr, UdpSocket};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "udp-delay", about = "A UDP delay line, echo server and ping for benchmarks")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Forwards datagrams between a peer and `--to`, each after the delay.
    Relay {
        #[arg(long)]
        listen: SocketAddr,
        #[arg(long)]
        to: SocketAddr,
        /// Delay added to each datagram, each way, in ms.
        #[arg(long)]
        delay_ms: f64,
    },
    /// Answers every datagram with itself.
    Echo {
        #[arg(long)]
        listen: SocketAddr,
    },
    /// Measures round trips to an echo server.
    Ping {
        #[arg(long)]
        to: SocketAddr,
        #[arg(long, default_value_t = 200)]
        count: usize,
    },
}

/// Largest UDP payload.
const MAX_DATAGRAM: usize = 65_535;

fn main() {
    if let Err(e) = run(Cli::parse()) {
        eprintln!("udp-delay: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Relay { listen, to, delay_ms } => {
            if !(delay_ms.is_finite() && delay_ms >= 0.0) {
                bail!("--delay-ms must be 0 or more, got {delay_ms}");
            }
            relay(listen, to, Duration::from_secs_f64(delay_ms / 1e3))
        }
        Cmd::Echo { listen } => echo(listen),
        Cmd::Ping { to, count } => ping(to, count),
    }
}

fn bind(addr: SocketAddr) -> Result<UdpSocket> {
    UdpSocket::bind(addr).with_context(|| format!("binding {addr}"))
}

/// Where a delayed datagram goes.
#[derive(Clone, Copy)]
enum Dest {
    /// The fixed upstream address.
    Fixed(SocketAddr),
    /// The peer that last sent to the listening socket.
    LastPeer,
}

fn relay(listen: SocketAddr, to: SocketAddr, delay: Duration) -> Result<()> {
    let front = bind(listen)?;
    let any: SocketAddr = if to.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" }.parse()?;
    let back = bind(any)?;
    let peer: Arc<Mutex<Option<SocketAddr>>> = Arc::new(Mutex::new(None));
    println!(
        "relaying {} <-> {to} with {} ms each way",
        front.local_addr()?,
        delay.as_secs_f64() * 1e3
    );

    let (to_back, back_queue) = channel();
    let (to_front, front_queue) = channel();
    let threads = [
        spawn_receiver(front.try_clone()?, to_back, Some(peer.clone())),
        spawn_sender(back.try_clone()?, back_queue, delay, Dest::Fixed(to), peer.clone()),
        spawn_receiver(back, to_front, None),
        spawn_sender(front, front_queue, delay, Dest::LastPeer, peer),
    ];
    for t in threads {
        t.join().map_err(|_| anyhow::anyhow!("a relay thread panicked"))??;
    }
    Ok(())
}

type Datagram = (Instant, Vec<u8>);

/// Receives datagrams on `sock`, stamps them and queues them; remembers the
/// sender in `peer` when given.
fn spawn_receiver(
    sock: UdpSocket,
    queue: Sender<Datagram>,
    peer: Option<Arc<Mutex<Option<SocketAddr>>>>,
) -> std::thread::JoinHandle<Result<()>> {
    std::thread::spawn(move || {
        let mut buf = vec![0u8; MAX_DATAGRAM];
        loop {
            let (n, from) = sock.recv_from(&mut buf).context("receiving")?;
            let at = Instant::now();
            if let Some(p) = &peer {
                *p.lock().unwrap_or_else(|e| e.into_inner()) = Some(from);
            }
            if queue.send((at, buf[..n].to_vec())).is_err() {
                return Ok(());
            }
        }
    })
}

/// Sends each queued datagram when its arrival plus `delay` is due.
fn spawn_sender(
    sock: UdpSocket,
    queue: Receiver<Datagram>,
    delay: Duration,
    dest: Dest,
    peer: Arc<Mutex<Option<SocketAddr>>>,
) -> std::thread::JoinHandle<Result<()>> {
    std::thread::spawn(move || {
        precise_sleeps();
        for (at, data) in queue {
            let due = at + delay;
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            let to = match dest {
                Dest::Fixed(a) => a,
                Dest::LastPeer => match *peer.lock().unwrap_or_else(|e| e.into_inner()) {
                    Some(a) => a,
                    None => continue,
                },
            };
            // A full socket buffer or an unreachable peer drops the
            // datagram, as a link would; QUIC retransmits.
            let _ = sock.send_to(&data, to);
        }
        Ok(())
    })
}

/// Sets this thread's timer slack to 1 µs (Linux; elsewhere a no-op).
fn precise_sleeps() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_TIMERSLACK takes one unsigned long argument and
    // touches no memory of ours.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong);
    }
}

fn echo(listen: SocketAddr) -> Result<()> {
    let sock = bind(listen)?;
    println!("echoing on {}", sock.local_addr()?);
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let (n, from) = sock.recv_from(&mut buf).context("receiving")?;
        let _ = sock.send_to(&buf[..n], from);
    }
}

fn ping(to: SocketAddr, count: usize) -> Result<()> {
    if count == 0 {
        bail!("--count must be at least 1");
    }
    let any: SocketAddr = if to.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" }.parse()?;
    let sock = bind(any)?;
    sock.connect(to).with_context(|| format!("connecting to {to}"))?;
    sock.set_read_timeout(Some(Duration::from_secs(1)))?;
    let mut rtts = Vec::with_capacity(count);
    let mut buf = [0u8; 64];
    for i in 0..count as u64 {
        let t = Instant::now();
        sock.send(&i.to_le_bytes()).context("sending")?;
        // Skip late answers to earlier pings.
        loop {
            let n = sock
                .recv(&mut buf)
                .with_context(|| format!("no answer from {to} within 1 s"))?;
            if n == 8 && buf[..8] == i.to_le_bytes() {
                break;
            }
        }
        rtts.push(t.elapsed().as_secs_f64() * 1e3);
        std::thread::sleep(Duration::from_millis(2));
    }
    rtts.sort_by(f64::total_cmp);
    println!("rtt_ms median {:.4} min {:.4} n {}", rtts[count / 2], rtts[0], count);
    Ok(())
}
