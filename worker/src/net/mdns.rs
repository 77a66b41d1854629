//! Finding workers on the LAN with mDNS (mdns-sd).
//!
//! A worker advertises `_charm._udp.local.` with its port and, in TXT,
//! `fp` (its model fingerprint) and `proto` (the protocol version). That is
//! all: nothing secret travels in mDNS, and what a coordinator finds there
//! is only a place to knock — every worker found must still pass the
//! handshake (cluster key, model) before it gets any work.
//!
//! `loopback_only` restricts a daemon to 127.0.0.1 (tests and single-box
//! trials): it then neither listens nor sends on any other interface.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use mdns_sd::{IfKind, Receiver, ServiceDaemon, ServiceEvent, ServiceInfo};

use super::NetError;

/// The mDNS service type of charm workers.
pub const SERVICE_TYPE: &str = "_charm._udp.local.";

fn mdns_err(e: impl std::fmt::Display) -> NetError {
    NetError::Mdns(e.to_string())
}

fn daemon(loopback_only: bool) -> Result<ServiceDaemon, NetError> {
    let d = ServiceDaemon::new().map_err(mdns_err)?;
    if loopback_only {
        d.disable_interface(IfKind::All).map_err(mdns_err)?;
        d.enable_interface(IfKind::LoopbackV4).map_err(mdns_err)?;
    }
    Ok(d)
}

/// A worker's advertisement; withdrawn when dropped.
pub struct Advertisement {
    daemon: ServiceDaemon,
    fullname: String,
}

impl Advertisement {
    /// Advertises a worker listening on `listen` for the model `fingerprint`.
    pub fn start(listen: SocketAddr, fingerprint: &str, loopback_only: bool) -> Result<Advertisement, NetError> {
        let daemon = daemon(loopback_only)?;
        let port = listen.port();
        let tag: u32 = rand::random();
        let instance = format!("charm-worker-{port}-{tag:08x}");
        let host = format!("charm-{tag:08x}.local.");
        let props = [
            ("fp", fingerprint.to_string()),
            ("proto", charm_proto::PROTOCOL_VERSION.to_string()),
        ];
        let ip: Option<IpAddr> = match (loopback_only, listen.ip()) {
            (true, _) => Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            (false, ip) if ip.is_unspecified() => None,
            (false, ip) => Some(ip),
        };
        let info = match ip {
            Some(ip) => ServiceInfo::new(SERVICE_TYPE, &instance, &host, ip, port, &props[..]),
            None => {
                ServiceInfo::new(SERVICE_TYPE, &instance, &host, "", port, &props[..]).map(|i| i.enable_addr_auto())
            }
        }
        .map_err(mdns_err)?;
        let fullname = info.get_fullname().to_string();
        daemon.register(info).map_err(mdns_err)?;
        Ok(Advertisement { daemon, fullname })
    }
}

impl Drop for Advertisement {
    fn drop(&mut self) {
        if let Ok(rx) = self.daemon.unregister(&self.fullname) {
            let _ = rx.recv_timeout(std::time::Duration::from_millis(500));
        }
        let _ = self.daemon.shutdown();
    }
}

/// A worker seen in mDNS: where to knock, and what it claims to hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sighting {
    pub addrs: Vec<SocketAddr>,
    /// The `fp` TXT value (a hint: the handshake checks the real thing).
    pub fingerprint: Option<String>,
}

/// Watches mDNS for workers.
pub struct Browser {
    daemon: ServiceDaemon,
    events: Receiver<ServiceEvent>,
    loopback_only: bool,
}

impl Browser {
    /// Starts browsing for [`SERVICE_TYPE`].
    pub fn start(loopback_only: bool) -> Result<Browser, NetError> {
        let daemon = daemon(loopback_only)?;
        let events = daemon.browse(SERVICE_TYPE).map_err(mdns_err)?;
        Ok(Browser {
            daemon,
            events,
            loopback_only,
        })
    }

    /// Waits up to `timeout` for the next resolved worker; `None` when the
    /// time ran out (or the daemon stopped).
    pub fn next(&self, timeout: std::time::Duration) -> Option<Sighting> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.checked_duration_since(std::time::Instant::now())?;
            let ev = self.events.recv_timeout(left).ok()?;
            if let ServiceEvent::ServiceResolved(info) = ev {
                let props: HashMap<String, String> = info
                    .txt_properties
                    .iter()
                    .map(|p| (p.key().to_string(), p.val_str().to_string()))
                    .collect();
                let mut addrs: Vec<SocketAddr> = info
                    .addresses
                    .iter()
                    .map(|a| a.to_ip_addr())
                    .filter(|ip| !self.loopback_only || ip.is_loopback())
                    .map(|ip| SocketAddr::new(ip, info.port))
                    .collect();
                addrs.sort();
                if !addrs.is_empty() {
                    return Some(Sighting {
                        addrs,
                        fingerprint: props.get("fp").cloned(),
                    });
                }
            }
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.daemon.stop_browse(SERVICE_TYPE);
        let _ = self.daemon.shutdown();
    }
}
