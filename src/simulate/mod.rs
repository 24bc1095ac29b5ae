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

pub(crate) mod envoy;
pub(crate) mod generate;
pub(crate) mod replay;
pub(crate) mod traffic;

use crate::report::{self, ScenarioResult};
pub(crate) use generate::Generate;
pub(crate) use replay::replay;
pub(crate) use traffic::Event;

/// The most bins of a series (per rule and scenario): a narrow `--bin`
/// over a long span would otherwise ask for more memory than there is.
pub(crate) const MAX_BINS: u64 = 1_000_000;

/// What to simulate.
#[derive(Debug, Clone, Default)]
pub(crate) struct Simulation {
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
    /// The most requests held in memory (`--max-events`): the traffic
    /// files', with what is generated beside them; each costs about 250
    /// bytes while the run lasts. Generated traffic alone is made again for
    /// each scenario instead of being held, so it is not bounded by this.
    pub max_events: usize,
    /// The most requests generated traffic alone may make
    /// (`--max-generated`): a bound on the run's time, not its memory.
    pub max_generated: usize,
}

/// The traffic of a simulation: held (read from files, sorted by time), or
/// generated as it is replayed (a spec alone, which makes the same events
/// each time it is read).
pub(crate) enum Traffic {
    Held(Vec<Event>),
    Generated {
        spec: Generate,
        /// How many events it makes, and the first's and last's times.
        count: u64,
        span: (Nanos, Nanos),
    },
}

impl Traffic {
    /// Generated traffic: read once through to count it and find its span.
    fn generated(spec: Generate) -> Self {
        let (mut count, mut first, mut last) = (0u64, None, 0);
        for event in generate::Generated::new(&spec) {
            count += 1;
            first.get_or_insert(event.at);
            last = event.at;
        }
        let span = (first.unwrap_or(0), last);
        Self::Generated { spec, count, span }
    }

    /// How many events it has.
    pub(crate) fn len(&self) -> u64 {
        match self {
            Self::Held(events) => events.len() as u64,
            Self::Generated { count, .. } => *count,
        }
    }

    /// The first event's and the last's times.
    fn span(&self) -> (Nanos, Nanos) {
        match self {
            Self::Held(events) => (
                events.first().map_or(0, |e| e.at),
                events.last().map_or(0, |e| e.at),
            ),
            Self::Generated { span, .. } => *span,
        }
    }

    /// Replays it under `rules` (see [`replay`]).
    fn replay(
        &self,
        scenario: &str,
        rules: crate::rules::RuleSet,
        bin: Nanos,
        progress: &dyn Fn(u64),
    ) -> ScenarioResult {
        match self {
            Self::Held(events) => replay(scenario, rules, events, self.span(), bin, progress),
            Self::Generated { spec, .. } => replay(
                scenario,
                rules,
                generate::Generated::new(spec),
                self.span(),
                bin,
                progress,
            ),
        }
    }

    /// Writes it as JSON lines (`--save-traffic`).
    fn save(&self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        match self {
            Self::Held(events) => traffic::to_jsonl(events, out),
            Self::Generated { spec, .. } => traffic::to_jsonl(generate::Generated::new(spec), out),
        }
    }
}

/// Loads the traffic, sorted by time; the importer's notes (what the log
/// could not give) come back too.
pub(crate) fn load_traffic(sim: &Simulation) -> Result<(Traffic, Vec<String>), String> {
    // Read first, whatever the traffic: a configuration that does not load
    // is an error even when no access log needs it.
    let config = match &sim.envoy_config {
        Some(path) => Some(envoy::EnvoyConfig::load(path)?),
        None => None,
    };
    if let (Some(g), true) = (&sim.generate, sim.traffic.is_empty()) {
        if g.expected() > sim.max_generated as f64 {
            return Err(format!(
                "--generate asks for about {:.0} requests, more than --max-generated {}",
                g.expected(),
                sim.max_generated
            ));
        }
        // Nothing to merge it with: made again for each replay, never held.
        return Ok((Traffic::generated(g.clone()), Vec::new()));
    }
    let mut events = Vec::new();
    let mut notes = Vec::new();
    for path in &sim.traffic {
        match &config {
            Some(config) => {
                let (more, mut said) = envoy::import(config, path)?;
                events.extend(more);
                notes.append(&mut said);
            }
            // The first file's events are the list itself: a copy of
            // millions of events costs more than reading them.
            None if events.is_empty() => events = traffic::read_jsonl(path)?,
            None => events.extend(traffic::read_jsonl(path)?),
        }
        if events.len() > sim.max_events {
            return Err(format!(
                "more than {} requests in the traffic (at {}): raise --max-events, or give less traffic",
                sim.max_events,
                path.display()
            ));
        }
    }
    if let Some(g) = &sim.generate {
        let room = sim.max_events - events.len();
        if g.expected() > room as f64 {
            return Err(format!(
                "--generate asks for about {:.0} requests, more than the {room} left of --max-events {}",
                g.expected(),
                sim.max_events
            ));
        }
        events.extend(generate::generate(g, room));
    }
    if events.is_empty() {
        // What the importer could not read says why nothing was imported.
        let why: String = notes.iter().map(|n| format!("\n  {n}")).collect();
        return Err(format!(
            "no traffic: give --traffic FILE or --generate SPEC{}{why}",
            if why.is_empty() {
                ""
            } else {
                "; the traffic given had none:"
            }
        ));
    }
    events.sort_by_key(|e| e.at);
    Ok((Traffic::Held(events), notes))
}

