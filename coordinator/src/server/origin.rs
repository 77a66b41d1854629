//! Which web pages may call the server. A browser names the page's origin
//! in an `Origin` header on every cross-site request (and on every POST);
//! the server answers only origins it trusts, so a page on some website
//! cannot drive a keyless server on this machine's loopback (a plain
//! `text/plain` POST needs no preflight, so CORS headers alone would not
//! stop it from running a generation; its origin does).
//!
//! Trusted: the server's own origin (the dashboard: `Origin` equals the
//! `Host` the request was sent to), pages served from loopback
//! (`localhost`, `127.0.0.1`, `[::1]`, any port, as Ollama does), and the
//! origins given with `--cors-origin` (`*`: every origin). Requests without
//! an `Origin` header (curl, SDKs, servers) are not affected. Trusted
//! origins get the CORS headers a browser needs, preflights included.

use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};

/// How long a browser may cache a preflight's answer, in seconds.
const PREFLIGHT_MAX_AGE_S: &str = "600";

/// The origins `--cors-origin` adds to the trusted ones.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Origins {
    any: bool,
    listed: Vec<String>,
}

impl Origins {
    /// From the `--cors-origin` values: `*`, `null`, or
    /// `scheme://host[:port]` (no path).
    pub fn parse(values: &[String]) -> Result<Self, String> {
        let mut o = Origins::default();
        for v in values {
            let v = v.trim();
            if v == "*" {
                o.any = true;
            } else if v == "null" || split(v).is_some_and(|(_, rest)| !rest.is_empty() && !rest.contains('/')) {
                o.listed.push(v.to_ascii_lowercase());
            } else {
                return Err(format!(
                    "--cors-origin {v:?}: give an origin as scheme://host[:port] (no path), `null` or `*`"
                ));
            }
        }
        Ok(o)
    }

    /// Whether a page at `origin` may call the server, reached as `host`
    /// (the request's `Host` header).
    pub fn allows(&self, origin: &str, host: Option<&str>) -> bool {
        let origin = origin.trim().to_ascii_lowercase();
        if self.any || self.listed.contains(&origin) {
            return true;
        }
        let Some((scheme, authority)) = split(&origin) else {
            return false;
        };
        if !matches!(scheme, "http" | "https") || authority.contains('/') {
            return false;
        }
        host.is_some_and(|h| h.trim().eq_ignore_ascii_case(authority)) || is_loopback(authority)
    }
}

/// `scheme://rest` → (`scheme`, `rest`).
fn split(origin: &str) -> Option<(&str, &str)> {
    origin.split_once("://")
}

/// Whether `host[:port]` names this machine's loopback.
fn is_loopback(authority: &str) -> bool {
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split_once(']').map_or(v6, |(h, _)| h),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    matches!(host, "localhost" | "127.0.0.1" | "::1")
}

/// The request's `Origin`, when it has one that is text.
pub fn origin_of(headers: &HeaderMap) -> Option<String> {
    headers
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// Whether the request is a CORS preflight.
pub fn is_preflight(method: &Method, headers: &HeaderMap) -> bool {
    method == Method::OPTIONS && headers.contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
}

/// The answer to a trusted origin's preflight: every method the routes
/// take and the headers it asked to send.
pub fn preflight(origin: &str, headers: &HeaderMap) -> Response {
    let mut resp = StatusCode::NO_CONTENT.into_response();
    let h = resp.headers_mut();
    allow(h, origin);
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, OPTIONS"),
    );
    if let Some(asked) = headers.get(header::ACCESS_CONTROL_REQUEST_HEADERS) {
        h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked.clone());
    }
    h.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static(PREFLIGHT_MAX_AGE_S),
    );
    h.append(
        header::VARY,
        HeaderValue::from_static("access-control-request-method, access-control-request-headers"),
    );
    resp
}

/// Marks a response as readable by a page at `origin`.
pub fn allow(headers: &mut HeaderMap, origin: &str) {
    if let Ok(v) = HeaderValue::from_str(origin) {
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
        headers.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static("retry-after"),
        );
        headers.append(header::VARY, HeaderValue::from_static("origin"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_loopback_and_listed_origins_are_trusted_others_not() {
        let none = Origins::default();
        let host = Some("192.168.1.5:8000");
        for ok in [
            "http://192.168.1.5:8000",
            "HTTP://192.168.1.5:8000",
            "http://localhost:3000",
            "https://localhost",
            "http://127.0.0.1:5173",
            "http://[::1]:8080",
        ] {
            assert!(none.allows(ok, host), "{ok}");
        }
        for bad in [
            "https://evil.example",
            "http://192.168.1.5:8001",
            "http://localhost.evil.example",
            "http://127.0.0.1.evil.example:80",
            "null",
            "file://",
            "chrome-extension://abc",
            "http://localhost/path",
        ] {
            assert!(!none.allows(bad, host), "{bad}");
        }
        let listed = Origins::parse(&["https://chat.example.com".into(), "null".into()]).unwrap();
        assert!(listed.allows("https://chat.example.com", host));
        assert!(listed.allows("null", host));
        assert!(!listed.allows("https://other.example.com", host));
        let any = Origins::parse(&["*".into()]).unwrap();
        assert!(any.allows("https://evil.example", host));
    }

    #[test]
    fn malformed_cors_origins_are_refused() {
        for bad in ["example.com", "https://example.com/app", "https://", ""] {
            let e = Origins::parse(&[bad.into()]).unwrap_err();
            assert!(e.contains("--cors-origin"), "{e}");
        }
    }
}
