//! Shared plumbing for the `chunk_bench` and `extract_bench` binaries: loading the HTML corpus, describing the
//! machine, timing repeated runs and summarising chunk lengths.
//!
//! Throughput everywhere is decimal megabytes (10^6 bytes) of input per second, computed from the median of
//! several timed runs: the build machine is shared, and a median shrugs off the odd run that lost the CPU to
//! another process, where a mean would not.

#![warn(missing_docs)]

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where Debian's `postgresql-doc-15` package installs the HTML manual.
pub const DEFAULT_CORPUS_DIR: &str = "/usr/share/doc/postgresql-doc-15/html";

/// Why a benchmark could not run; always names the file or setting involved.
#[derive(Debug)]
pub struct BenchError(pub String);

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BenchError {}

/// One HTML file of the corpus, raw.
#[derive(Debug, Clone)]
pub struct HtmlFile {
    /// File name without the directory, e.g. `sql-select.html`.
    pub name: String,
    /// The file's content. Invalid UTF-8 is replaced (the manual is UTF-8, so this only guards odd installs).
    pub html: String,
}

/// Reads every `*.html` file of `dir`, sorted by name so that every run sees the corpus in the same order.
pub fn load_html_corpus(dir: &Path) -> Result<Vec<HtmlFile>, BenchError> {
    let entries = std::fs::read_dir(dir).map_err(|e| {
        BenchError(format!(
            "cannot read the corpus directory {}: {e} (install it with `apt-get install -y postgresql-doc-15`)",
            dir.display()
        ))
    })?;
    let mut paths: Vec<PathBuf> = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| BenchError(format!("cannot list {}: {e}", dir.display())))?;
        let path = entry.path();
        if path.extension().is_some_and(|ext| ext == "html") {
            paths.push(path);
        }
    }
    paths.sort();
    if paths.is_empty() {
        return Err(BenchError(format!("no .html files in {}", dir.display())));
    }
    paths
        .iter()
        .map(|path| {
            let bytes = std::fs::read(path)
                .map_err(|e| BenchError(format!("cannot read {}: {e}", path.display())))?;
            Ok(HtmlFile {
                name: file_name(path),
                html: String::from_utf8_lossy(&bytes).into_owned(),
            })
        })
        .collect()
}

/// The last component of `path` as text, or the whole path when it has none.
pub fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// Reads the corpus directory from `--corpus DIR` in `args`, falling back to [`DEFAULT_CORPUS_DIR`].
pub fn corpus_dir_from_args(args: &[String]) -> PathBuf {
    flag_value(args, "--corpus")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CORPUS_DIR))
}

/// The value following `flag` in `args`, if any.
pub fn flag_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

/// Parses `--iterations N` (at least 1), defaulting to `default` when absent.
pub fn iterations_from_args(args: &[String], default: usize) -> Result<usize, BenchError> {
    match flag_value(args, "--iterations") {
        None => Ok(default),
        Some(raw) => match raw.parse::<usize>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => Err(BenchError(format!(
                "--iterations must be a whole number of at least 1, got {raw:?}"
            ))),
        },
    }
}

/// What the numbers were measured on; printed with every result because throughput means nothing without it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Machine {
    /// CPUs this process may run on (what `nproc` prints).
    pub cpus: usize,
    /// The first `model name` of `/proc/cpuinfo`.
    pub cpu_model: String,
    /// `rustc --version` of the compiler on PATH (the one `cargo run` used, barring overrides).
    pub rustc: String,
    /// `/proc/loadavg` when the run started: a busy machine explains slow numbers.
    pub load_average: String,
}

