//! statsd output: every flush interval, each counter's increase since the
//! last flush (`name:delta|c`) and the response time samples kept meanwhile
//! (`name:ms|ms|@rate`), over TCP (the reference's default) or UDP, with
//! DogStatsD tags (`|#k:v,...`) when asked. A statsd that cannot be reached
//! is logged once per episode; counter increases wait for the next flush
//! (nothing is counted twice), the samples of a failed flush are lost.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;

use super::{RESPONSE_TIME, StatValue, reference_stats};
use crate::metrics::Metrics;

/// How statsd lines travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// One TCP connection, reopened when it breaks.
    Tcp,
    /// Datagrams of at most [`MAX_DATAGRAM`] bytes.
    Udp,
}

/// The largest UDP datagram sent (fits an Ethernet MTU).
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
pub const MAX_DATAGRAM: usize = 1432;

/// Where and how to send.
#[derive(Debug, Clone)]
pub(crate) struct StatsdOptions {
    /// `host:port`.
    pub addr: String,
    /// TCP or UDP.
    pub protocol: Protocol,
    /// Time between flushes.
    pub flush_interval: Duration,
    /// The longest a TCP connect or flush may take.
    pub timeout: Duration,
    /// DogStatsD tags on every line (`None`: plain statsd).
    pub tags: Option<Vec<(String, String)>>,
}

/// What was sent last, to send increases.
#[derive(Debug, Default)]
pub(crate) struct Flusher {
    sent: HashMap<String, u64>,
}

impl Flusher {
    /// The lines of one flush, taken as sent (see [`Flusher::prepare`] for
    /// a flush that may fail).
    #[cfg(test)]
    pub(crate) fn lines(
        &mut self,
        metrics: &Metrics,
        tags: Option<&[(String, String)]>,
    ) -> Vec<String> {
        let (lines, sent) = self.prepare(metrics, tags);
        self.sent = sent;
        lines
    }

