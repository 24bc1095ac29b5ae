//! A stand-in upstream that records what reaches it: every request's
//! headers, in arrival order, answered `200 ok` (HTTP/1.1, keep-alive), or
//! as a test's [`Answer`] function says (after a delay, with headers).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};

/// One request's headers, names in lower case, in order.
pub type Headers = Vec<(String, String)>;

/// How a stand-in answers a request, from its headers: after `delay`, 200
/// with these response headers.
pub type Answer = fn(&Headers) -> (std::time::Duration, Vec<(String, String)>);

/// The plain answer: at once, no headers.
fn plain(_: &Headers) -> (std::time::Duration, Vec<(String, String)>) {
    (std::time::Duration::ZERO, Vec::new())
}

/// A running upstream; its threads end with the test process.
pub struct Recorder {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Headers>>>,
}

impl Recorder {
    /// Listens on a free loopback port.
    pub fn start() -> Self {
        Self::answering(plain)
    }

    /// Listens on a free loopback port, answering as `answer` says.
    pub fn answering(answer: Answer) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("address");
        let seen: Arc<Mutex<Vec<Headers>>> = Arc::default();
        let all = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let all = all.clone();
                std::thread::spawn(move || serve(stream, &all, answer));
            }
        });
        Self { addr, seen }
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<Headers> {
        self.seen.lock().expect("lock").clone()
    }

    /// The values of header `name` in request `i`.
    pub fn values(&self, i: usize, name: &str) -> Vec<String> {
        self.requests().get(i).map_or_else(Vec::new, |headers| {
            headers
                .iter()
                .filter(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone())
                .collect()
        })
    }
}

/// Requests one after another on one connection.
fn serve(stream: std::net::TcpStream, all: &Mutex<Vec<Headers>>, answer: Answer) {
    let Ok(read) = stream.try_clone() else { return };
    let mut reader = BufReader::new(read);
    let mut writer = stream;
    loop {
        let mut headers = Headers::new();
        let mut line = String::new();
        // The request line.
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        loop {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
            }
        }
        let length: u64 = headers
            .iter()
            .find(|(k, _)| k == "content-length")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        let _ = std::io::copy(&mut (&mut reader).take(length), &mut std::io::sink());
        let (delay, extra) = answer(&headers);
        all.lock().expect("lock").push(headers);
        std::thread::sleep(delay);
        let extra: String = extra.iter().map(|(k, v)| format!("{k}: {v}\r\n")).collect();
        let reply = format!("HTTP/1.1 200 OK\r\n{extra}content-length: 3\r\n\r\nok\n");
        if writer.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

/// The value of header `name` in `headers`, if any.
pub fn header<'h>(headers: &'h Headers, name: &str) -> Option<&'h str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}