impl Machine {
    /// Gathers the description; anything unreadable is reported as `unknown` rather than failing the benchmark.
    pub fn detect() -> Machine {
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0);
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|info| cpu_model_from_cpuinfo(&info))
            .unwrap_or_else(|| "unknown".to_string());
        let rustc = std::process::Command::new("rustc")
            .arg("--version")
            .output()
            .ok()
            .filter(|out| out.status.success())
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string())
            .unwrap_or_else(|| "unknown".to_string());
        let load_average = std::fs::read_to_string("/proc/loadavg")
            .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_else(|_| "unknown".to_string());
        Machine {
            cpus,
            cpu_model,
            rustc,
            load_average,
        }
    }
}

impl fmt::Display for Machine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "nproc {}, CPU \"{}\", {}, load average at start {}",
            self.cpus, self.cpu_model, self.rustc, self.load_average
        )
    }
}

/// The value of the first `model name` line of a `/proc/cpuinfo` text.
pub fn cpu_model_from_cpuinfo(cpuinfo: &str) -> Option<String> {
    cpuinfo.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key.trim() == "model name").then(|| value.trim().to_string())
    })
}

/// Durations of repeated runs of one piece of work.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    durations: Vec<Duration>,
}

impl Samples {
    /// An empty set of samples.
    pub fn new() -> Samples {
        Samples::default()
    }

    /// Runs `work` once, records how long it took and hands back its result so the caller can keep it alive
    /// (a result dropped unread would let the optimiser question the work).
    pub fn time<T>(&mut self, work: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let result = std::hint::black_box(work());
        self.durations.push(start.elapsed());
        result
    }

    /// Adds an already measured duration.
    pub fn push(&mut self, duration: Duration) {
        self.durations.push(duration);
    }

    /// How many runs were recorded.
    pub fn len(&self) -> usize {
        self.durations.len()
    }

    /// Whether no run was recorded.
    pub fn is_empty(&self) -> bool {
        self.durations.is_empty()
    }

    /// The median run time (the mean of the middle two for an even count); `None` without samples.
    pub fn median(&self) -> Option<Duration> {
        let mut sorted = self.durations.clone();
        sorted.sort();
        let n = sorted.len();
        match n {
            0 => None,
            _ if n % 2 == 1 => Some(sorted[n / 2]),
            _ => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2),
        }
    }

    /// The fastest run; `None` without samples.
    pub fn min(&self) -> Option<Duration> {
        self.durations.iter().min().copied()
    }

    /// The slowest run; `None` without samples.
    pub fn max(&self) -> Option<Duration> {
        self.durations.iter().max().copied()
    }
}

/// Decimal megabytes per second for `bytes` processed in `elapsed`; `0.0` for a zero duration rather than infinity.
pub fn megabytes_per_second(bytes: usize, elapsed: Duration) -> f64 {
    let seconds = elapsed.as_secs_f64();
    if seconds > 0.0 {
        bytes as f64 / seconds / 1_000_000.0
    } else {
        0.0
    }
}

/// Count, mean, minimum and maximum of chunk lengths in chars, plus their sum for the overlap ratio.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LengthStats {
    /// Number of chunks.
    pub count: usize,
    /// Sum of all chunk lengths.
    pub total_chars: usize,
    /// Shortest chunk; 0 when there are none.
    pub min_chars: usize,
    /// Longest chunk; 0 when there are none.
    pub max_chars: usize,
    /// Chunks longer than the configured size (both splitters promise none).
    pub over_limit: usize,
    /// Chunks shorter than a quarter of the configured size: fragments that embed poorly (a lone heading or
    /// caption), which rag_chunk tries to avoid at the end of a document.
    pub under_quarter: usize,
}

impl LengthStats {
    /// Summarises chunk lengths (in chars) against the configured maximum `limit`.
    pub fn from_lengths(lengths: impl IntoIterator<Item = usize>, limit: usize) -> LengthStats {
        let mut stats = LengthStats::default();
        for length in lengths {
            stats.min_chars = if stats.count == 0 {
                length
            } else {
                stats.min_chars.min(length)
            };
            stats.count += 1;
            stats.total_chars += length;
            stats.max_chars = stats.max_chars.max(length);
            if length > limit {
                stats.over_limit += 1;
            }
            if length.saturating_mul(4) < limit {
                stats.under_quarter += 1;
            }
        }
        stats
    }

