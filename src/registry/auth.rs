//! Registry authentication: `WWW-Authenticate` challenges, bearer tokens and
//! their cache, basic auth.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::token_file::{now_secs, KeptToken, TokenFile};

/// A parsed `WWW-Authenticate` challenge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Challenge {
    /// `Bearer realm="...",service="...",scope="..."`: get a token from `realm`.
    Bearer {
        /// Token service URL.
        realm: String,
        /// `service` parameter, when given.
        service: Option<String>,
        /// `scope` parameter, when given.
        scope: Option<String>,
    },
    /// `Basic realm="..."`: send the login and password directly.
    Basic,
}

impl Challenge {
    /// Parses a `WWW-Authenticate` header value; `None` when the scheme is unknown
    /// or a bearer challenge has no realm.
    pub fn parse(header: &str) -> Option<Challenge> {
        let header = header.trim();
        let (scheme, rest) = header
            .split_once(char::is_whitespace)
            .unwrap_or((header, ""));
        if scheme.eq_ignore_ascii_case("basic") {
            return Some(Challenge::Basic);
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        let params = parse_params(rest);
        let get = |k: &str| {
            params
                .iter()
                .find(|(key, _)| key.eq_ignore_ascii_case(k))
                .map(|(_, v)| v.clone())
        };
        Some(Challenge::Bearer {
            realm: get("realm").filter(|r| !r.is_empty())?,
            service: get("service"),
            scope: get("scope"),
        })
    }
}

/// Parses `key="value", key=value` auth parameters.
fn parse_params(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace() || *c == ',') {
            chars.next();
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c == ',' {
                break;
            }
            key.push(c);
            chars.next();
        }
        if key.is_empty() {
            break;
        }
        let mut value = String::new();
        if chars.peek() == Some(&'=') {
            chars.next();
            if chars.peek() == Some(&'"') {
                chars.next();
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => value.extend(chars.next()),
                        c => value.push(c),
                    }
                }
            } else {
                while let Some(&c) = chars.peek() {
                    if c == ',' {
                        break;
                    }
                    value.push(c);
                    chars.next();
                }
            }
        }
        out.push((key.trim().to_string(), value.trim().to_string()));
    }
    out
}

/// The `Authorization` value for basic auth.
pub fn basic_header(login: &str, password: &str) -> String {
    format!("Basic {}", base64(format!("{login}:{password}").as_bytes()))
}

/// Standard base64 with padding (RFC 4648), enough for basic auth.
pub fn base64(data: &[u8]) -> String {
    const TABLE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(TABLE[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Decodes standard base64 (RFC 4648, padding optional, no line breaks);
/// `None` for anything else.
pub fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let text = text.trim_end_matches('=');
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    for chunk in text.as_bytes().chunks(4) {
        if chunk.len() == 1 {
            return None;
        }
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= value(c)? << (18 - 6 * i);
        }
        out.extend_from_slice(&n.to_be_bytes()[1..chunk.len()]);
    }
    Some(out)
}

/// A token service's answer.
#[derive(Debug, serde::Deserialize)]
pub struct TokenResponse {
    /// The token (Docker's field name).
    #[serde(default)]
    pub token: Option<String>,
    /// The token (OAuth2 field name).
    #[serde(default)]
    pub access_token: Option<String>,
    /// Lifetime in seconds; the distribution spec's default is 60.
    #[serde(default)]
    pub expires_in: Option<u64>,
}

impl TokenResponse {
    /// The token, whichever field carries it.
    pub fn into_token(self) -> Option<String> {
        self.token
            .filter(|t| !t.is_empty())
            .or(self.access_token.filter(|t| !t.is_empty()))
    }
}

/// How long to trust a token that lives `expires_in` seconds: a margin is kept so
/// that a token is not used right when it expires.
pub fn token_lifetime(expires_in: Option<u64>) -> Duration {
    let secs = expires_in.filter(|s| *s > 0).unwrap_or(60);
    Duration::from_secs(secs.saturating_sub((secs / 10).max(5)).max(1))
}

/// An `Authorization` header value and when it stops being valid.
#[derive(Clone)]
struct CachedAuth {
    header: String,
    valid_until: Option<Instant>,
}

/// Authorization values per repository, reused until they expire; bearer
/// tokens also kept in the user's token file when there is one
/// ([`TokenFile`]), for their next submissions.
#[derive(Default)]
pub struct AuthCache {
    entries: Mutex<HashMap<String, CachedAuth>>,
    file: Option<TokenFile>,
}

impl std::fmt::Debug for AuthCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuthCache { .. }")
    }
}

