//! Logging: `tracing` events and access-log lines to stdout, through one buffer that a thread
//! of its own writes in batches (`proxy::log_lines`), so a request never waits for a `write`.
//! `text` access lines are ordinary events with target `access`, written by a layer of their
//! own; `json` and `upstream` lines are written by the proxy itself (`proxy::access_log`), into
//! the same buffer, and obey the same log filter.

use std::fmt;

use tracing::field::{Field, Visit};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::Registry;
use tracing_subscriber::filter::FilterFn;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

use crate::proxy::log_lines::{LogLines, LogLinesGuard};
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
    #[error("cannot start the log writer thread: {0}")]
    Writer(std::io::Error),
}

/// The installed logger. Keep it alive: dropping it writes what is still buffered and stops
/// the writer thread.
pub struct Logging {
    /// Where the proxy writes `json` and `upstream` access lines.
    pub lines: LogLines,
    /// Whether access lines are written at all: `--access-log`, and a log filter that lets
    /// target `access` through at `info` (`--log-level warn` does not; `warn,access=info`
    /// does).
    pub access: bool,
    _guard: LogLinesGuard,
}

/// Installs the global subscriber.
pub fn init(args: &LogSettings) -> Result<Logging, TelemetryError> {
    let filter = |filter: &str| {
        EnvFilter::try_new(filter).map_err(|source| TelemetryError::Filter {
            filter: filter.to_string(),
            source,
        })
    };
    let mut events = filter(&args.filter)?;
    let access = args.access_log && lets_access_through(filter(&args.filter)?);
    if !args.access_log {
        events = events.add_directive("access=off".parse().map_err(|source| {
            TelemetryError::Filter {
                filter: "access=off".into(),
                source,
            }
        })?);
    }
    let pipe = crate::proxy::log_lines::widen_pipe(std::io::stdout());
    let (lines, guard) = LogLines::start(std::io::stdout()).map_err(TelemetryError::Writer)?;
    let general = |meta: &tracing::Metadata<'_>| meta.target() != ACCESS;
    let access_events = |meta: &tracing::Metadata<'_>| meta.target() == ACCESS;
    let logs = layer(
        args.format.into(),
        LineWriter {
            lines: lines.clone(),
            now: true,
        },
        FilterFn::new(general),
    );
    let access_lines = layer(
        args.access_format,
        LineWriter {
            lines: lines.clone(),
            now: false,
        },
        FilterFn::new(access_events),
    );
    tracing_subscriber::registry()
        .with(events)
        .with(vec![logs, access_lines])
        .try_init()
        .map_err(|_| TelemetryError::AlreadyInstalled)?;
    // Said once logging is up, so an operator chasing log-writer wake-ups can see what took.
    match pipe {
        Some(size) => tracing::debug!(pipe_bytes = size, "stdout is a pipe"),
        None => tracing::debug!("stdout is not a pipe; left as it is"),
    }
    Ok(Logging {
        lines,
        access,
        _guard: guard,
    })
}

/// Whether `filter` lets an `info` event of target `access` through: asked once, of a
/// subscriber that holds only the filter.
fn lets_access_through(filter: EnvFilter) -> bool {
    let probe = tracing_subscriber::registry().with(filter);
    tracing::subscriber::with_default(
        probe,
        || tracing::enabled!(target: "access", tracing::Level::INFO),
    )
}

/// The log buffer as `tracing_subscriber`'s writer: the formatter hands over each event as
/// one `write_all` of its whole line. Access lines are batched; the other events (few, and
/// someone may be following them) are written at once.
#[derive(Clone)]
struct LineWriter {
    lines: LogLines,
    now: bool,
}

impl std::io::Write for LineWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.now {
            self.lines.push_now(buf);
        } else {
            self.lines.push(buf);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for LineWriter {
    type Writer = LineWriter;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

type Boxed = Box<dyn Layer<tracing_subscriber::layer::Layered<EnvFilter, Registry>> + Send + Sync>;

/// One output layer, for the events `only` lets through.
fn layer(
    format: AccessLogFormat,
    writer: LineWriter,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_lines_are_on_when_the_filter_lets_their_target_through_at_info() {
        for (filter, on) in [
            ("info", true),
            ("debug", true),
            ("warn", false),
            ("error", false),
            ("warn,access=info", true),
            ("info,access=warn", false),
            ("info,access=off", false),
            ("off,access=trace", true),
            ("ingress=debug", false),
        ] {
            let parsed = EnvFilter::try_new(filter).unwrap_or_else(|e| panic!("{filter}: {e}"));
            assert_eq!(lets_access_through(parsed), on, "{filter}");
        }
    }
}