    /// Mean chunk length; 0 when there are no chunks.
    pub fn mean_chars(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.total_chars as f64 / self.count as f64
        }
    }

    /// Chars emitted per char of input: above 1 by the overlap actually carried, below 1 by trimmed whitespace.
    pub fn expansion(&self, input_chars: usize) -> f64 {
        if input_chars == 0 {
            0.0
        } else {
            self.total_chars as f64 / input_chars as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_count_is_middle_value() {
        let mut samples = Samples::new();
        for ms in [30, 10, 20] {
            samples.push(Duration::from_millis(ms));
        }
        assert_eq!(samples.median(), Some(Duration::from_millis(20)));
        assert_eq!(samples.min(), Some(Duration::from_millis(10)));
        assert_eq!(samples.max(), Some(Duration::from_millis(30)));
    }

    #[test]
    fn median_of_even_count_averages_middle_pair() {
        let mut samples = Samples::new();
        for ms in [40, 10, 20, 30] {
            samples.push(Duration::from_millis(ms));
        }
        assert_eq!(samples.median(), Some(Duration::from_millis(25)));
    }

    #[test]
    fn median_without_samples_is_none() {
        assert!(Samples::new().median().is_none());
        assert!(Samples::new().is_empty());
    }

    #[test]
    fn time_records_one_sample_and_returns_result() {
        let mut samples = Samples::new();
        let value = samples.time(|| 6 * 7);
        assert_eq!(value, 42);
        assert_eq!(samples.len(), 1);
    }

    #[test]
    fn throughput_is_decimal_megabytes() {
        assert_eq!(
            megabytes_per_second(3_000_000, Duration::from_millis(500)),
            6.0
        );
        assert_eq!(megabytes_per_second(10, Duration::ZERO), 0.0);
    }

    #[test]
    fn length_stats_summarise_and_flag_oversized_chunks() {
        let stats = LengthStats::from_lengths([100, 300, 50, 1001], 1000);
        assert_eq!(stats.count, 4);
        assert_eq!(stats.min_chars, 50);
        assert_eq!(stats.max_chars, 1001);
        assert_eq!(stats.over_limit, 1);
        assert_eq!(
            stats.under_quarter, 2,
            "100 and 50 are under 1000 / 4, 300 is not"
        );
        assert_eq!(stats.mean_chars(), 362.75);
        assert_eq!(stats.expansion(1451), 1.0);
    }

    #[test]
    fn length_stats_of_nothing_are_zero() {
        let stats = LengthStats::from_lengths([], 1000);
        assert_eq!(stats.count, 0);
        assert_eq!(stats.mean_chars(), 0.0);
        assert_eq!(stats.expansion(0), 0.0);
    }

    #[test]
    fn cpu_model_is_first_model_name_line() {
        let info = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n\nprocessor\t: 1\nmodel name\t: other\n";
        assert_eq!(
            cpu_model_from_cpuinfo(info).as_deref(),
            Some("AMD EPYC 7B13")
        );
        assert_eq!(cpu_model_from_cpuinfo("flags : fpu\n"), None);
    }

    #[test]
    fn iterations_flag_is_validated() {
        let args: Vec<String> = ["--iterations", "0"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert!(iterations_from_args(&args, 5).is_err());
        let args: Vec<String> = ["--iterations", "9"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(iterations_from_args(&args, 5).ok(), Some(9));
        assert_eq!(iterations_from_args(&[], 5).ok(), Some(5));
    }

    #[test]
    fn corpus_loading_reports_a_missing_directory() {
        let err = load_html_corpus(Path::new("/nonexistent/rag-bench-corpus"))
            .expect_err("a missing directory must fail");
        assert!(err.to_string().contains("/nonexistent/rag-bench-corpus"));
    }
}
