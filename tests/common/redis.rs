//! Real `redis-server` processes on free loopback ports: a standalone server
//! and a three-master cluster made with `redis-cli --cluster create`.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn require(program: &str) {
    let found = Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        found,
        "{program} is needed by this test: install it (Debian: apt-get install redis-server redis-tools), \
         or run ./scripts/test.sh, which installs it"
    );
}

/// A port free now and never handed out before in this test process: a
/// server a test stopped leaves its port to the kernel, and a Tollgate still
/// reconnecting to it must not find another test's Redis there (it would
/// count its hits in that Redis).
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..1000 {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
    panic!("no port free that this test process has not used already")
}

/// A `redis-server` on a free port, killed on drop.
pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    cluster: bool,
    /// Extra `redis-server` arguments, kept for a restart.
    extra: Vec<String>,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// On a free port; another one when a parallel test took it between
    /// `free_port` and the server's bind (redis-server then exits).
    pub fn start() -> Self {
        Self::on_a_free_port(false, &[])
    }

    /// Started on a free port, trying another when the one picked was taken
    /// before redis-server could bind it.
    fn on_a_free_port(cluster: bool, extra: &[&str]) -> Self {
        for _ in 0..4 {
            let mut server = Self::launch(
                free_port(),
                cluster,
                extra,
                tempfile::tempdir().expect("tempdir"),
            );
            if server.up() {
                return server;
            }
        }
        panic!("redis-server did not start on any of four free ports");
    }

    fn spawn(port: u16, cluster: bool, extra: &[&str], dir: tempfile::TempDir) -> Self {
        let server = Self::launch(port, cluster, extra, dir);
        server.wait_until_up();
        server
    }

    /// Whether the server answers within 10 s (false at once when it
    /// exited, as it does when its port is taken).
    fn up(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.cli(&["PING"]).trim() == "PONG" {
                return true;
            }
            if let Some(child) = self.child.as_mut()
                && child.try_wait().ok().flatten().is_some()
            {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    fn launch(port: u16, cluster: bool, extra: &[&str], dir: tempfile::TempDir) -> Self {
        require("redis-server");
        let mut cmd = Command::new("redis-server");
        cmd.args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        // DEBUG SLEEP lets tests hold Redis in the middle of a call.
        .args(["--enable-debug-command", "yes"])
        // Replicas sync at once (Redis 7 waits 5 s for more to join).
        .args(["--repl-diskless-sync-delay", "0"])
        .arg("--dir")
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        if cluster {
            cmd.args([
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
            ]);
        }
        cmd.args(extra);
        let child = cmd.spawn().expect("start redis-server");
        outlive_not(child.id(), &format!("127.0.0.1:{port}"));
        RedisServer {
            child: Some(child),
            port,
            cluster,
            extra: extra.iter().map(|a| (*a).to_owned()).collect(),
            dir,
        }
    }

    fn wait_until_up(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.cli(&["PING"]).trim() == "PONG" {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server on port {} did not start", self.port);
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Runs `redis-cli` against this server and returns its output.
    pub fn cli(&self, args: &[&str]) -> String {
        require("redis-cli");
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Writes `key` as no script of Tollgate's would: `lua` is a Lua
    /// expression, a table packed as MessagePack, anything else as it is
    /// (a poisoned value for the scripts to read).
    pub fn poison(&self, key: &str, lua: &str) {
        let script = format!(
            "local v = {lua}; if type(v) == 'table' then v = cmsgpack.pack(v) end; return redis.call('SET', KEYS[1], v)"
        );
        assert_eq!(
            self.cli(&["EVAL", &script, "1", key]).trim(),
            "OK",
            "{key} = {lua}"
        );
    }

    /// Kills the server (SIGKILL: no goodbye to clients).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, empty (scripts gone).
    pub fn restart(&mut self) {
        self.kill();
        let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().expect("tempdir"));
        drop(dir);
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        let fresh = Self::spawn(
            self.port,
            self.cluster,
            &extra,
            tempfile::tempdir().expect("tempdir"),
        );
        *self = fresh;
    }

    /// Stops (SIGSTOP) or resumes (SIGCONT) the server: a hung node, whose
    /// connections stay open and unanswered.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        let status = Command::new("kill")
            .args([signal, &pid])
            .status()
            .expect("kill");
        assert!(status.success(), "kill {signal} {pid}");
    }

    /// The `host:port` others reach it at.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Its role (`master` or `slave`), from `ROLE`.
    pub fn role(&self) -> String {
        self.cli(&["ROLE"]).lines().next().unwrap_or("").to_owned()
    }

    /// Counters (every key but the calls' receipts) with their PTTL.
    pub fn counters_with_ttl(&self) -> Vec<(String, i64)> {
        let mut keys = self.keys_with_ttl();
        keys.retain(|(k, _)| !is_receipt(k));
        keys
    }

    /// The counters' names, one per line, as `redis-cli --scan` lists them.
    pub fn counter_names(&self) -> String {
        self.cli(&["--scan"])
            .lines()
            .filter(|k| !is_receipt(k))
            .map(|k| format!("{k}\n"))
            .collect()
    }

    /// Every key (counters and receipts) with its PTTL.
    pub fn keys_with_ttl(&self) -> Vec<(String, i64)> {
        self.cli(&["--scan"])
            .lines()
            .filter(|k| !k.is_empty())
            .map(|k| {
                let ttl = self.cli(&["PTTL", k]).trim().parse().unwrap_or(-3);
                (k.to_owned(), ttl)
            })
            .collect()
    }

    /// Holds the server for `seconds` (`DEBUG SLEEP`, sent from a thread),
    /// as a CPU-starved or swapping Redis would be: returns once it has
    /// stopped answering, which a PING of this test's own no longer gets an
    /// answer within 50 ms says. Not a fixed "give it a moment": the stall
    /// is known to have begun.
    pub fn stall(&self, seconds: &str) -> Stall {
        require("redis-cli");
        let port = self.port.to_string();
        let seconds = seconds.to_owned();
        let sleeper = std::thread::spawn(move || {
            let out = Command::new("redis-cli")
                .args(["-p", &port, "DEBUG", "SLEEP", &seconds])
                .output()
                .expect("redis-cli DEBUG SLEEP");
            String::from_utf8_lossy(&out.stdout).trim().to_owned()
        });
        let mut probe = std::net::TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        probe
            .set_read_timeout(Some(Duration::from_millis(50)))
            .expect("timeout");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            assert!(
                Instant::now() < deadline && !sleeper.is_finished(),
                "Redis on port {} never stalled",
                self.port
            );
            std::io::Write::write_all(&mut probe, b"PING\r\n").expect("PING");
            let mut pong = [0u8; 7];
            match std::io::Read::read_exact(&mut probe, &mut pong) {
                Ok(()) => std::thread::sleep(Duration::from_millis(2)),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    break;
                }
                Err(e) => panic!("PING: {e}"),
            }
        }
        let probe_port = probe.local_addr().expect("addr").port();
        Stall {
            sleeper,
            port: self.port,
            probe_port,
            _probe: probe,
        }
    }

    /// `calls=` of one command in `INFO commandstats`.
    pub fn calls(&self, command: &str) -> u64 {
        let info = self.cli(&["INFO", "commandstats"]);
        let prefix = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }
}

