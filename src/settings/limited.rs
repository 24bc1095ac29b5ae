//! Who is being limited (`/limited`, `/counters`, `/ui`, `tollgate top`):
//! the view's bounds and the admin port's credential for resets.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::values::{OnOff, at_least_one, parse_duration};
use crate::limited::LimitedOptions;
use crate::limiter::RefusalLog;

/// The view of the heaviest limited clients, and who may reset counters.
#[derive(Debug, Clone, Args)]
pub(crate) struct LimitedArgs {
    /// Who is being limited (/limited): clients held per rule (a client
    /// refused more than 1/N of the rule's refusals is always shown);
    /// 0 turns the view off (and its cost on every request).
    /// At most 10,000.
    #[arg(
        long = "limited-clients",
        env = "TOLLGATE_LIMITED_CLIENTS",
        default_value_t = 32,
        value_parser = limited_clients
    )]
    pub clients: usize,

    /// /limited: rules tracked per thread; refusals by more rules are only
    /// counted (tollgate_limited_untracked_total). At most 100,000.
    #[arg(id = "limited_rules", value_name = "LIMITED_RULES", long = "limited-rules", env = "TOLLGATE_LIMITED_RULES", default_value_t = 200, value_parser = limited_rules)]
    pub rules: usize,

    /// /limited: the most memory the whole view holds, whatever the cores,
    /// the rules, the clients per rule or the requests' entries (each held
    /// client is counted at its largest, about 1.3 KiB); clients beyond are
    /// only counted (tollgate_limited_untracked_total).
    #[arg(long = "limited-max-bytes", env = "TOLLGATE_LIMITED_MAX_BYTES", default_value = "64MiB", value_parser = super::values::parse_bytes)]
    pub max_bytes: usize,

    /// /limited: how far back the view looks (it forgets a quarter of this
    /// at a time).
    #[arg(id = "limited_window", value_name = "LIMITED_WINDOW", long = "limited-window", env = "TOLLGATE_LIMITED_WINDOW", default_value = "5m", value_parser = parse_window)]
    pub window: Duration,

    /// Ranks per rule in tollgate_limited_top_refusals (the heaviest
    /// clients' refusals, labelled by rank, never by client); 0: none.
    #[arg(
        long = "limited-metric-ranks",
        env = "TOLLGATE_LIMITED_METRIC_RANKS",
        default_value_t = 3
    )]
    pub metric_ranks: usize,

    /// At which level refusals are logged: each with every descriptor of
    /// the request, the rule and its file:line, the request and trace ids.
    #[arg(long = "log-refusals", env = "TOLLGATE_LOG_REFUSALS", value_enum, default_value_t = RefusalLogArg::Info)]
    pub log_refusals: RefusalLogArg,

    /// The most refusal lines a second (one key at most once a second in
    /// any case); each line counts the refusals left unlogged before it.
    #[arg(
        long = "refusal-log-rate",
        env = "TOLLGATE_REFUSAL_LOG_RATE",
        default_value_t = 100
    )]
    pub refusal_log_rate: u32,

    /// Who may read clients' counters (/limited, /counters, /json, /rlqs,
    /// /ui): `open` (anyone who reaches the admin port, as /metrics) or
    /// `token` (a bearer token from --admin-token-file, a read-only one
    /// too; the page is off).
    #[arg(long = "admin-reads", env = "TOLLGATE_ADMIN_READS", value_enum, default_value_t = AdminReads::Open)]
    pub admin_reads: AdminReads,

    /// A file of bearer tokens that may reset counters on the admin port
    /// (POST /counters/reset), one per line, optionally `NAME:TOKEN` (the
    /// name is logged with each reset; split at the first colon) and
    /// `read NAME:TOKEN` for a token that only reads. Re-read when it
    /// changes and on SIGHUP. Without it, resets are refused.
    #[arg(long = "admin-token-file", env = "TOLLGATE_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,

    /// `off` serves a token file that other users may read or write, or
    /// its group write (mode & 027; its group may read it, as a Kubernetes
    /// Secret's 0440); `on` refuses it (at start-up, and on a reload by
    /// refusing every token): a token others can read is not a secret.
    #[arg(long = "admin-token-file-mode-check", env = "TOLLGATE_ADMIN_TOKEN_FILE_MODE_CHECK", value_enum, default_value_t = OnOff::On)]
    pub admin_token_file_mode_check: OnOff,

    /// Requests with a wrong or missing token one address may make within
    /// --admin-auth-failure-window; past it, the address is answered 429
    /// (with Retry-After) without its token being checked.
    #[arg(long = "admin-auth-max-failures", env = "TOLLGATE_ADMIN_AUTH_MAX_FAILURES", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    pub admin_auth_max_failures: u32,

    /// How long an address's failed token attempts are remembered.
    #[arg(long = "admin-auth-failure-window", env = "TOLLGATE_ADMIN_AUTH_FAILURE_WINDOW", default_value = "1m", value_parser = parse_duration)]
    pub admin_auth_failure_window: Duration,

    /// The most addresses whose failed attempts are remembered; when that
    /// many are within their window, new addresses share one budget.
    #[arg(long = "admin-auth-max-callers", env = "TOLLGATE_ADMIN_AUTH_MAX_CALLERS", default_value_t = 10_000, value_parser = at_least_one)]
    pub admin_auth_max_callers: usize,

    /// The most counters one reset of a rule or a domain may clear, whatever
    /// its body's `max_keys` asks (the keys found are held while they are
    /// deleted).
    #[arg(long = "admin-reset-max-keys", env = "TOLLGATE_ADMIN_RESET_MAX_KEYS", default_value_t = crate::admin::RESET_MAX_KEYS, value_parser = super::values::at_least_one)]
    pub admin_reset_max_keys: usize,
}

