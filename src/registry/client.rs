//! The HTTP side: requests with authentication and safe redirects, manifests,
//! blobs.

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use url::Url;

use super::auth::{basic_header, token_lifetime, AuthCache, Challenge, TokenResponse};
use super::credentials::{Credentials, EnrootCredentials};
use super::digest::{Digest, HashingWriter};
use super::docker_config::{ChainedCredentials, DockerCredentials};
use super::error::RegistryError;
use super::manifest::{ImageManifest, Manifest, MANIFEST_ACCEPT};
use super::platform::Platform;
use super::proxy::ProxySettings;
use super::retry::{retryable_status, retryable_transport, RetryPolicy};
use crate::reference::ImageRef;

/// Largest manifest or index berth reads (real ones are a few KiB).
const MAX_MANIFEST_BYTES: u64 = 8 << 20;
/// Largest image configuration blob berth reads into memory.
const MAX_CONFIG_BYTES: u64 = 32 << 20;
/// Redirects followed for one request.
const MAX_REDIRECTS: usize = 5;
/// Index nesting berth follows (index -> index -> manifest is already rare).
const MAX_INDEX_DEPTH: usize = 4;

/// Network timeouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Time to establish a connection (DNS, TCP, TLS).
    pub connect: Duration,
    /// Time to wait for each read of a response (not for the whole body, so big
    /// layers can take as long as they need while data keeps flowing).
    pub read: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(30),
            read: Duration::from_secs(60),
        }
    }
}

/// How to talk to registries.
#[derive(Debug, Clone)]
pub struct RegistryOptions {
    /// `host[:port]` of registries served over plain HTTP; all others use HTTPS.
    pub insecure_registries: Vec<String>,
    /// The `User-Agent` header.
    pub user_agent: String,
    /// Network timeouts.
    pub timeouts: Timeouts,
    /// Where logins come from (default: enroot's credentials file of the
    /// current environment, then docker's `config.json`).
    pub credentials: Arc<dyn Credentials>,
    /// Retries of transient failures (connection errors, 429, 5xx).
    pub retry: RetryPolicy,
    /// Pull-through mirrors: `(registry, mirror)`, both `host[:port]` (e.g.
    /// `("docker.io", "mirror.site:5000")`). Manifests and blobs of images in
    /// `registry` are asked from `mirror` first (same repository path), then
    /// from the registry itself when the mirror fails. Digests are checked
    /// either way; a mirror in `insecure_registries` is reached over HTTP.
    pub mirrors: Vec<(String, String)>,
    /// Proxies (default: from `HTTP_PROXY`, `HTTPS_PROXY`, `NO_PROXY`, ...).
    pub proxy: ProxySettings,
    /// A site CA bundle (PEM) trusted beside the system's store (`ca_bundle`).
    pub ca_bundle: Option<std::path::PathBuf>,
    /// Bearer tokens kept between processes in this user's file (the
    /// submitting user's `srun`s, [`super::token_file`]). Off where what is
    /// fetched must be known to be anonymous (a pull into the store): a
    /// kept token counts as a credential sent.
    pub token_file: Option<super::token_file::TokenFile>,
}

impl Default for RegistryOptions {
    fn default() -> Self {
        RegistryOptions {
            insecure_registries: Vec::new(),
            user_agent: format!("berth/{}", env!("CARGO_PKG_VERSION")),
            timeouts: Timeouts::default(),
            credentials: Arc::new(ChainedCredentials(vec![
                Arc::new(EnrootCredentials::from_env()),
                Arc::new(DockerCredentials::from_env()),
            ])),
            retry: RetryPolicy::default(),
            mirrors: Vec::new(),
            proxy: ProxySettings::from_env(),
            ca_bundle: None,
            token_file: None,
        }
    }
}

/// A manifest or index as the registry returned it.
#[derive(Debug, Clone)]
pub struct FetchedManifest {
    /// The sha256 of `bytes` (checked against the request and Docker-Content-Digest).
    pub digest: Digest,
    /// The exact bytes.
    pub bytes: Vec<u8>,
    /// The response's Content-Type, without parameters.
    pub media_type: Option<String>,
    /// The parsed document.
    pub manifest: Manifest,
}

