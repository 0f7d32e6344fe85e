//! The configuration store of a cluster whose hosts share nothing: etcd (v3.4 or later),
//! whose replicated, linearizable transactions decide which of two managers moves the
//! cluster to the next configuration. hytra runs no consensus of its own.
//!
//! It speaks etcd's v3 API through the JSON gateway every etcd server serves beside gRPC
//! (`POST /v3/kv/txn` and `/v3/kv/deleterange`, keys and values in base64), one HTTP/1.0
//! request per connection: a configuration changes a handful of times per run, and this
//! keeps a gRPC stack out of the engine. A run keeps two keys under its own prefix:
//! `<prefix>/epoch` (decimal: the configuration's revision, see [`super`]) and
//! `<prefix>/config` (the encoded configuration). A
//! compare-and-set is one etcd transaction: if `epoch` holds the expected epoch (or does
//! not exist, for the first configuration), write both keys; otherwise read both, at the
//! same revision.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

use serde_json::{json, Value};

use super::{Cas, ConfigStore, StoreFailure, FRAME_MAX, REQUEST_TIMEOUT};

/// A configuration store in etcd, reached at any of its client endpoints.
#[derive(Clone, Debug)]
pub struct EtcdStore {
    endpoints: Vec<SocketAddr>,
    prefix: String,
}

impl EtcdStore {
    /// The store of one run: keys under `prefix` (starting with `/`, not ending with
    /// one), on the etcd cluster whose client endpoints are `endpoints` (tried in turn
    /// until one answers).
    pub fn new(endpoints: Vec<SocketAddr>, prefix: &str) -> Result<EtcdStore, StoreFailure> {
        if endpoints.is_empty() {
            return Err(StoreFailure::Unavailable("etcd: no endpoint given".into()));
        }
        if !prefix.starts_with('/') || prefix.ends_with('/') || prefix.len() < 2 {
            return Err(StoreFailure::Unavailable(format!(
                "etcd: the key prefix {prefix:?} must start with '/' and not end with one"
            )));
        }
        Ok(EtcdStore { endpoints, prefix: prefix.to_string() })
    }

    /// The key prefix of this run.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The client endpoints, in the order they are tried.
    pub fn endpoints(&self) -> &[SocketAddr] {
        &self.endpoints
    }

    fn key(&self, name: &str) -> String {
        b64_encode(format!("{}/{name}", self.prefix).as_bytes())
    }

    /// Deletes every key of this run (`<prefix>/` and below), once the run is over.
    pub fn clear(&self) -> Result<(), StoreFailure> {
        let from = format!("{}/", self.prefix);
        // The end of the range: the prefix with its last byte ('/') raised by one.
        let to = format!("{}0", self.prefix);
        let body = json!({
            "key": b64_encode(from.as_bytes()),
            "range_end": b64_encode(to.as_bytes()),
        });
        self.post("/v3/kv/deleterange", &body).map(|_| ())
    }

    /// Sends `body` to `path` at the first endpoint that answers; the answer's JSON, and
    /// whether an endpoint tried before failed (it may have applied the request before
    /// its answer was lost).
    fn post(&self, path: &str, body: &Value) -> Result<(Value, bool), StoreFailure> {
        let body = body.to_string();
        let mut why = Vec::new();
        for &at in &self.endpoints {
            match post_once(at, path, &body) {
                Ok(v) => return Ok((v, !why.is_empty())),
                Err(e) => why.push(format!("{at}: {e}")),
            }
        }
        Err(StoreFailure::Unavailable(format!("etcd: {}", why.join("; "))))
    }

    /// Reads `responses[at]` of a transaction's answer as a range of one key: its value,
    /// if the key exists.
    fn range_value(answer: &Value, at: usize) -> Result<Option<Vec<u8>>, StoreFailure> {
        let r = answer
            .get("responses")
            .and_then(|r| r.get(at))
            .and_then(|r| r.get("response_range"))
            .ok_or_else(|| malformed("a transaction's answer without its reads", answer))?;
        let Some(kv) = r.get("kvs").and_then(|k| k.get(0)) else { return Ok(None) };
        // An empty value is left out of the JSON, as proto3 leaves out defaults.
        match kv.get("value") {
            None => Ok(Some(Vec::new())),
            Some(v) => v
                .as_str()
                .and_then(b64_decode)
                .map(Some)
                .ok_or_else(|| malformed("a value that is not base64", answer)),
        }
    }