/// Replays `events` under every rule set and algorithm. `progress` gets the
/// number of events done (over all scenarios) now and then.
pub(crate) fn run(
    sim: &Simulation,
    traffic: &Traffic,
    progress: &dyn Fn(u64),
) -> Result<Vec<ScenarioResult>, String> {
    let (first, last) = traffic.span();
    let span = last - first;
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
    let labels = labels(&sim.rules);
    for (path, file) in sim.rules.iter().zip(labels) {
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
    // The bound is on every series together: each rule of each scenario
    // has one series of `bins` bins.
    let series: u64 = scenarios
        .iter()
        .map(|(_, r)| r.rules().len().max(1) as u64)
        .sum();
    if bins.saturating_mul(series) > MAX_BINS {
        return Err(format!(
            "{bins} bins for each of {series} rule series is more than {MAX_BINS} bins in all: give a wider --bin"
        ));
    }
    let mut outcomes = Vec::new();
    for (i, (scenario, rules)) in scenarios.into_iter().enumerate() {
        let base = i as u64 * traffic.len();
        outcomes.push(traffic.replay(&scenario, rules, bin, &|n| progress(base + n)));
    }
    Ok(outcomes)
}

/// A label per rule path: its file name, with as many parent directories as
/// it takes to tell paths with the same name apart (`a/rules.yaml`,
/// `b/rules.yaml`), and a number when even the whole paths agree.
fn labels(paths: &[std::path::PathBuf]) -> Vec<String> {
    let label = |path: &std::path::Path, depth: usize| {
        let parts: Vec<String> = path
            .components()
            .rev()
            .take(depth)
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        let text: Vec<&str> = parts.iter().rev().map(String::as_str).collect();
        text.join("/")
    };
    let deepest = paths
        .iter()
        .map(|p| p.components().count())
        .max()
        .unwrap_or(1);
    let mut labels: Vec<String> = paths.iter().map(|p| label(p, 1)).collect();
    for depth in 2..=deepest {
        let clash = |l: &Vec<String>| (0..l.len()).any(|i| l[..i].contains(&l[i]));
        if !clash(&labels) {
            break;
        }
        labels = paths.iter().map(|p| label(p, depth)).collect();
    }
    let mut seen: Vec<String> = Vec::new();
    for label in &mut labels {
        let mut n = 1;
        let base = label.clone();
        while seen.contains(label) {
            n += 1;
            *label = format!("{base} ({n})");
        }
        seen.push(label.clone());
    }
    labels
}

/// `tollgate simulate`, from the command line: prints the summary, writes
/// `--out`, and says how fast the replay ran.
pub(crate) fn run_cli(
    sim: &Simulation,
    out: Option<&std::path::Path>,
    save_traffic: Option<&std::path::Path>,
) -> Result<(), String> {
    let loading = Instant::now();
    let (traffic, notes) = load_traffic(sim)?;
    for note in &notes {
        eprintln!("tollgate simulate: {note}");
    }
    if let Some(path) = save_traffic {
        let mut file = std::io::BufWriter::new(
            std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?,
        );
        traffic
            .save(&mut file)
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    eprintln!(
        "tollgate simulate: {} requests {} in {:.2} s",
        traffic.len(),
        if matches!(traffic, Traffic::Held(_)) {
            "loaded"
        } else {
            "to generate (counted)"
        },
        loading.elapsed().as_secs_f64()
    );
    let scenarios = sim.rules.len() * sim.algorithms.len().max(1);
    let total = traffic.len() * scenarios as u64;
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
    let outcomes = run(sim, &traffic, &|n| bar.set_position(n))?;
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

#[cfg(test)]
mod label_tests {
    use super::labels;
    use std::path::PathBuf;

    #[test]
    fn rule_sets_with_one_file_name_get_labels_of_their_own() {
        let paths: Vec<PathBuf> = ["a/rules.yaml", "b/rules.yaml", "c/x.yaml", "a/rules.yaml"]
            .iter()
            .map(PathBuf::from)
            .collect();
        assert_eq!(
            labels(&paths),
            [
                "a/rules.yaml",
                "b/rules.yaml",
                "c/x.yaml",
                "a/rules.yaml (2)"
            ]
        );
        let plain: Vec<PathBuf> = ["x.yaml", "y.yaml"].iter().map(PathBuf::from).collect();
        assert_eq!(labels(&plain), ["x.yaml", "y.yaml"]);
    }
}