/// An image resolved to the one manifest this machine runs.
#[derive(Debug, Clone)]
pub struct ResolvedImage {
    /// The reference pinned to `manifest_digest`.
    pub image: ImageRef,
    /// Digest of the platform's image manifest.
    pub manifest_digest: Digest,
    /// The image manifest's exact bytes.
    pub manifest_bytes: Vec<u8>,
    /// The image manifest.
    pub manifest: ImageManifest,
    /// Digest of the top-level index, when the reference named one.
    pub index_digest: Option<Digest>,
    /// The platform chosen from the index (`None` for a single-platform image).
    pub platform: Option<Platform>,
}

/// A Docker Registry HTTP API v2 / OCI distribution client. Cheap to share
/// between threads (`&RegistryClient` is `Send`); tokens are cached per repository.
#[derive(Debug)]
pub struct RegistryClient {
    /// For requests that go directly.
    agent: ureq::Agent,
    /// One agent per proxy URL in use.
    proxied: Vec<(String, ureq::Agent)>,
    proxy: ProxySettings,
    insecure: Vec<String>,
    credentials: Arc<dyn Credentials>,
    auth: AuthCache,
    retry: RetryPolicy,
    mirrors: Vec<(String, String)>,
    /// Set once a credential was sent (to a registry or its token service).
    used_credentials: std::sync::atomic::AtomicBool,
}

