//! QUIC endpoints with TLS 1.3. A worker presents a fresh self-signed
//! certificate (rcgen); the coordinator accepts any certificate but checks
//! the handshake signature made with it, so the session is a real TLS
//! session with the worker's key. Who the peer *is* is settled afterwards by
//! the cluster-key proofs (see [`super::key`]), which are bound to this
//! session's exported secret: a man in the middle would hold two different
//! sessions and could forward neither proof.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{Endpoint, TransportConfig, VarInt};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

use super::NetError;

/// ALPN protocol id: the protocol name and version.
pub const ALPN: &[u8] = b"charm/1";
/// Server name the coordinator asks for (certificates are not checked by name).
pub const SERVER_NAME: &str = "charm-worker";
/// A connection with no traffic for this long is closed. Sized for a LAN:
/// with keep-alives every [`KEEP_ALIVE`], a peer that was killed, stopped
/// or cut off is noticed within this time even when no request is waiting
/// on it (requests waiting on it are re-sent much sooner: see the
/// coordinator's hedging).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(4);
/// Keep-alive interval, well inside [`IDLE_TIMEOUT`].
pub const KEEP_ALIVE: Duration = Duration::from_millis(1000);
/// Flow-control credit a peer has before it proved the cluster key: room
/// for the handshake's small frames, nothing more, so a stranger cannot make
/// us buffer more than this per connection.
pub const PRE_AUTH_WINDOW: u32 = 16 << 10;
/// Flow-control credit of an authenticated connection: room for a prefill
/// chunk's activations or outputs in flight.
pub const RECEIVE_WINDOW: u32 = 64 << 20;
/// Per-stream credit (bounded by the connection's, so strangers get at
/// most [`PRE_AUTH_WINDOW`] in all).
pub const STREAM_WINDOW: u32 = 16 << 20;
/// UDP receive (and send) buffer an endpoint asks for. A layer's replies
/// arrive as one burst from every worker at once (a decode step's 32 KiB
/// per worker is two dozen datagrams; a prefill chunk's are megabytes),
/// and Linux's default of 208 KiB holds only about fifty loopback
/// datagrams (each is charged its buffer's true size): on a busy box the
/// overflow was dropped datagrams every decode step, each costing the
/// reply a loss timer and a resend. The kernel caps the request at
/// `net.core.rmem_max` (`wmem_max`), so this is a ceiling, not a demand.
pub const SOCKET_BUFFER: usize = 8 << 20;
/// Streams a peer may have open at once, each way.
pub const MAX_STREAMS: u32 = 64;

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn tls_err(e: impl std::fmt::Display) -> NetError {
    NetError::Tls(e.to_string())
}

/// Transport settings before authentication: a worker accepts one stream
/// (the handshake's) and a coordinator none (workers never open streams);
/// both grant only [`PRE_AUTH_WINDOW`] of credit. [`grant`] opens up an
/// authenticated connection.
fn transport(server: bool) -> Arc<TransportConfig> {
    let mut t = TransportConfig::default();
    t.max_idle_timeout(Some(IDLE_TIMEOUT.try_into().expect("4 s is a valid idle timeout")))
        .keep_alive_interval(Some(KEEP_ALIVE))
        .max_concurrent_bidi_streams(VarInt::from_u32(u32::from(server)))
        .max_concurrent_uni_streams(VarInt::from_u32(0))
        .stream_receive_window(VarInt::from_u32(STREAM_WINDOW))
        .receive_window(VarInt::from_u32(PRE_AUTH_WINDOW))
        .send_window(u64::from(RECEIVE_WINDOW));
    Arc::new(t)
}

/// Gives an authenticated peer its full credit: [`RECEIVE_WINDOW`], and on
/// a worker ([`server`] true) [`MAX_STREAMS`] streams each way.
pub fn grant(conn: &quinn::Connection, server: bool) {
    conn.set_receive_window(VarInt::from_u32(RECEIVE_WINDOW));
    if server {
        conn.set_max_concurrent_bi_streams(VarInt::from_u32(MAX_STREAMS));
        conn.set_max_concurrent_uni_streams(VarInt::from_u32(MAX_STREAMS));
    }
}