    /// The epoch and configuration read by reads 0 and 1 of a transaction's answer.
    fn stored(&self, answer: &Value) -> Result<Option<(u64, Vec<u8>)>, StoreFailure> {
        let (epoch, config) = (Self::range_value(answer, 0)?, Self::range_value(answer, 1)?);
        match (epoch, config) {
            (None, None) => Ok(None),
            (Some(e), Some(c)) => {
                let e = std::str::from_utf8(&e)
                    .ok()
                    .and_then(|s| s.parse::<u64>().ok())
                    .ok_or_else(|| malformed("an epoch that is not a number", answer))?;
                Ok(Some((e, c)))
            }
            _ => Err(malformed(
                &format!("only one of {0}/epoch and {0}/config stored", self.prefix),
                answer,
            )),
        }
    }

    fn reads(&self) -> Value {
        json!([
            { "request_range": { "key": self.key("epoch") } },
            { "request_range": { "key": self.key("config") } },
        ])
    }
}

impl ConfigStore for EtcdStore {
    fn get(&self) -> Result<Option<(u64, Vec<u8>)>, StoreFailure> {
        // A transaction without comparisons succeeds: both reads at one revision.
        let (answer, _) = self.post("/v3/kv/txn", &json!({ "success": self.reads() }))?;
        self.stored(&answer)
    }

    fn cas(&self, expected: u64, epoch: u64, bytes: &[u8]) -> Result<Cas, StoreFailure> {
        assert!(epoch > expected, "epoch {epoch} does not follow {expected}");
        let compare = if expected == 0 {
            json!({ "key": self.key("epoch"), "target": "CREATE", "result": "EQUAL",
                    "create_revision": "0" })
        } else {
            json!({ "key": self.key("epoch"), "target": "VALUE", "result": "EQUAL",
                    "value": b64_encode(expected.to_string().as_bytes()) })
        };
        let body = json!({
            "compare": [compare],
            "success": [
                { "request_put": { "key": self.key("epoch"),
                                   "value": b64_encode(epoch.to_string().as_bytes()) } },
                { "request_put": { "key": self.key("config"), "value": b64_encode(bytes) } },
            ],
            "failure": self.reads(),
        });
        let (answer, retried) = self.post("/v3/kv/txn", &body)?;
        // proto3 leaves a false `succeeded` out.
        if answer.get("succeeded").and_then(Value::as_bool) == Some(true) {
            return Ok(Cas::Done);
        }
        match self.stored(&answer)? {
            // An endpoint that failed first may have committed this very request and lost
            // only its answer: finding exactly it stored, this manager's write is in.
            Some((e, b)) if retried && e == epoch && b == bytes => Ok(Cas::Done),
            Some((e, b)) => Ok(Cas::Lost(e, b)),
            None => Err(malformed(
                &format!("nothing stored, where epoch {expected} was expected"),
                &answer,
            )),
        }
    }
}

/// An etcd of one member on 127.0.0.1, with a data directory of its own, for tests: the
/// process is killed and the directory removed on drop.
pub struct LocalEtcd {
    child: std::process::Child,
    dir: std::path::PathBuf,
    /// Its client endpoint.
    pub client: SocketAddr,
}

