//! Logging: `tracing` to stdout through a non-blocking writer, so a slow log consumer never
//! stalls a request. Access-log lines are ordinary events with target `access`, written by a
//! layer of their own so they can have a format of their own (`--access-log-format`): the
//! `upstream` format's events carry the finished line, written as it is.

use std::fmt;

use tracing::field::{Field, Visit};
use tracing_appender::non_blocking::{NonBlocking, WorkerGuard};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::Registry;
use tracing_subscriber::filter::FilterFn;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
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
    /// How they are written.
    pub access_format: AccessLogFormat,
}

/// `--access-log-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessLogFormat {
    /// An event like every other log line, as text.
    Text,
    /// An event like every other log line, as JSON.
    Json,
    /// ingress-nginx's `upstream` line, nothing around it.
    Upstream,
}

/// The target of access-log events.
const ACCESS: &str = "access";

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
        // Buffered: under load the writer thread takes many lines per wake-up, and one write
        // for all of them beats a syscall per line. It flushes whenever its queue runs dry, so
        // a quiet proxy's lines are not held back.
        .finish(std::io::BufWriter::with_capacity(
            64 * 1024,
            std::io::stdout(),
        ));
    let general = |meta: &tracing::Metadata<'_>| meta.target() != ACCESS;
    let access = |meta: &tracing::Metadata<'_>| meta.target() == ACCESS;
    let logs = layer(args.format.into(), writer.clone(), FilterFn::new(general));
    let access_lines = layer(args.access_format, writer, FilterFn::new(access));
    tracing_subscriber::registry()
        .with(filter)
        .with(vec![logs, access_lines])
        .try_init()
        .map_err(|_| TelemetryError::AlreadyInstalled)?;
    Ok(guard)
}

type Boxed = Box<dyn Layer<tracing_subscriber::layer::Layered<EnvFilter, Registry>> + Send + Sync>;

/// One output layer, for the events `only` lets through.
fn layer(
    format: AccessLogFormat,
    writer: NonBlocking,
    only: FilterFn<impl Fn(&tracing::Metadata<'_>) -> bool + Send + Sync + 'static>,
) -> Boxed {
    let fmt = tracing_subscriber::fmt::layer().with_writer(writer);
    match format {
        AccessLogFormat::Text => Box::new(fmt.with_ansi(false).with_filter(only)),
        AccessLogFormat::Json => Box::new(fmt.json().flatten_event(true).with_filter(only)),
        AccessLogFormat::Upstream => Box::new(fmt.event_format(MessageOnly).with_filter(only)),
    }
}

impl From<LogFormat> for AccessLogFormat {
    fn from(format: LogFormat) -> Self {
        match format {
            LogFormat::Text => AccessLogFormat::Text,
            LogFormat::Json => AccessLogFormat::Json,
        }
    }
}

/// Writes an event's message and nothing else: the access line is already whole.
struct MessageOnly;

impl<S, N> FormatEvent<S, N> for MessageOnly
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> fmt::Result {
        struct Message<'w, 'a>(&'w mut Writer<'a>, fmt::Result);
        impl Visit for Message<'_, '_> {
            fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
                if field.name() == "message" {
                    self.1 = write!(self.0, "{value:?}");
                }
            }
        }
        let mut message = Message(&mut writer, Ok(()));
        event.record(&mut message);
        message.1?;
        writeln!(writer)
    }
}