/// A Redis held by `DEBUG SLEEP` (see [`RedisServer::stall`]).
pub struct Stall {
    sleeper: std::thread::JoinHandle<String>,
    port: u16,
    /// The test's own PING connection, whose unanswered PING is not a
    /// client's call.
    probe_port: u16,
    _probe: std::net::TcpStream,
}

impl Stall {
    /// Bytes clients have sent the stalled server that it has not read yet
    /// (the kernel's receive queues, `/proc/net/tcp`): a call that reached
    /// Redis and waits for it. The test's own PING is not counted.
    pub fn waiting_bytes(&self) -> u64 {
        let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
        table
            .lines()
            .skip(1)
            .filter_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let port = |addr: &str| {
                    addr.rsplit(':')
                        .next()
                        .and_then(|p| u16::from_str_radix(p, 16).ok())
                };
                let established = fields.get(3) == Some(&"01");
                let ours = port(fields.get(1)?)? == self.port;
                let probe = port(fields.get(2)?)? == self.probe_port;
                let queued = fields.get(4)?.split(':').nth(1)?;
                (established && ours && !probe)
                    .then(|| u64::from_str_radix(queued, 16).ok())
                    .flatten()
            })
            .sum()
    }

    /// Waits for the stall to end; `DEBUG SLEEP`'s answer (`OK`).
    pub fn join(self) -> String {
        self.sleeper.join().expect("DEBUG SLEEP thread")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether `key` is a script call's receipt (see `batch.lua`), not a counter.
pub fn is_receipt(key: &str) -> bool {
    key.contains("}:call:")
}

/// A three-master Redis Cluster on free ports.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> Self {
        Self::start_with(0, &[])
    }

    /// Three masters with `replicas` replicas each (masters first in
    /// `nodes`), every node started with `extra` arguments.
    pub fn start_with(replicas: usize, extra: &[&str]) -> Self {
        let nodes: Vec<RedisServer> = (0..3 * (1 + replicas))
            .map(|_| RedisServer::on_a_free_port(true, extra))
            .collect();
        require("redis-cli");
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ok = nodes
                .iter()
                .all(|n| n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"));
            // Synced replicas (a replica that never synced does not fail over).
            let replicated = nodes
                .iter()
                .filter(|n| {
                    n.cli(&["INFO", "replication"])
                        .contains("master_link_status:up")
                })
                .count()
                == 3 * replicas;
            if ok && replicated {
                break;
            }
            assert!(Instant::now() < deadline, "cluster did not become ready");
            std::thread::sleep(Duration::from_millis(50));
        }
        RedisCluster { nodes }
    }

    /// Seed nodes, comma-separated, as `--redis-url` takes them.
    pub fn urls(&self) -> String {
        self.nodes
            .iter()
            .map(|n| n.url())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The master serving `key`'s slot, as the first node sees it.
    pub fn master_of(&self, key: &str) -> usize {
        let slot: i64 = self.nodes[0]
            .cli(&["CLUSTER", "KEYSLOT", key])
            .trim()
            .parse()
            .expect("a slot");
        // CLUSTER NODES: id, host:port@bus, flags, master, ..., then ranges.
        let nodes = self.nodes[0].cli(&["CLUSTER", "NODES"]);
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 9 || !fields[2].contains("master") {
                continue;
            }
            let serves = fields[8..].iter().any(|range| {
                let (start, end) = range.split_once('-').unwrap_or((range, range));
                matches!((start.parse::<i64>(), end.parse::<i64>()), (Ok(a), Ok(b)) if a <= slot && slot <= b)
            });
            let port = fields[1]
                .split('@')
                .next()
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| p.parse::<u16>().ok());
            if serves && let Some(port) = port {
                return self
                    .nodes
                    .iter()
                    .position(|n| n.port == port)
                    .expect("a node of this cluster");
            }
        }
        panic!("no master for slot {slot} in {nodes}");
    }

    pub fn keys_with_ttl(&self) -> Vec<(String, i64)> {
        self.nodes.iter().flat_map(|n| n.keys_with_ttl()).collect()
    }

    pub fn counters_with_ttl(&self) -> Vec<(String, i64)> {
        self.nodes
            .iter()
            .flat_map(|n| n.counters_with_ttl())
            .collect()
    }

    pub fn calls(&self, command: &str) -> u64 {
        self.nodes.iter().map(|n| n.calls(command)).sum()
    }
}

