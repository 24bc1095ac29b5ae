//! `tollgate simulate`: replays timestamped requests through the limiter
//! on a simulated clock, under one or more rule sets and algorithms, and
//! reports what each rule would have done.
//!
//! The replay uses the production [`crate::limiter::Limiter`] with the
//! memory store and a manual clock: the same rule loader, matcher and
//! algorithms as `serve`, no second implementation.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

use crate::algorithm::Algorithm;
use crate::clock::Nanos;
use crate::rules::{LoadOptions, load_paths};

pub mod envoy_log;
pub mod replay;
pub mod report;
pub mod traffic;

pub use replay::{Outcome, RuleResult, replay};
pub use traffic::{Event, Generate};

/// The most bins of a series (per rule and scenario): a narrow `--bin`
/// over a long span would otherwise ask for more memory than there is.
pub const MAX_BINS: u64 = 1_000_000;

/// What to simulate.
#[derive(Debug, Clone, Default)]
pub struct Simulation {
    /// Rule sets to compare: each a file or directory.
    pub rules: Vec<PathBuf>,
    /// Traffic files: JSON lines, or Envoy access logs with `envoy_config`.
    pub traffic: Vec<PathBuf>,
    /// The Envoy configuration whose routes' `rate_limits` turn access log
    /// lines into descriptors.
    pub envoy_config: Option<PathBuf>,
    /// Generated traffic, added to the files'.
    pub generate: Option<Generate>,
    /// Algorithms to compare (none: each limit's own).
    pub algorithms: Vec<Algorithm>,
    /// How rules are loaded.
    pub load: LoadOptions,
    /// The series' bin width (`None`: chosen for about 300 points).
    pub bin: Option<Nanos>,
}

/// Loads the traffic, sorted by time; the importer's notes (what the log
/// could not give) come back too.
pub fn load_traffic(sim: &Simulation) -> Result<(Vec<Event>, Vec<String>), String> {
    let mut events = Vec::new();
    let mut notes = Vec::new();
    let config = match &sim.envoy_config {
        Some(path) => Some(envoy_log::EnvoyConfig::load(path)?),
        None => None,
    };
    for path in &sim.traffic {
        match &config {
            Some(config) => {
                let (more, mut said) = envoy_log::import(config, path)?;
                events.extend(more);
                notes.append(&mut said);
            }
            None => events.extend(traffic::read_jsonl(path)?),
        }
    }
    if let Some(g) = &sim.generate {
        events.extend(traffic::generate(g));
    }
    if events.is_empty() {
        return Err("no traffic: give --traffic FILE or --generate SPEC".into());
    }
    events.sort_by_key(|e| e.at);
    Ok((events, notes))
}

/// Replays `events` under every rule set and algorithm. `progress` gets the
/// number of events done (over all scenarios) now and then.
pub fn run(
    sim: &Simulation,
    events: &[Event],
    progress: &dyn Fn(u64),
) -> Result<Vec<Outcome>, String> {
    let span = events.last().map_or(0, |e| e.at) - events.first().map_or(0, |e| e.at);
    let bin = sim.bin.unwrap_or_else(|| replay::bin_for(span, 300));
    let bins = span / bin.max(1) + 1;
    if bins > MAX_BINS {
        return Err(format!(
            "{bins} bins of {bin} ns over {:.0} s of traffic is more than {MAX_BINS}: give a wider --bin",
            span as f64 / 1e9
        ));
    }
    let algorithms: Vec<Option<Algorithm>> = if sim.algorithms.is_empty() {
        vec![None]
    } else {
        sim.algorithms.iter().copied().map(Some).collect()
    };
    // Every rule set is loaded before anything is replayed: a bad file
    // stops the run at once, not after the scenarios before it.
    let mut scenarios = Vec::new();
    for path in &sim.rules {
        let file = path.file_name().map_or_else(
            || path.display().to_string(),
            |f| f.to_string_lossy().into_owned(),
        );
        for algorithm in &algorithms {
            let options = LoadOptions {
                algorithm_override: *algorithm,
                ..sim.load
            };
            let rules = load_paths(std::slice::from_ref(path), &options)
                .map_err(|e| format!("rules not loaded from {}:\n{e}", path.display()))?;
            let scenario = match algorithm {
                Some(a) => format!("{file}, {a}"),
                None => file.clone(),
            };
            scenarios.push((scenario, rules));
        }
    }
    let mut outcomes = Vec::new();
    for (i, (scenario, rules)) in scenarios.into_iter().enumerate() {
        let base = i as u64 * events.len() as u64;
        outcomes.push(replay(&scenario, rules, events, bin, &|n| {
            progress(base + n)
        }));
    }
    Ok(outcomes)
}

/// `tollgate simulate`, from the command line: prints the summary, writes
/// `--out`, and says how fast the replay ran.
pub fn main(
    sim: &Simulation,
    out: Option<&std::path::Path>,
    save_traffic: Option<&std::path::Path>,
) -> Result<(), String> {
    let loading = Instant::now();
    let (events, notes) = load_traffic(sim)?;
    for note in &notes {
        eprintln!("tollgate simulate: {note}");
    }
    if let Some(path) = save_traffic {
        let mut file = std::io::BufWriter::new(
            std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?,
        );
        traffic::to_jsonl(&events, &mut file).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    eprintln!(
        "tollgate simulate: {} requests loaded in {:.2} s",
        events.len(),
        loading.elapsed().as_secs_f64()
    );
    let scenarios = sim.rules.len() * sim.algorithms.len().max(1);
    let total = events.len() as u64 * scenarios as u64;
    let bar = if std::io::stderr().is_terminal() {
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} replaying [{bar:40}] {pos}/{len} requests ({per_sec}, {eta} left)",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        bar
    } else {
        indicatif::ProgressBar::hidden()
    };
    let replaying = Instant::now();
    let outcomes = run(sim, &events, &|n| bar.set_position(n))?;
    bar.finish_and_clear();
    let seconds = replaying.elapsed().as_secs_f64();
    print!("{}", report::summary_text(&outcomes));
    eprintln!(
        "tollgate simulate: replayed {total} requests in {seconds:.2} s ({:.0} requests/s)",
        total as f64 / seconds.max(1e-9)
    );
    if let Some(dir) = out {
        report::write_all(dir, &outcomes)?;
        eprintln!(
            "tollgate simulate: wrote summary.json, series.csv, series.json and report.html to {}",
            dir.display()
        );
    }
    Ok(())
}