impl LocalEtcd {
    /// Starts `etcd` (named `name`, for its directory) and waits until it answers, at
    /// most 20 s. `Ok(None)` if there is no `etcd` binary and `HYTRA_REQUIRE_ETCD` is not
    /// `1` (which makes a missing binary an error, as in CI).
    pub fn start(name: &str) -> Result<Option<LocalEtcd>, String> {
        use std::process::{Command, Stdio};
        let present = Command::new("etcd")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !present {
            if std::env::var("HYTRA_REQUIRE_ETCD").as_deref() == Ok("1") {
                return Err(
                    "HYTRA_REQUIRE_ETCD=1 but there is no etcd (Debian: etcd-server)".into()
                );
            }
            return Ok(None);
        }
        let port = || -> Result<u16, String> {
            let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
            Ok(l.local_addr().map_err(|e| e.to_string())?.port())
        };
        let dir = std::env::temp_dir().join(format!("hytra-etcd-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let (client, peer) = (port()?, port()?);
        let client_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let log = std::fs::File::create(dir.join("log")).map_err(|e| e.to_string())?;
        let child = Command::new("etcd")
            .arg("--name")
            .arg(name)
            .arg("--data-dir")
            .arg(dir.join("data"))
            .args(["--listen-client-urls", &client_url, "--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("{name}={peer_url}")])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start etcd: {e}"))?;
        let e = LocalEtcd { child, dir, client: ([127, 0, 0, 1], client).into() };
        let start = std::time::Instant::now();
        // Bounded: 20 s of polls 50 ms apart.
        while e.keys_under("/").is_err() {
            if start.elapsed() > std::time::Duration::from_secs(20) {
                let log = std::fs::read_to_string(e.dir.join("log")).unwrap_or_default();
                return Err(format!("etcd did not answer within 20 s: {log}"));
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Ok(Some(e))
    }

    /// How many keys start with `prefix`.
    pub fn keys_under(&self, prefix: &str) -> Result<u64, String> {
        let mut end = prefix.as_bytes().to_vec();
        *end.last_mut().ok_or("an empty prefix")? += 1;
        let body = json!({ "key": b64_encode(prefix.as_bytes()), "range_end": b64_encode(&end),
                           "count_only": true });
        let answer = post_once(self.client, "/v3/kv/range", &body.to_string())?;
        // proto3 leaves a zero count out; etcd writes 64-bit numbers as strings.
        answer
            .get("count")
            .and_then(Value::as_str)
            .map_or(Ok(0), str::parse)
            .map_err(|e| format!("a count that is not a number: {e}"))
    }

    /// Stops etcd now (as a crash would).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for LocalEtcd {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn malformed(what: &str, answer: &Value) -> StoreFailure {
    let mut text = answer.to_string();
    text.truncate(200);
    StoreFailure::Malformed(format!("etcd: {what}: {text}"))
}

/// One POST of `body` to `path` at `at`, as HTTP/1.0 (the server closes the connection
/// after its answer, so the answer is everything read); the answer's JSON if its status
/// is 200.
fn post_once(at: SocketAddr, path: &str, body: &str) -> Result<Value, String> {
    let mut s = TcpStream::connect_timeout(&at, REQUEST_TIMEOUT).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(REQUEST_TIMEOUT)).map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(REQUEST_TIMEOUT)).map_err(|e| e.to_string())?;
    let request = format!(
        "POST {path} HTTP/1.0\r\nHost: {at}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(request.as_bytes()).map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    // Bounded: a configuration is far smaller than a frame, base64 and JSON included.
    s.take(2 * FRAME_MAX as u64).read_to_end(&mut answer).map_err(|e| e.to_string())?;
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| format!("an answer without headers ({} bytes)", answer.len()))?;
    let head = String::from_utf8_lossy(&answer[..split]);
    let payload = &answer[split + 4..];
    let status = head.split_whitespace().nth(1).unwrap_or("");
    if status != "200" {
        let mut text = String::from_utf8_lossy(payload).into_owned();
        text.truncate(200);
        return Err(format!("HTTP {status} from {path}: {text}"));
    }
    serde_json::from_slice(payload).map_err(|e| format!("an answer that is not JSON: {e}"))
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding, as the gateway's JSON carries bytes.
fn b64_encode(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for k in 0..4 {
            if k <= chunk.len() {
                out.push(char::from(B64[(n >> (18 - 6 * k) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The bytes of standard base64 with padding; `None` if `text` is not that.
fn b64_decode(text: &str) -> Option<Vec<u8>> {
    let t = text.as_bytes();
    if t.len() % 4 != 0 {
        return None;
    }
    let mut out = Vec::with_capacity(t.len() / 4 * 3);
    for (i, quad) in t.chunks(4).enumerate() {
        let last = i + 1 == t.len() / 4;
        let pad = quad.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return None;
        }
        let mut n = 0u32;
        for &c in &quad[..4 - pad] {
            let v = B64.iter().position(|&x| x == c)? as u32;
            n = n << 6 | v;
        }
        n <<= 6 * pad as u32;
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..3 - pad]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_travels_both_ways_and_refuses_what_is_not_base64() {
        for (plain, coded) in
            [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foob", "Zm9vYg==")]
        {
            assert_eq!(b64_encode(plain.as_bytes()), coded);
            assert_eq!(b64_decode(coded).as_deref(), Some(plain.as_bytes()));
        }
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(b64_decode(&b64_encode(&all)), Some(all));
        for bad in ["Zg=", "Z===", "Zg==Zg==", "Zm9*"] {
            assert_eq!(b64_decode(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_prefix_must_be_a_path_and_an_endpoint_given() {
        let at: SocketAddr = "127.0.0.1:2379".parse().unwrap();
        assert!(EtcdStore::new(vec![at], "/hytra/run").is_ok());
        for bad in ["", "/", "hytra", "/hytra/"] {
            assert!(EtcdStore::new(vec![at], bad).is_err(), "{bad:?}");
        }
        assert!(EtcdStore::new(Vec::new(), "/hytra").is_err());
    }

    #[test]
    fn an_unreachable_etcd_is_unavailable_with_its_address() {
        // A port nobody listens on: bound, then released.
        let at = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let s = EtcdStore::new(vec![at], "/hytra/x").unwrap();
        match s.get() {
            Err(StoreFailure::Unavailable(why)) => assert!(why.contains(&at.to_string()), "{why}"),
            other => panic!("{other:?}"),
        }
    }
}
