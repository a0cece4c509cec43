//! Proxies from the usual environment variables: `HTTPS_PROXY` for https
//! URLs, `HTTP_PROXY` for http URLs (lower case too; `ALL_PROXY` for both when
//! the specific one is unset), and `NO_PROXY` for hosts reached directly.
//!
//! ureq 2 knows one proxy per agent and ignores `NO_PROXY`, so the client keeps
//! one agent per proxy and asks [`ProxySettings::proxy_for`] which to use.
//!
//! `NO_PROXY` entries, comma separated: `*` (no proxy at all), a host name
//! (matches it and its subdomains; a leading `.` is ignored), an IP address,
//! each optionally with `:port` to match only that port. CIDR ranges are not
//! supported.

/// Proxy settings for registry requests.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProxySettings {
    /// Proxy URL for `http://` requests.
    pub http: Option<String>,
    /// Proxy URL for `https://` requests.
    pub https: Option<String>,
    /// `NO_PROXY` entries.
    pub no_proxy: Vec<String>,
}

impl ProxySettings {
    /// Reads `HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY` and `NO_PROXY` (upper or
    /// lower case; lower case wins, as in curl).
    pub fn from_env() -> ProxySettings {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Like [`ProxySettings::from_env`], with variables from `var`.
    pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> ProxySettings {
        let get = |name: &str| {
            var(&name.to_ascii_lowercase())
                .or_else(|| var(name))
                .filter(|v| !v.trim().is_empty())
        };
        let all = get("ALL_PROXY");
        ProxySettings {
            http: get("HTTP_PROXY").or_else(|| all.clone()),
            https: get("HTTPS_PROXY").or(all),
            no_proxy: get("NO_PROXY")
                .map(|v| {
                    v.split(',')
                        .map(|e| e.trim().to_ascii_lowercase())
                        .filter(|e| !e.is_empty())
                        .collect()
                })
                .unwrap_or_default(),
        }
    }

    /// The proxy for a request with `scheme` (`http` or `https`) to `host`
    /// (name or IP, without brackets) on `port`; `None` to go directly.
    pub fn proxy_for(&self, scheme: &str, host: &str, port: u16) -> Option<&str> {
        let proxy = match scheme {
            "http" => self.http.as_deref(),
            "https" => self.https.as_deref(),
            _ => None,
        }?;
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let bypass = self
            .no_proxy
            .iter()
            .any(|entry| no_proxy_matches(entry, &host, port));
        (!bypass).then_some(proxy)
    }
}

/// Whether one `NO_PROXY` entry covers `host` (lower case) on `port`.
fn no_proxy_matches(entry: &str, host: &str, port: u16) -> bool {
    if entry == "*" {
        return true;
    }
    let (name, entry_port) = split_port(entry);
    if entry_port.is_some_and(|p| p != port) {
        return false;
    }
    let name = name.trim_start_matches("*.").trim_start_matches('.');
    let name = name.trim_start_matches('[').trim_end_matches(']');
    host == name
        || host
            .strip_suffix(name)
            .is_some_and(|rest| rest.ends_with('.'))
}

/// `host:port` into its parts (IPv6 literals only with brackets carry a port).
fn split_port(entry: &str) -> (&str, Option<u16>) {
    if let Some(rest) = entry.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((ip, tail)) => (ip, tail.strip_prefix(':').and_then(|p| p.parse().ok())),
            None => (entry, None),
        };
    }
    match entry.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') => match port.parse() {
            Ok(port) => (name, Some(port)),
            Err(_) => (entry, None),
        },
        _ => (entry, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(vars: &[(&str, &str)]) -> ProxySettings {
        ProxySettings::from_lookup(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn variables() {
        let s = settings(&[
            ("HTTP_PROXY", "http://upper:1"),
            ("http_proxy", "http://lower:1"),
            ("ALL_PROXY", "http://all:3"),
            ("NO_PROXY", " localhost, .example.org ,10.0.0.1:5000,,"),
        ]);
        assert_eq!(s.http.as_deref(), Some("http://lower:1"));
        assert_eq!(s.https.as_deref(), Some("http://all:3"));
        assert_eq!(s.no_proxy, ["localhost", ".example.org", "10.0.0.1:5000"]);
        assert_eq!(settings(&[]), ProxySettings::default());
        assert_eq!(settings(&[("HTTPS_PROXY", "  ")]).https, None);
    }

    #[test]
    fn no_proxy_rules() {
        let s = settings(&[
            ("HTTPS_PROXY", "http://proxy:3128"),
            (
                "NO_PROXY",
                "localhost,.example.org,registry.site,10.0.0.1:5000,[::1],*.wild.net",
            ),
        ]);
        let via = |host: &str, port| s.proxy_for("https", host, port);
        assert_eq!(via("nvcr.io", 443), Some("http://proxy:3128"));
        assert_eq!(via("localhost", 5000), None);
        assert_eq!(via("a.example.org", 443), None);
        assert_eq!(via("example.org", 443), None);
        assert_eq!(via("badexample.org", 443), Some("http://proxy:3128"));
        assert_eq!(via("REGISTRY.site.", 443), None);
        assert_eq!(via("mirror.registry.site", 443), None);
        assert_eq!(via("10.0.0.1", 5000), None);
        assert_eq!(via("10.0.0.1", 443), Some("http://proxy:3128"));
        assert_eq!(via("::1", 443), None);
        assert_eq!(via("x.wild.net", 443), None);
        assert_eq!(
            s.proxy_for("http", "nvcr.io", 80),
            None,
            "no HTTP_PROXY set"
        );
        let all = settings(&[("https_proxy", "http://p:1"), ("no_proxy", "*")]);
        assert_eq!(all.proxy_for("https", "nvcr.io", 443), None);
    }
}