impl AuthCache {
    /// A cache that starts with the unexpired tokens of `file` and keeps
    /// new bearer tokens there.
    pub fn kept_in(file: TokenFile) -> AuthCache {
        let now = now_secs();
        let entries = file
            .load()
            .into_iter()
            .map(|(key, kept)| {
                let left = Duration::from_secs(kept.expires.saturating_sub(now));
                let auth = CachedAuth {
                    header: kept.header,
                    valid_until: Some(Instant::now() + left),
                };
                (key, auth)
            })
            .collect();
        AuthCache {
            entries: Mutex::new(entries),
            file: Some(file),
        }
    }

    /// Whether values may come from the user's token file (so were maybe
    /// got with credentials by an earlier process).
    pub fn is_kept(&self) -> bool {
        self.file.is_some()
    }

    /// The still-valid header value for `key`, if any.
    pub fn get(&self, key: &str) -> Option<String> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        match entries.get(key) {
            Some(a) if a.valid_until.is_none_or(|t| Instant::now() < t) => Some(a.header.clone()),
            Some(_) => {
                entries.remove(key);
                None
            }
            None => None,
        }
    }

    /// Remembers `header` for `key`, for `lifetime` (forever when `None`).
    pub fn put(&self, key: &str, header: String, lifetime: Option<Duration>) {
        if let (Some(file), Some(lifetime)) = (&self.file, lifetime) {
            if header.starts_with("Bearer ") {
                let mut kept = file.load();
                let expires = now_secs() + lifetime.as_secs();
                let token = KeptToken {
                    header: header.clone(),
                    expires,
                };
                kept.insert(key.to_string(), token);
                file.save(&kept);
            }
        }
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.insert(
            key.to_string(),
            CachedAuth {
                header,
                valid_until: lifetime.map(|d| Instant::now() + d),
            },
        );
    }

    /// Forgets `key` (after the registry refused its value).
    pub fn remove(&self, key: &str) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.remove(key).is_some() {
            if let Some(file) = &self.file {
                let mut kept = file.load();
                if kept.remove(key).is_some() {
                    file.save(&kept);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_challenges() {
        let c = Challenge::parse(
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/ubuntu:pull""#,
        )
        .unwrap();
        assert_eq!(
            c,
            Challenge::Bearer {
                realm: "https://auth.docker.io/token".into(),
                service: Some("registry.docker.io".into()),
                scope: Some("repository:library/ubuntu:pull".into()),
            }
        );
        let c = Challenge::parse("bearer realm=http://127.0.0.1:1/t, service=reg").unwrap();
        assert!(matches!(c, Challenge::Bearer { ref service, ref scope, .. }
            if service.as_deref() == Some("reg") && scope.is_none()));
        assert_eq!(
            Challenge::parse(r#"Basic realm="Registry""#),
            Some(Challenge::Basic)
        );
        assert_eq!(Challenge::parse("Negotiate"), None);
        assert_eq!(Challenge::parse("Bearer service=x"), None);
    }

    #[test]
    fn base64_matches_rfc4648() {
        for (input, want) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(input.as_bytes()), want);
        }
        for input in [
            "",
            "f",
            "fo",
            "foo",
            "foob",
            "fooba",
            "foobar",
            "user:pa:ss",
        ] {
            let encoded = base64(input.as_bytes());
            assert_eq!(base64_decode(&encoded).unwrap(), input.as_bytes());
            let unpadded = encoded.trim_end_matches('=');
            assert_eq!(base64_decode(unpadded).unwrap(), input.as_bytes());
        }
        assert_eq!(base64_decode("Zm9v!"), None);
        assert_eq!(base64_decode("Z"), None);
        assert_eq!(
            basic_header("Aladdin", "open sesame"),
            "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ=="
        );
    }

    #[test]
    fn cache_expires() {
        let cache = AuthCache::default();
        cache.put("a", "Bearer x".into(), None);
        cache.put("b", "Bearer y".into(), Some(Duration::from_secs(0)));
        assert_eq!(cache.get("a").as_deref(), Some("Bearer x"));
        assert_eq!(cache.get("b"), None);
        assert!(token_lifetime(Some(300)) < Duration::from_secs(300));
        assert!(token_lifetime(None) >= Duration::from_secs(1));
        assert!(token_lifetime(Some(1)) >= Duration::from_secs(1));
    }
}