/// Script calls (`EVAL` and `EVALSHA`) counted in an `INFO commandstats`
/// answer.
pub fn script_calls_in(commandstats: &str) -> u64 {
    commandstats
        .lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Makes sure process `pid` (a server this test process started, whose
/// command line shows `marker`) does not outlive the test process: a
/// watchdog ends it once the test process is gone. Servers held in statics
/// are never dropped, and a test run left them running (issue 24: four
/// `redis-server`s after every `./scripts/test.sh`). The marker guards
/// against a reused pid.
pub fn outlive_not(pid: u32, marker: &str) {
    let script = format!(
        "while kill -0 {test} 2>/dev/null; do sleep 1; done; \
         tr '\\0' ' ' < /proc/{pid}/cmdline 2>/dev/null | grep -qF -- '{marker}' && kill -9 {pid}",
        test = std::process::id()
    );
    let _ = Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
}

/// The Redis Cluster hash slot of `key` (CRC16/XMODEM of its hash tag, or
/// of the whole key when it has none), computed here so that a test can
/// pick many names in one slot without asking Redis for each.
pub fn slot_of(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &bytes[open + 1..];
        rest.iter()
            .position(|&b| b == b'}')
            .filter(|&close| close > 0)
            .map(|close| &rest[..close])
    });
    let mut crc: u16 = 0;
    for &byte in tagged.unwrap_or(bytes) {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16_384
}

impl RedisCluster {
    /// Moves `slot` from master `from` to master `to` as `redis-cli
    /// --cluster reshard` does, by hand so that a test controls its pace:
    /// IMPORTING on the target, MIGRATING on the source, `MIGRATE` of
    /// `batch` keys at a time until the source has none, then the slot
    /// given to the target on every master. Returns how many keys moved.
    pub fn migrate_slot(&self, slot: u16, from: usize, to: usize, batch: usize) -> usize {
        let connect = |n: usize| {
            redis::Client::open(self.nodes[n].url())
                .and_then(|c| c.get_connection())
                .expect("a connection to a Cluster node")
        };
        let id = |n: usize| self.nodes[n].cli(&["CLUSTER", "MYID"]).trim().to_owned();
        let (from_id, to_id) = (id(from), id(to));
        let (mut source, mut target) = (connect(from), connect(to));
        let setslot = |conn: &mut redis::Connection, state: &str, node: &str| {
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg(state)
                .arg(node)
                .query::<()>(conn)
                .expect("CLUSTER SETSLOT");
        };
        setslot(&mut target, "IMPORTING", &from_id);
        setslot(&mut source, "MIGRATING", &to_id);
        let mut moved = 0;
        loop {
            let keys: Vec<Vec<u8>> = redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(batch)
                .query(&mut source)
                .expect("CLUSTER GETKEYSINSLOT");
            if keys.is_empty() {
                break;
            }
            moved += keys.len();
            redis::cmd("MIGRATE")
                .arg("127.0.0.1")
                .arg(self.nodes[to].port)
                .arg("")
                .arg(0)
                .arg(5_000)
                .arg("KEYS")
                .arg(&keys)
                .query::<()>(&mut source)
                .expect("MIGRATE");
        }
        // The target first, then the source, then the others (as the
        // Redis Cluster specification orders it).
        setslot(&mut target, "NODE", &to_id);
        setslot(&mut source, "NODE", &to_id);
        for n in (0..3).filter(|&n| n != from && n != to) {
            setslot(&mut connect(n), "NODE", &to_id);
        }
        moved
    }
}