/// A server endpoint on `addr` with a fresh self-signed certificate.
pub fn server_endpoint(addr: SocketAddr) -> Result<Endpoint, NetError> {
    let cert = rcgen::generate_simple_self_signed(vec![SERVER_NAME.to_string()]).map_err(tls_err)?;
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cert.signing_key.serialize_der()));
    let mut tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls_err)?
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)
        .map_err(tls_err)?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(QuicServerConfig::try_from(tls).map_err(tls_err)?));
    config.transport_config(transport(true));
    // Data of connections not yet accepted: a few datagrams each, bounded.
    config
        .max_incoming(4096)
        .incoming_buffer_size(64 << 10)
        .incoming_buffer_size_total(4 << 20);
    let socket = udp_socket(addr).map_err(|source| NetError::Bind { addr, source })?;
    Endpoint::new(
        quinn::EndpointConfig::default(),
        Some(config),
        socket,
        Arc::new(quinn::TokioRuntime),
    )
    .map_err(|source| NetError::Bind { addr, source })
}

/// A client endpoint bound to `bind` (port 0: any).
pub fn client_endpoint(bind: SocketAddr) -> Result<Endpoint, NetError> {
    let mut tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls_err)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider())))
        .with_no_client_auth();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let mut config = quinn::ClientConfig::new(Arc::new(QuicClientConfig::try_from(tls).map_err(tls_err)?));
    config.transport_config(transport(false));
    let socket = udp_socket(bind).map_err(|source| NetError::Bind { addr: bind, source })?;
    let mut endpoint = Endpoint::new(
        quinn::EndpointConfig::default(),
        None,
        socket,
        Arc::new(quinn::TokioRuntime),
    )
    .map_err(|source| NetError::Bind { addr: bind, source })?;
    endpoint.set_default_client_config(config);
    Ok(endpoint)
}

/// A UDP socket bound to `addr` with buffers of up to [`SOCKET_BUFFER`]
/// (what the kernel grants is logged at debug level; a refusal only
/// leaves the default).
fn udp_socket(addr: SocketAddr) -> std::io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        // `[::]` serves IPv4 peers too (as quinn's own endpoints do).
        if let Err(e) = socket.set_only_v6(false) {
            tracing::debug!("IPv6 socket on {addr} stays IPv6-only: {e}");
        }
    }
    if let Err(e) = socket.set_recv_buffer_size(SOCKET_BUFFER) {
        tracing::debug!("UDP receive buffer of {SOCKET_BUFFER} B refused: {e}");
    }
    if let Err(e) = socket.set_send_buffer_size(SOCKET_BUFFER) {
        tracing::debug!("UDP send buffer of {SOCKET_BUFFER} B refused: {e}");
    }
    tracing::debug!(
        "UDP buffers on {addr}: receive {:?} B, send {:?} B",
        socket.recv_buffer_size(),
        socket.send_buffer_size()
    );
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

/// Accepts any server certificate, but verifies the handshake signature
/// made with its key: identity comes from the cluster-key proofs.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An endpoint's socket gets a larger receive buffer than a plain one
    /// (Linux grants up to twice `net.core.rmem_max`, which is never below
    /// the default), so a layer's burst of replies is not dropped.
    #[cfg(target_os = "linux")]
    #[test]
    fn endpoint_sockets_get_larger_buffers_than_the_default() {
        let addr: SocketAddr = "127.0.0.1:0".parse().expect("valid address");
        let plain = socket2::Socket::from(std::net::UdpSocket::bind(addr).expect("bind"));
        let ours = socket2::Socket::from(udp_socket(addr).expect("bind"));
        let (p, o) = (
            plain.recv_buffer_size().expect("size"),
            ours.recv_buffer_size().expect("size"),
        );
        assert!(o > p, "receive buffer {o} B, a plain socket's {p} B");
        assert!(ours
            .local_addr()
            .expect("bound")
            .as_socket()
            .is_some_and(|a| a.port() != 0));
    }

    /// An endpoint bound to `[::]` also talks to IPv4 peers.
    #[cfg(target_os = "linux")]
    #[test]
    fn an_ipv6_wildcard_socket_also_reaches_ipv4() {
        let Ok(ours) = udp_socket("[::]:0".parse().expect("valid address")) else {
            eprintln!("note: no IPv6 on this machine; skipped");
            return;
        };
        let port = ours.local_addr().expect("bound").port();
        let peer = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        peer.send_to(b"hi", ("127.0.0.1", port)).expect("send");
        ours.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        let mut buf = [0u8; 8];
        let (n, _) = ours
            .recv_from(&mut buf)
            .expect("an IPv4 datagram reaches the [::] socket");
        assert_eq!(&buf[..n], b"hi");
    }
}