impl RegistryClient {
    /// A client with `options`.
    pub fn new(options: &RegistryOptions) -> RegistryClient {
        // The bundle was checked when the setting was read (Config); one
        // that went bad since is said, and the system's store used.
        let tls = options
            .ca_bundle
            .as_deref()
            .and_then(|path| match super::trust::with_ca_bundle(path) {
                Ok(tls) => Some(tls),
                Err(e) => {
                    eprintln!("berth: warning: {e:#}; using the system's trust store only");
                    None
                }
            });
        let tls = tls.as_ref();
        let mut proxied: Vec<(String, ureq::Agent)> = Vec::new();
        for (variable, url) in [
            ("HTTP_PROXY", &options.proxy.http),
            ("HTTPS_PROXY", &options.proxy.https),
        ] {
            let Some(url) = url else { continue };
            if proxied.iter().any(|(u, _)| u == url) {
                continue;
            }
            match ureq::Proxy::new(url) {
                Ok(proxy) => proxied.push((url.clone(), build_agent(options, Some(proxy), tls))),
                Err(e) => eprintln!(
                    "berth: warning: ignoring {variable} '{}': {e}; give http://HOST:PORT",
                    strip_userinfo(url)
                ),
            }
        }
        RegistryClient {
            agent: build_agent(options, None, tls),
            proxied,
            proxy: options.proxy.clone(),
            insecure: options.insecure_registries.clone(),
            credentials: Arc::clone(&options.credentials),
            auth: options
                .token_file
                .clone()
                .map_or_else(AuthCache::default, AuthCache::kept_in),
            retry: options.retry,
            mirrors: options.mirrors.clone(),
            used_credentials: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Whether this client has sent a credential so far: when it has not,
    /// what it fetched is readable anonymously.
    pub fn used_credentials(&self) -> bool {
        self.used_credentials
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Checks that the manifest `digest` of `image` is readable with this
    /// client's credentials now: a `GET` of it whose bytes must hash to
    /// `digest` (a server answering 200 to anything passes no check), asked of
    /// the registry's mirror first when one is configured, then of the
    /// registry. When both fail, the error is the registry's, or the
    /// mirror's when the registry could not be reached.
    pub fn check_manifest(&self, image: &ImageRef, digest: &Digest) -> Result<()> {
        let Some(mirror) = self.mirror_of(image) else {
            return self.check_manifest_at(image, digest);
        };
        let mirrored = match self.check_manifest_at(&mirror, digest) {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        eprintln!(
            "berth: mirror {} failed for {image} ({mirrored:#}); asking {}",
            mirror.registry, image.registry
        );
        self.check_manifest_at(image, digest)
            .map_err(|e| match e.downcast_ref::<RegistryError>() {
                Some(RegistryError::Unreachable { .. }) => mirrored,
                _ => e,
            })
    }

    /// [`RegistryClient::check_manifest`] at exactly `image`'s registry.
    fn check_manifest_at(&self, image: &ImageRef, digest: &Digest) -> Result<()> {
        self.fetch_manifest(image, digest.as_str()).map(|_| ())
    }

    /// `http://HOST` for insecure registries, else `https://HOST`.
    fn base_url(&self, image: &ImageRef) -> String {
        let host = image.api_host();
        let plain = self
            .insecure
            .iter()
            .any(|h| h == host || h == &image.registry);
        format!("{}://{host}", if plain { "http" } else { "https" })
    }

    /// Fetches the manifest or index `reference` (a tag or a digest) of `image`.
    ///
    /// When `reference` is a digest the bytes are checked against it; the digest
    /// of what came back is always computed and compared with the
    /// Docker-Content-Digest header when the registry sends one.
    pub fn fetch_manifest(&self, image: &ImageRef, reference: &str) -> Result<FetchedManifest> {
        let url = format!(
            "{}/v2/{}/manifests/{reference}",
            self.base_url(image),
            image.repository
        );
        let resp = self
            .get(image, &url, Some(MANIFEST_ACCEPT))
            .map_err(|e| manifest_unknown_on_404(e, image))?;
        let media_type = resp
            .header("content-type")
            .map(|c| c.split(';').next().unwrap_or("").trim().to_string());
        let header_digest = resp.header("docker-content-digest").map(str::to_string);
        let mut bytes = Vec::new();
        resp.into_reader()
            .take(MAX_MANIFEST_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| RegistryError::Unreachable {
                host: image.api_host().to_string(),
                detail: format!("connection lost while reading the manifest: {e}"),
            })?;
        if bytes.len() as u64 > MAX_MANIFEST_BYTES {
            return Err(RegistryError::InvalidManifest {
                image: image.to_string(),
                detail: format!("the manifest is larger than {MAX_MANIFEST_BYTES} bytes"),
            }
            .into());
        }
        let digest = Digest::of_bytes(&bytes);
        let mismatch = |expected: &str| RegistryError::DigestMismatch {
            what: format!("manifest of {image}"),
            expected: expected.to_string(),
            actual: digest.to_string(),
            registry: image.registry.clone(),
        };
        if reference.contains(':') && reference != digest.as_str() {
            return Err(mismatch(reference).into());
        }
        if let Some(h) = header_digest.filter(|h| h.starts_with("sha256:")) {
            if h != digest.as_str() {
                return Err(mismatch(&h).into());
            }
        }
        let manifest = Manifest::parse(&bytes, media_type.as_deref(), &image.to_string())?;
        Ok(FetchedManifest {
            digest,
            bytes,
            media_type,
            manifest,
        })
    }

    /// The agent for `url`: through its proxy, or direct.
    fn agent_for(&self, url: &str) -> &ureq::Agent {
        let proxy = Url::parse(url).ok().and_then(|u| {
            let host = u.host_str()?.trim_start_matches('[').trim_end_matches(']');
            let port = u.port_or_known_default()?;
            self.proxy
                .proxy_for(u.scheme(), host, port)
                .map(str::to_string)
        });
        proxy
            .and_then(|p| self.proxied.iter().find(|(u, _)| *u == p))
            .map_or(&self.agent, |(_, agent)| agent)
    }

    /// The same image on the configured mirror of its registry, if any.
    fn mirror_of(&self, image: &ImageRef) -> Option<ImageRef> {
        let (_, mirror) = self.mirrors.iter().find(|(r, _)| *r == image.registry)?;
        Some(ImageRef {
            registry: mirror.clone(),
            ..image.clone()
        })
    }

    /// Resolves `image` (tag or digest) to the image manifest for `platform`,
    /// following indexes, nested ones too. Asks the registry's mirror first
    /// when one is configured; the result names `image`'s own registry.
    pub fn resolve(&self, image: &ImageRef, platform: &Platform) -> Result<ResolvedImage> {
        if let Some(mirror) = self.mirror_of(image) {
            match self.resolve_at(&mirror, platform) {
                Ok(mut resolved) => {
                    resolved.image = image.with_digest(resolved.manifest_digest.as_str());
                    return Ok(resolved);
                }
                Err(e) => eprintln!(
                    "berth: mirror {} failed for {image} ({e:#}); asking {}",
                    mirror.registry, image.registry
                ),
            }
        }
        self.resolve_at(image, platform)
    }

    /// The digest of what `image` names in the registry now: for a tag, the
    /// index or manifest the tag points at (computed over the bytes served,
    /// not taken from a header). Asks the registry's mirror first when one is
    /// configured. Nothing but that one document is downloaded.
    pub fn top_digest(&self, image: &ImageRef) -> Result<Digest> {
        if let Some(mirror) = self.mirror_of(image) {
            match self.fetch_manifest(&mirror, mirror.manifest_reference()) {
                Ok(fetched) => return Ok(fetched.digest),
                Err(e) => eprintln!(
                    "berth: mirror {} failed for {image} ({e:#}); asking {}",
                    mirror.registry, image.registry
                ),
            }
        }
        Ok(self
            .fetch_manifest(image, image.manifest_reference())?
            .digest)
    }

    /// [`RegistryClient::resolve`] at exactly `image`'s registry.
    fn resolve_at(&self, image: &ImageRef, platform: &Platform) -> Result<ResolvedImage> {
        let top = self.fetch_manifest(image, image.manifest_reference())?;
        let mut index_digest = None;
        let mut chosen_platform = None;
        let mut current = top;
        for _ in 0..MAX_INDEX_DEPTH {
            match current.manifest {
                Manifest::Image(manifest) => {
                    return Ok(ResolvedImage {
                        image: image.with_digest(current.digest.as_str()),
                        manifest_digest: current.digest,
                        manifest_bytes: current.bytes,
                        manifest,
                        index_digest,
                        platform: chosen_platform,
                    })
                }
                Manifest::Index(index) => {
                    index_digest.get_or_insert_with(|| current.digest.clone());
                    let desc = index.select(platform, &image.to_string())?;
                    let digest = Digest::parse(&desc.digest).map_err(|e| {
                        RegistryError::InvalidManifest {
                            image: image.to_string(),
                            detail: e,
                        }
                    })?;
                    chosen_platform = desc.platform.clone();
                    current = self.fetch_manifest(image, digest.as_str())?;
                }
            }
        }
        Err(RegistryError::InvalidManifest {
            image: image.to_string(),
            detail: format!("image indexes nested more than {MAX_INDEX_DEPTH} deep"),
        }
        .into())
    }

    /// Streams blob `digest` of `image` into `out`, hashing on the way, and
    /// checks digest and (when given) size at the end. Returns the byte count.
    ///
    /// `out` holds unverified bytes until this returns `Ok`: write to a temp file.
    /// With a mirror configured, the mirror is asked first; the registry is
    /// asked when the mirror fails before sending any byte.
    pub fn fetch_blob(
        &self,
        image: &ImageRef,
        digest: &Digest,
        size: Option<u64>,
        out: &mut dyn Write,
    ) -> Result<u64> {
        if let Some(mirror) = self.mirror_of(image) {
            let mut counted = CountingWriter { inner: out, n: 0 };
            match self.fetch_blob_at(&mirror, digest, size, &mut counted) {
                Ok(n) => return Ok(n),
                Err(e) if counted.n == 0 => eprintln!(
                    "berth: mirror {} failed for blob {digest} of {image} ({e:#}); asking {}",
                    mirror.registry, image.registry
                ),
                Err(e) => return Err(e),
            }
        }
        self.fetch_blob_at(image, digest, size, out)
    }

    /// [`RegistryClient::fetch_blob`] from exactly `image`'s registry.
    fn fetch_blob_at(
        &self,
        image: &ImageRef,
        digest: &Digest,
        size: Option<u64>,
        out: &mut dyn Write,
    ) -> Result<u64> {
        let url = format!(
            "{}/v2/{}/blobs/{digest}",
            self.base_url(image),
            image.repository
        );
        let resp = self.get(image, &url, None).map_err(|e| match e {
            RegistryError::Http { status: 404, .. } => RegistryError::BlobUnknown {
                digest: digest.to_string(),
                image: image.to_string(),
                registry: image.registry.clone(),
            },
            e => e,
        })?;
        let host = Url::parse(resp.get_url())
            .ok()
            .and_then(|u| u.host_str().map(str::to_string))
            .unwrap_or_else(|| image.api_host().to_string());
        let mut reader = resp.into_reader();
        let mut writer = HashingWriter::new(out);
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(RegistryError::Unreachable {
                        host,
                        detail: format!("connection lost while downloading blob {digest}: {e}"),
                    }
                    .into())
                }
            };
            if size.is_some_and(|s| writer.written() + n as u64 > s) {
                return Err(RegistryError::DigestMismatch {
                    what: "blob".to_string(),
                    expected: digest.to_string(),
                    actual: format!(
                        "more than the {} bytes the manifest lists",
                        size.unwrap_or(0)
                    ),
                    registry: image.registry.clone(),
                }
                .into());
            }
            writer
                .write_all(&buf[..n])
                .with_context(|| format!("cannot write blob {digest} of {image}"))?;
        }
        writer
            .flush()
            .with_context(|| format!("cannot write blob {digest} of {image}"))?;
        let (actual, len, _) = writer.finish();
        if actual != *digest || size.is_some_and(|s| s != len) {
            return Err(RegistryError::DigestMismatch {
                what: "blob".to_string(),
                expected: digest.to_string(),
                actual: format!("{actual}, {len} bytes"),
                registry: image.registry.clone(),
            }
            .into());
        }
        Ok(len)
    }

    /// Fetches a small blob (the image configuration) into memory, verified.
    pub fn fetch_blob_bytes(
        &self,
        image: &ImageRef,
        digest: &Digest,
        size: u64,
    ) -> Result<Vec<u8>> {
        if size > MAX_CONFIG_BYTES {
            anyhow::bail!(
                "blob {digest} of {image} is {size} bytes, more than the {MAX_CONFIG_BYTES} \
                 berth reads into memory for an image configuration"
            );
        }
        let mut bytes = Vec::with_capacity(size as usize);
        self.fetch_blob(image, digest, Some(size), &mut bytes)?;
        Ok(bytes)
    }

    /// GET `url` for `image`: authenticates when challenged, follows redirects
    /// (sending credentials only to the registry's own origin), maps errors.
    fn get(
        &self,
        image: &ImageRef,
        url: &str,
        accept: Option<&str>,
    ) -> Result<ureq::Response, RegistryError> {
        self.request("GET", image, url, accept)
    }

    /// [`RegistryClient::get`] with another method (`HEAD`).
    fn request(
        &self,
        method: &str,
        image: &ImageRef,
        url: &str,
        accept: Option<&str>,
    ) -> Result<ureq::Response, RegistryError> {
        let registry_origin = origin(url);
        let cache_key = auth_key(image);
        let mut auth = self.auth.get(&cache_key);
        if auth.is_some() && self.auth.is_kept() {
            self.note_credentials();
        }
        let mut authenticated_now = false;
        // A kept token the registry now refuses (expired early, revoked,
        // another scope) is dropped once and a new one asked for.
        let mut dropped_kept = false;
        let mut url = url.to_string();
        let mut redirects = 0;
        loop {
            let same_origin = origin(&url) == registry_origin;
            let request = || {
                let mut req = self.agent_for(&url).request(method, &url);
                if let Some(accept) = accept {
                    req = req.set("Accept", accept);
                }
                if let (Some(auth), true) = (&auth, same_origin) {
                    req = req.set("Authorization", auth);
                }
                req
            };
            match self.call(request) {
                Ok(resp) if (300..400).contains(&resp.status()) => {
                    redirects += 1;
                    let location = resp.header("location").unwrap_or_default().to_string();
                    let next = Url::parse(&url)
                        .and_then(|base| base.join(&location))
                        .map_err(|_| RegistryError::Http {
                            url: url.clone(),
                            status: resp.status(),
                            detail: format!("redirect to an invalid location '{location}'"),
                        })?;
                    if !matches!(next.scheme(), "http" | "https") {
                        return Err(RegistryError::Http {
                            url: strip_query(&url),
                            status: resp.status(),
                            detail: format!(
                                "redirect to '{}', which is not an http or https URL; berth \
                                 follows redirects to web servers only",
                                strip_query(next.as_str())
                            ),
                        });
                    }
                    if redirects > MAX_REDIRECTS {
                        return Err(RegistryError::Http {
                            url,
                            status: resp.status(),
                            detail: format!("more than {MAX_REDIRECTS} redirects"),
                        });
                    }
                    url = next.to_string();
                }
                Ok(resp) => return Ok(resp),
                Err(ureq::Error::Status(403, _))
                    if same_origin && auth.is_some() && !authenticated_now && !dropped_kept =>
                {
                    self.auth.remove(&cache_key);
                    auth = None;
                    dropped_kept = true;
                }
                Err(ureq::Error::Status(401, resp)) if same_origin && !authenticated_now => {
                    self.auth.remove(&cache_key);
                    let challenge = resp
                        .header("www-authenticate")
                        .unwrap_or_default()
                        .to_string();
                    let value = self.authenticate(image, &challenge)?;
                    auth = Some(value);
                    authenticated_now = true;
                }
                Err(ureq::Error::Status(status @ (401 | 403), _)) if same_origin => {
                    self.auth.remove(&cache_key);
                    return Err(RegistryError::Denied {
                        image: image.to_string(),
                        registry: image.registry.clone(),
                        status,
                        credentials: self.credentials.describe(),
                    });
                }
                Err(ureq::Error::Status(status, resp)) => {
                    return Err(RegistryError::Http {
                        url: strip_query(&url),
                        status,
                        detail: error_detail(resp),
                    })
                }
                Err(ureq::Error::Transport(t)) => {
                    return Err(unreachable(&url, &t));
                }
            }
        }
    }

    /// Answers a `WWW-Authenticate` challenge; returns the `Authorization` value,
    /// which is also cached for the repository.
    fn authenticate(&self, image: &ImageRef, challenge: &str) -> Result<String, RegistryError> {
        let cache_key = auth_key(image);
        let user = image.user.as_deref();
        let denied = |status| RegistryError::Denied {
            image: image.to_string(),
            registry: image.registry.clone(),
            status,
            credentials: self.credentials.describe(),
        };
        match Challenge::parse(challenge) {
            Some(Challenge::Basic) => {
                let cred = self
                    .lookup_credential(&[image.api_host(), &image.registry], user)
                    .ok_or_else(|| denied(401))?;
                let value = basic_header(&cred.login, &cred.password);
                self.note_credentials();
                self.auth.put(&cache_key, value.clone(), None);
                Ok(value)
            }
            Some(Challenge::Bearer {
                realm,
                service,
                scope,
            }) => {
                let mut token_url = Url::parse(&realm).map_err(|e| RegistryError::Auth {
                    registry: image.registry.clone(),
                    detail: format!("its token service URL '{realm}' is invalid: {e}"),
                })?;
                {
                    let mut q = token_url.query_pairs_mut();
                    if let Some(service) = &service {
                        q.append_pair("service", service);
                    }
                    let scope =
                        scope.unwrap_or_else(|| format!("repository:{}:pull", image.repository));
                    q.append_pair("scope", &scope);
                }
                let realm_host = host_port(&token_url);
                let cred =
                    self.lookup_credential(&[&realm_host, image.api_host(), &image.registry], user);
                if cred.is_some() {
                    self.note_credentials();
                }
                let request = || {
                    let req = self.agent_for(token_url.as_str()).get(token_url.as_str());
                    match &cred {
                        Some(c) => req.set("Authorization", &basic_header(&c.login, &c.password)),
                        None => req,
                    }
                };
                let resp = match self.call(request) {
                    Ok(resp) if resp.status() == 200 => resp,
                    Ok(resp) => {
                        return Err(RegistryError::Auth {
                            registry: image.registry.clone(),
                            detail: format!(
                                "its token service {} answered HTTP {}",
                                strip_query(token_url.as_str()),
                                resp.status()
                            ),
                        })
                    }
                    Err(ureq::Error::Status(status @ (401 | 403), _)) => {
                        return Err(denied(status))
                    }
                    Err(ureq::Error::Status(status, resp)) => {
                        return Err(RegistryError::Http {
                            url: strip_query(token_url.as_str()),
                            status,
                            detail: error_detail(resp),
                        })
                    }
                    Err(ureq::Error::Transport(t)) => {
                        return Err(unreachable(token_url.as_str(), &t))
                    }
                };
                let answer: TokenResponse =
                    serde_json::from_reader(resp.into_reader().take(1 << 20)).map_err(|e| {
                        RegistryError::Auth {
                            registry: image.registry.clone(),
                            detail: format!("its token service sent an unreadable answer: {e}"),
                        }
                    })?;
                let lifetime = token_lifetime(answer.expires_in);
                let token = answer.into_token().ok_or_else(|| RegistryError::Auth {
                    registry: image.registry.clone(),
                    detail: "its token service sent no token".to_string(),
                })?;
                let value = format!("Bearer {token}");
                self.auth.put(&cache_key, value.clone(), Some(lifetime));
                Ok(value)
            }
            None => Err(RegistryError::Auth {
                registry: image.registry.clone(),
                detail: format!(
                    "it asks for an authentication scheme berth does not support ('{}')",
                    challenge.split_whitespace().next().unwrap_or("")
                ),
            }),
        }
    }

    /// Sends the request `build` makes, again after a wait while it fails
    /// transiently and the retry policy allows (see [`RetryPolicy`]).
    // Same result type as ureq's own `Request::call`, which this wraps.
    #[allow(clippy::result_large_err)]
    fn call(&self, build: impl Fn() -> ureq::Request) -> Result<ureq::Response, ureq::Error> {
        let started = Instant::now();
        let mut attempt = 1;
        loop {
            let request = build();
            let url = strip_query(request.url());
            let result = request.call();
            let (what, retry_after) = match &result {
                Err(ureq::Error::Status(status, resp)) if retryable_status(*status) => (
                    format!("answered HTTP {status}"),
                    resp.header("retry-after").map(str::to_string),
                ),
                Err(ureq::Error::Transport(t)) if retryable_transport(t.kind()) => {
                    (format!("failed ({})", t.kind()), None)
                }
                _ => return result,
            };
            let Some(wait) = self
                .retry
                .delay(attempt, retry_after.as_deref(), started.elapsed())
            else {
                return result;
            };
            eprintln!(
                "berth: {url} {what}; retrying in {:.1} s (attempt {} of {})",
                wait.as_secs_f64(),
                attempt + 1,
                self.retry.attempts
            );
            std::thread::sleep(wait);
            attempt += 1;
        }
    }

    fn note_credentials(&self) {
        self.used_credentials
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    fn lookup_credential(
        &self,
        hosts: &[&str],
        user: Option<&str>,
    ) -> Option<super::credentials::Credential> {
        hosts.iter().find_map(|h| self.credentials.lookup(h, user))
    }
}

/// An HTTP agent with `options`' timeouts and user agent, through `proxy`,
/// trusting `tls`'s certificates (default: the system's store).
fn build_agent(
    options: &RegistryOptions,
    proxy: Option<ureq::Proxy>,
    tls: Option<&Arc<rustls::ClientConfig>>,
) -> ureq::Agent {
    let mut builder = ureq::AgentBuilder::new()
        .timeout_connect(options.timeouts.connect)
        .timeout_read(options.timeouts.read)
        .timeout_write(options.timeouts.read)
        .user_agent(&options.user_agent)
        // No keep-alive pool: ureq 2 clears a connection's socket timeouts
        // when it goes back to the pool and does not set them again on
        // reuse, so a registry that stalls on a reused connection would
        // hang the pull forever. One connection per request keeps
        // `timeouts.read` in force on every request.
        .max_idle_connections(0)
        // Proxies are chosen per request (NO_PROXY), see `agent_for`.
        .try_proxy_from_env(false)
        // Redirects are followed by hand so that credentials never go to another host.
        .redirects(0);
    if let Some(tls) = tls {
        builder = builder.tls_config(Arc::clone(tls));
    }
    match proxy {
        Some(proxy) => builder.proxy(proxy),
        None => builder,
    }
    .build()
}

/// A proxy URL without `user:password@`, for messages.
fn strip_userinfo(url: &str) -> String {
    match url.split_once('@') {
        Some((before, after)) => match before.split_once("://") {
            Some((scheme, _)) => format!("{scheme}://{after}"),
            None => after.to_string(),
        },
        None => url.to_string(),
    }
}

/// A writer that counts what passes through it.
struct CountingWriter<'a> {
    inner: &'a mut dyn Write,
    n: u64,
}

impl Write for CountingWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.n += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// `scheme://host:port` of a URL, for same-origin checks.
fn origin(url: &str) -> Option<(String, String, Option<u16>)> {
    let u = Url::parse(url).ok()?;
    Some((
        u.scheme().to_string(),
        u.host_str()?.to_string(),
        u.port_or_known_default(),
    ))
}

/// `host[:port]` as written in credentials files.
fn host_port(u: &Url) -> String {
    match (u.host_str(), u.port()) {
        (Some(h), Some(p)) => format!("{h}:{p}"),
        (Some(h), None) => h.to_string(),
        _ => String::new(),
    }
}

/// The URL without its query (pre-signed CDN URLs carry secrets there).
/// The key of `image`'s authorization values: the registry's API host, the
/// repository and the login named in the reference (`user@registry#...`).
fn auth_key(image: &ImageRef) -> String {
    match &image.user {
        Some(user) => format!("{user}@{}/{}", image.api_host(), image.repository),
        None => format!("{}/{}", image.api_host(), image.repository),
    }
}

fn strip_query(url: &str) -> String {
    url.split('?').next().unwrap_or(url).to_string()
}

fn unreachable(url: &str, t: &ureq::Transport) -> RegistryError {
    let host = Url::parse(url)
        .map(|u| host_port(&u))
        .unwrap_or_else(|_| url.to_string());
    let mut detail = match t.kind() {
        ureq::ErrorKind::Dns => "the host name does not resolve".to_string(),
        ureq::ErrorKind::ConnectionFailed => "connection failed".to_string(),
        ureq::ErrorKind::Io => "network I/O error or timeout".to_string(),
        _ => "request failed".to_string(),
    };
    if let Some(msg) = t.message() {
        detail.push_str(": ");
        detail.push_str(msg);
    }
    if let Some(source) = std::error::Error::source(t) {
        detail.push_str(": ");
        detail.push_str(&source.to_string());
    }
    if let Some(hint) = tls_hint(&detail) {
        detail.push_str(" (");
        detail.push_str(hint);
        detail.push(')');
    }
    RegistryError::Unreachable { host, detail }
}

/// What to do about a TLS failure, recognised in the network layer's words.
fn tls_hint(detail: &str) -> Option<&'static str> {
    let d = detail.to_ascii_lowercase();
    if d.contains("certificate") {
        Some(
            "the registry's TLS certificate was refused: install its CA in the system's \
             trust store (update-ca-certificates), or name a PEM bundle of it with \
             ca_bundle=PATH in berth's configuration",
        )
    } else if d.contains("tls") || d.contains("corrupt message") {
        Some(
            "the TLS handshake failed: if the registry serves plain HTTP, list it in \
             insecure_registries",
        )
    } else {
        None
    }
}

/// The distribution API's error message from a response body, if any.
fn error_detail(resp: ureq::Response) -> String {
    let mut body = Vec::new();
    let _ = resp.into_reader().take(4096).read_to_end(&mut body);
    #[derive(serde::Deserialize)]
    struct Errors {
        errors: Vec<ErrorItem>,
    }
    #[derive(serde::Deserialize)]
    struct ErrorItem {
        #[serde(default)]
        code: String,
        #[serde(default)]
        message: String,
    }
    if let Ok(errors) = serde_json::from_slice::<Errors>(&body) {
        return errors
            .errors
            .iter()
            .map(|e| format!("{} {}", e.code, e.message).trim().to_string())
            .collect::<Vec<_>>()
            .join("; ");
    }
    let text = String::from_utf8_lossy(&body);
    text.chars()
        .take(200)
        .collect::<String>()
        .trim()
        .to_string()
}
/// A 404 for a manifest means the image (tag or digest) does not exist.
fn manifest_unknown_on_404(e: RegistryError, image: &ImageRef) -> RegistryError {
    match e {
        RegistryError::Http { status: 404, .. } => RegistryError::ManifestUnknown {
            image: image.to_string(),
            registry: image.registry.clone(),
        },
        e => e,
    }
}