    /// The lines of one flush and the totals they bring statsd to; give
    /// those to [`Flusher::commit`] once the lines are sent.
    pub(crate) fn prepare(
        &self,
        metrics: &Metrics,
        tags: Option<&[(String, String)]>,
    ) -> (Vec<String>, HashMap<String, u64>) {
        let mut sent = self.sent.clone();
        let suffix = match tags {
            Some(tags) if !tags.is_empty() => format!(
                "|#{}",
                tags.iter()
                    .map(|(k, v)| format!("{k}:{v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            _ => String::new(),
        };
        let mut out = Vec::new();
        for stat in reference_stats(metrics) {
            let StatValue::Counter(total) = stat.value else {
                continue;
            };
            let last = sent.entry(stat.name.clone()).or_insert(0);
            // Counters never go down; a smaller total means a new process.
            let delta = total.saturating_sub(*last);
            *last = total;
            if delta > 0 {
                out.push(format!("{}:{delta}|c{suffix}", stat.name));
            }
        }
        let (samples, seen) = metrics.response_samples.take();
        let rate = if seen > samples.len() as u64 && seen > 0 {
            format!("|@{:.6}", samples.len() as f64 / seen as f64)
        } else {
            String::new()
        };
        for seconds in samples {
            out.push(format!(
                "{RESPONSE_TIME}:{:.3}|ms{rate}{suffix}",
                seconds * 1e3
            ));
        }
        (out, sent)
    }

    /// Records a flush as sent.
    pub(crate) fn commit(&mut self, sent: HashMap<String, u64>) {
        self.sent = sent;
    }
}

/// Sends to statsd for as long as the process runs.
pub(crate) async fn run(options: StatsdOptions, metrics: Arc<Metrics>) {
    metrics.response_samples.enable();
    let mut flusher = Flusher::default();
    let mut tcp: Option<tokio::net::TcpStream> = None;
    let mut failing = false;
    let mut tick = tokio::time::interval(options.flush_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let (lines, sent) = flusher.prepare(&metrics, options.tags.as_deref());
        if lines.is_empty() {
            continue;
        }
        let result = match options.protocol {
            Protocol::Tcp => send_tcp(&options.addr, &mut tcp, &lines, options.timeout).await,
            Protocol::Udp => send_udp(&options.addr, &lines).await,
        };
        match result {
            Ok(()) => {
                flusher.commit(sent);
                if failing {
                    failing = false;
                    tracing::info!(addr = %options.addr, "statsd reachable again");
                }
            }
            // The increases are sent with the next flush; the samples of
            // this one are lost.
            Err(e) => {
                if !failing {
                    tracing::warn!(addr = %options.addr, error = %e, "statsd not reachable; counter increases wait for the next flush");
                }
                failing = true;
            }
        }
    }
}

/// Sends `lines` over the connection, made (again) when there is none or
/// the peer has closed it; connecting and writing take `timeout` at most,
/// past which the connection is dropped.
async fn send_tcp(
    addr: &str,
    conn: &mut Option<tokio::net::TcpStream>,
    lines: &[String],
    timeout: Duration,
) -> std::io::Result<()> {
    let timed_out = |what: &str| {
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("{what} took more than {timeout:?} (--statsd-timeout)"),
        )
    };
    let mut text = lines.join("\n");
    text.push('\n');
    // A statsd that closed the connection since the last flush: writing
    // would only fill the kernel's buffer and lose the lines.
    if conn.as_ref().is_some_and(peer_closed) {
        *conn = None;
    }
    if conn.is_none() {
        let connect = tokio::net::TcpStream::connect(addr);
        let stream = tokio::time::timeout(timeout, connect)
            .await
            .map_err(|_| timed_out("connecting"))??;
        *conn = Some(stream);
    }
    let Some(stream) = conn.as_mut() else {
        return Ok(());
    };
    let written = match tokio::time::timeout(timeout, stream.write_all(text.as_bytes())).await {
        Ok(result) => result,
        Err(_) => Err(timed_out("a flush")),
    };
    if let Err(e) = written {
        *conn = None;
        return Err(e);
    }
    Ok(())
}

/// Whether the peer has closed `stream` (statsd sends nothing, so anything
/// readable is the end of the stream or an error).
fn peer_closed(stream: &tokio::net::TcpStream) -> bool {
    let mut byte = [0u8; 1];
    match stream.try_read(&mut byte) {
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
        Ok(_) => true,
    }
}

async fn send_udp(addr: &str, lines: &[String]) -> std::io::Result<()> {
    let socket = tokio::net::UdpSocket::bind("0.0.0.0:0").await?;
    socket.connect(addr).await?;
    let mut datagram = String::new();
    for line in lines {
        if !datagram.is_empty() && datagram.len() + 1 + line.len() > MAX_DATAGRAM {
            socket.send(datagram.as_bytes()).await?;
            datagram.clear();
        }
        if !datagram.is_empty() {
            datagram.push('\n');
        }
        datagram.push_str(line);
    }
    if !datagram.is_empty() {
        socket.send(datagram.as_bytes()).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

    #[test]
    fn each_flush_sends_increases_and_samples_with_their_rate() {
        let metrics = Metrics::new(10, 64);
        metrics.response_samples.enable();
        let stats = metrics.limit(r#"domain="gw",key1="user""#);
        stats.total_hits.fetch_add(3, Relaxed);
        metrics.response_time.observe(0.002);
        metrics.response_samples.record(0.002);
        let mut flusher = Flusher::default();
        let tags = vec![("env".to_owned(), "prod".to_owned())];
        let first = flusher.lines(&metrics, Some(&tags));
        assert!(
            first.contains(
                &"ratelimit.service.rate_limit.gw.user.total_hits:3|c|#env:prod".to_owned()
            ),
            "{first:?}"
        );
        assert!(
            first.contains(
                &"ratelimit_server.ShouldRateLimit.total_requests:1|c|#env:prod".to_owned()
            ),
            "{first:?}"
        );
        assert!(
            first.contains(
                &"ratelimit_server.ShouldRateLimit.response_time:2.000|ms|#env:prod".to_owned()
            ),
            "{first:?}"
        );
        stats.total_hits.fetch_add(2, Relaxed);
        let second = flusher.lines(&metrics, None);
        assert_eq!(
            second,
            ["ratelimit.service.rate_limit.gw.user.total_hits:2|c"]
        );
        for _ in 0..1500 {
            metrics.response_samples.record(0.001);
        }
        let third = flusher.lines(&metrics, None);
        assert_eq!(third.len(), 1000, "samples are bounded");
        assert!(third[0].ends_with("|ms|@0.666667"), "{}", third[0]);
    }

    /// A statsd that accepts and never reads: a flush that cannot be written
    /// gives up within the timeout and drops the connection, instead of
    /// waiting forever (and stopping every later flush).
    #[tokio::test]
    async fn a_statsd_that_stops_reading_times_out_and_is_reconnected() {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.set_recv_buffer_size(4096).expect("small buffer");
        socket
            .bind("127.0.0.1:0".parse().expect("addr"))
            .expect("bind");
        let listener = socket.listen(8).expect("listen");
        let addr = listener.local_addr().expect("addr").to_string();
        let (accepted_tx, mut accepted) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            // Accepts, holds every connection, reads nothing.
            while let Ok((stream, _)) = listener.accept().await {
                let _ = accepted_tx.send(stream);
            }
        });
        let lines: Vec<String> = (0..20_000)
            .map(|i| format!("ratelimit.service.rate_limit.d.k_{i:08}.total_hits:1|c"))
            .collect();
        let timeout = Duration::from_millis(200);
        let mut conn = None;
        let mut failed = None;
        for _ in 0..20 {
            let started = std::time::Instant::now();
            match send_tcp(&addr, &mut conn, &lines, timeout).await {
                Ok(()) => {}
                Err(e) => {
                    failed = Some((e, started.elapsed()));
                    break;
                }
            }
        }
        let (error, took) = failed.expect("the buffers fill and a flush times out");
        assert_eq!(error.kind(), std::io::ErrorKind::TimedOut, "{error}");
        assert!(error.to_string().contains("--statsd-timeout"), "{error}");
        assert!(took < Duration::from_secs(2), "{took:?}");
        assert!(conn.is_none(), "the stuck connection is dropped");
        // The next flush connects again.
        let _ = send_tcp(&addr, &mut conn, &lines[..1], timeout).await;
        for which in ["the first connection", "a new one after the timeout"] {
            tokio::time::timeout(Duration::from_secs(5), accepted.recv())
                .await
                .unwrap_or_else(|_| panic!("{which}"))
                .expect(which);
        }
    }

    /// A statsd that closes its connection between flushes: the next flush
    /// notices and sends on a new connection, instead of writing its lines
    /// into a closed one.
    #[tokio::test]
    async fn a_closed_connection_is_made_again_before_a_flush() {
        use tokio::io::AsyncReadExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let received = tokio::spawn(async move {
            let mut text = String::new();
            for _ in 0..2 {
                let (mut stream, _) = listener.accept().await.expect("accept");
                let mut buf = vec![0u8; 4096];
                let n = stream.read(&mut buf).await.expect("read");
                text.push_str(&String::from_utf8_lossy(&buf[..n]));
                // Closed after one flush.
            }
            text
        });
        let timeout = Duration::from_secs(2);
        let mut conn = None;
        send_tcp(&addr, &mut conn, &["a:1|c".to_string()], timeout)
            .await
            .expect("first flush");
        // Let the statsd read and close.
        tokio::time::sleep(Duration::from_millis(100)).await;
        send_tcp(&addr, &mut conn, &["b:1|c".to_string()], timeout)
            .await
            .expect("second flush");
        let text = tokio::time::timeout(Duration::from_secs(5), received)
            .await
            .expect("both flushes arrive")
            .expect("joined");
        assert_eq!(text, "a:1|c\nb:1|c\n");
    }
}
