//! A forward HTTP proxy for the tests of nodes behind a site proxy.

use std::io::Write;
use std::sync::Mutex;

/// A forward HTTP proxy on the cluster's bridge (what nodes behind a site
/// proxy talk to): absolute-URI requests (`GET http://HOST:PORT/PATH`) are
/// sent on with `Connection: close`; it records who asked for what.
pub struct ForwardProxy {
    /// `IP:PORT` it listens on.
    pub addr: String,
    seen: std::sync::Arc<Mutex<Vec<(String, String)>>>,
}

impl ForwardProxy {
    /// Starts it on `ip` (a free port), serving until the test ends.
    pub fn start(ip: &str) -> ForwardProxy {
        let listener = std::net::TcpListener::bind(format!("{ip}:0")).unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let seen = std::sync::Arc::new(Mutex::new(Vec::new()));
        let log = std::sync::Arc::clone(&seen);
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let log = std::sync::Arc::clone(&log);
                std::thread::spawn(move || {
                    let _ = forward_absolute(client, &log);
                });
            }
        });
        ForwardProxy { addr, seen }
    }

    /// The request lines naming `repository` that came from the nodes (not
    /// from `bridge`, the machine's own address).
    pub fn seen_from_nodes(&self, bridge: &str, repository: &str) -> Vec<String> {
        self.requests()
            .into_iter()
            .filter(|(peer, line)| peer != bridge && line.contains(repository))
            .map(|(_, line)| line)
            .collect()
    }

    /// `(peer IP, request line)` of every request so far.
    pub fn requests(&self) -> Vec<(String, String)> {
        self.seen.lock().unwrap().clone()
    }
}

/// Forwards one absolute-URI request without a body to its origin, and the
/// answer back.
fn forward_absolute(
    client: std::net::TcpStream,
    log: &Mutex<Vec<(String, String)>>,
) -> std::io::Result<()> {
    use std::io::BufRead;
    let peer = client.peer_addr()?.ip().to_string();
    let mut reader = std::io::BufReader::new(client.try_clone()?);
    let mut first = String::new();
    reader.read_line(&mut first)?;
    log.lock().unwrap().push((peer, first.trim().to_string()));
    let mut words = first.split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let Some(rest) = target.strip_prefix("http://") else {
        return Ok(());
    };
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let mut head = format!(
        "{method} {} HTTP/1.1\r\n",
        if path.is_empty() { "/" } else { path }
    );
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" {
            break;
        }
        let lower = line.to_ascii_lowercase();
        if !lower.starts_with("connection:") && !lower.starts_with("proxy-") {
            head.push_str(&line);
        }
    }
    head.push_str("Connection: close\r\n\r\n");
    let mut upstream = std::net::TcpStream::connect(host)?;
    upstream.write_all(head.as_bytes())?;
    let mut client = client;
    std::io::copy(&mut upstream, &mut client)?;
    client.shutdown(std::net::Shutdown::Both)
}
