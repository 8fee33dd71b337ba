//! Logging: `tracing` to stdout through a non-blocking writer, so a slow log consumer never
//! stalls a request. Access-log lines are ordinary events with target `access`.

use tracing_appender::non_blocking::WorkerGuard;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// What the logger is set up with (from flags).
#[derive(Clone, Debug)]
pub struct LogSettings {
    pub format: LogFormat,
    /// `tracing` EnvFilter syntax.
    pub filter: String,
    /// Whether access-log lines (target `access`) are written.
    pub access_log: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("invalid log filter {filter:?}: {source}")]
    Filter {
        filter: String,
        source: tracing_subscriber::filter::ParseError,
    },
    #[error("a global logger is already installed")]
    AlreadyInstalled,
}

/// Installs the global subscriber. Keep the guard alive: dropping it flushes and stops the
/// writer thread.
pub fn init(args: &LogSettings) -> Result<WorkerGuard, TelemetryError> {
    let mut filter = EnvFilter::try_new(&args.filter).map_err(|source| TelemetryError::Filter {
        filter: args.filter.clone(),
        source,
    })?;
    if !args.access_log {
        filter = filter.add_directive("access=off".parse().map_err(|source| {
            TelemetryError::Filter {
                filter: "access=off".into(),
                source,
            }
        })?);
    }
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(false)
        .finish(std::io::stdout());
    let registry = tracing_subscriber::registry().with(filter);
    let result = match args.format {
        LogFormat::Text => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(writer)
                    .with_ansi(false),
            )
            .try_init(),
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_writer(writer),
            )
            .try_init(),
    };
    result.map_err(|_| TelemetryError::AlreadyInstalled)?;
    Ok(guard)
}
