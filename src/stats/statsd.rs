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
pub enum Protocol {
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
pub struct StatsdOptions {
    /// `host:port`.
    pub addr: String,
    /// TCP or UDP.
    pub protocol: Protocol,
    /// Time between flushes.
    pub flush_interval: Duration,
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
            Protocol::Tcp => send_tcp(&options.addr, &mut tcp, &lines).await,
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

async fn send_tcp(
    addr: &str,
    conn: &mut Option<tokio::net::TcpStream>,
    lines: &[String],
) -> std::io::Result<()> {
    let mut text = lines.join("\n");
    text.push('\n');
    if conn.is_none() {
        *conn = Some(tokio::net::TcpStream::connect(addr).await?);
    }
    let Some(stream) = conn.as_mut() else {
        return Ok(());
    };
    if let Err(e) = stream.write_all(text.as_bytes()).await {
        *conn = None;
        return Err(e);
    }
    Ok(())
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
}