/// `--admin-reads`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum AdminReads {
    /// Open to anyone who reaches the admin port.
    Open,
    /// A bearer token from --admin-token-file.
    Token,
}

/// `--log-refusals`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RefusalLogArg {
    /// Not logged (still counted in metrics and in /limited).
    Off,
    /// At info.
    Info,
    /// At warn (shown at the `ratelimit` mode's default level).
    Warn,
}

impl From<RefusalLogArg> for RefusalLog {
    fn from(arg: RefusalLogArg) -> Self {
        match arg {
            RefusalLogArg::Off => RefusalLog::Off,
            RefusalLogArg::Info => RefusalLog::Info,
            RefusalLogArg::Warn => RefusalLog::Warn,
        }
    }
}

/// `--limited-clients`: a bound, so a typo cannot grow the view (each
/// client slot may hold about 1.3 KiB, per rule and thread).
fn limited_clients(text: &str) -> Result<usize, String> {
    bounded(text, 10_000)
}

/// `--limited-rules`.
fn limited_rules(text: &str) -> Result<usize, String> {
    match bounded(text, 100_000)? {
        0 => Err("must be at least 1".into()),
        n => Ok(n),
    }
}

fn bounded(text: &str, most: usize) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if n <= most => Ok(n),
        Ok(n) => Err(format!("{n} is above the bound of {most}")),
        Err(_) => Err(format!("'{text}' is not a whole number")),
    }
}

fn parse_window(text: &str) -> Result<Duration, String> {
    let window = parse_duration(text)?;
    if window < Duration::from_secs(4) {
        return Err(format!(
            "{text}: the window is at least 4s (it moves a quarter at a time)"
        ));
    }
    Ok(window)
}

impl LimitedArgs {
    /// The throttle on failed token attempts.
    pub(crate) fn failure_limits(&self) -> crate::admin::FailureLimits {
        crate::admin::FailureLimits {
            max: self.admin_auth_max_failures,
            window: self.admin_auth_failure_window,
            callers: self.admin_auth_max_callers,
        }
    }

    /// The view's options, `None` when it is off.
    pub(crate) fn options(&self) -> Option<LimitedOptions> {
        (self.clients > 0).then_some(LimitedOptions {
            clients: self.clients,
            rules: self.rules,
            window: self.window,
            metric_ranks: self.metric_ranks.min(self.clients),
            max_bytes: self.max_bytes,
        })
    }
}
