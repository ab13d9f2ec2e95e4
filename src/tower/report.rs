//! What a response says about the queue it came through, for the callers
//! that read it (see [`client`](super::client)): the admission level in
//! [`LEVEL_HEADER`], on every response by default, and, opt-in, a load
//! report in [`LOAD_HEADER`], in ORCA's text form.
//!
//! Both are written here and read back here, so that the two sides agree
//! on one format; what a reader does with a value that does not parse (it
//! takes it as no information) is the client's rule.

use std::fmt;
use std::io::Write;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};

use super::client::Downstreams;
use crate::cpu::Controller;
use crate::grant::SlotGranter;
use crate::queue::{QueueLoad, WorkQueue};
use crate::sync::{StdArc, StdMutex};
use crate::work::Priority;
use tokio::time::Instant;

/// The header carrying the queue's admission level: the lowest priority it
/// still admits now, as a ladder value (`-128..=127`; `-128`, the bottom
/// of the ladder, when it admits everything). Callers may drop work below
/// it before sending it. How the queue decides it: the rule on
/// [`HttpAdmissionLayer::admission_level_header`](super::HttpAdmissionLayer::admission_level_header).
pub const LEVEL_HEADER: &str = "x-admission-level";

/// The header carrying a load report in ORCA's text form
/// (`TEXT name=value,...`, as Envoy and gRPC's `endpoint-load-metrics`
/// read it); see [`LoadReport`].
pub const LOAD_HEADER: &str = "endpoint-load-metrics";

/// The request header that asks for a load report (ORCA's per-request
/// reporting, as Envoy, Triton and vLLM spell it): a server with load
/// reports on answers a request that carries it, whatever format it names,
/// in the text form, which names itself.
pub(super) const LOAD_FORMAT_HEADER: &str = "endpoint-load-metrics-format";

const LEVEL: HeaderName = HeaderName::from_static(LEVEL_HEADER);
const LOAD: HeaderName = HeaderName::from_static(LOAD_HEADER);
pub(super) const LOAD_FORMAT: HeaderName = HeaderName::from_static(LOAD_FORMAT_HEADER);

/// A load report: what a server said about its load on one response.
///
/// In the header, in this order and each only when known:
/// `cpu_utilization` (the CPU controller's busy share of the runtime's
/// workers over the last few milliseconds, 0.0..=1.0), `rps_fractional`
/// (the rate admitted work completes at, per second),
/// `named_metrics.in_flight` (slots held), `named_metrics.queue_length`
/// (requests waiting) and `named_metrics.wait_p50_ms` (the median wait of
/// work admitted in the last few tens of milliseconds, the upper bound of
/// its power-of-two bucket). For example
/// `TEXT cpu_utilization=0.82,rps_fractional=1950,named_metrics.in_flight=2,named_metrics.queue_length=14,named_metrics.wait_p50_ms=4.096`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct LoadReport {
    /// `cpu_utilization`.
    pub cpu_utilization: Option<f64>,
    /// `rps_fractional`.
    pub rps_fractional: Option<f64>,
    /// `named_metrics.in_flight`.
    pub in_flight: Option<f64>,
    /// `named_metrics.queue_length`.
    pub queue_length: Option<f64>,
    /// `named_metrics.wait_p50_ms`, as a duration.
    pub wait_p50: Option<Duration>,
}

/// The longest load report read: ours is under 160 bytes; a longer value
/// is not worth the parse.
const MAX_REPORT: usize = 512;

impl LoadReport {
    fn of(load: &QueueLoad, cpu_utilization: Option<f64>) -> Self {
        LoadReport {
            cpu_utilization,
            rps_fractional: Some(load.completions_per_sec),
            in_flight: Some(load.in_flight as f64),
            queue_length: Some(load.waiting as f64),
            wait_p50: load.recent_wait_p50,
        }
    }

    /// The header value. One allocation (the value's bytes): the text is
    /// written on the stack first.
    fn to_header(self) -> Option<HeaderValue> {
        let mut buffer = [0u8; 256];
        let mut text = std::io::Cursor::new(&mut buffer[..]);
        text.write_all(b"TEXT ").ok()?;
        let mut first = true;
        let mut field = |text: &mut std::io::Cursor<&mut [u8]>, name: &str, value: Option<f64>| {
            let Some(value) = value.filter(|v| v.is_finite() && *v >= 0.0) else {
                return Ok(());
            };
            let comma = if first { "" } else { "," };
            first = false;
            // Integral values without a fraction: `3`, not `3.000`.
            if value.fract() == 0.0 && value < 1e15 {
                write!(text, "{comma}{name}={value:.0}")
            } else {
                write!(text, "{comma}{name}={value:.3}")
            }
        };
        field(&mut text, "cpu_utilization", self.cpu_utilization).ok()?;
        field(&mut text, "rps_fractional", self.rps_fractional).ok()?;
        field(&mut text, "named_metrics.in_flight", self.in_flight).ok()?;
        field(&mut text, "named_metrics.queue_length", self.queue_length).ok()?;
        let wait_ms = self.wait_p50.map(|wait| wait.as_secs_f64() * 1e3);
        field(&mut text, "named_metrics.wait_p50_ms", wait_ms).ok()?;
        let written = usize::try_from(text.position()).ok()?;
        HeaderValue::from_bytes(&buffer[..written]).ok()
    }

    /// Reads a report from a header value; `None` (no information) for
    /// anything but a well-formed text report: another format, a value
    /// over 512 bytes, an entry that is not `name=value` (or `name:value`,
    /// which Envoy also reads), a name given twice, or a value that is not
    /// a finite, non-negative number. Names it does not know are skipped.
    pub(super) fn parse(value: &HeaderValue) -> Option<LoadReport> {
        let bytes = value.as_bytes();
        if bytes.len() > MAX_REPORT {
            return None;
        }
        let text = std::str::from_utf8(bytes.strip_prefix(b"TEXT ")?).ok()?;
        let mut report = LoadReport::default();
        for entry in text.split(',') {
            let (name, number) = entry.split_once(['=', ':'])?;
            let (name, number) = (name.trim(), number.trim());
            // Rust's float parser takes `inf` and `NaN`: neither is a load.
            let number: f64 = number
                .parse()
                .ok()
                .filter(|n: &f64| n.is_finite() && *n >= 0.0)?;
            let slot = match name {
                "cpu_utilization" => &mut report.cpu_utilization,
                "rps_fractional" => &mut report.rps_fractional,
                "named_metrics.in_flight" => &mut report.in_flight,
                "named_metrics.queue_length" => &mut report.queue_length,
                "named_metrics.wait_p50_ms" => {
                    if report.wait_p50.is_some() {
                        return None;
                    }
                    report.wait_p50 = Some(Duration::try_from_secs_f64(number / 1e3).ok()?);
                    continue;
                }
                "" => return None,
                _ => continue,
            };
            if slot.replace(number).is_some() {
                return None;
            }
        }
        Some(report)
    }
}

/// The digits (and sign) of every ladder value and their length, built at
/// compile time, so that the level header is a static string on every
/// response rather than a number formatted into a fresh buffer. A static,
/// so that [`LEVEL_TEXT`] can borrow its bytes for `'static`.
static LEVEL_DIGITS: [([u8; 4], usize); 256] = {
    let mut table = [([0u8; 4], 0usize); 256];
    let mut raw = 0usize;
    while raw < 256 {
        let value = raw as u8 as i8 as i16;
        let mut digits = [0u8; 4];
        let mut len = 0;
        let mut magnitude = if value < 0 { -value } else { value };
        if value < 0 {
            digits[0] = b'-';
            len = 1;
        }
        let width = if magnitude >= 100 {
            3
        } else if magnitude >= 10 {
            2
        } else {
            1
        };
        let mut place = len + width;
        while place > len {
            place -= 1;
            digits[place] = b'0' + (magnitude % 10) as u8;
            magnitude /= 10;
        }
        table[raw] = (digits, len + width);
        raw += 1;
    }
    table
};

/// [`LEVEL_DIGITS`] as text, checked once, at compile time.
static LEVEL_TEXT: [&str; 256] = {
    let mut table = [""; 256];
    let mut raw = 0usize;
    while raw < 256 {
        let (digits, len) = &LEVEL_DIGITS[raw];
        table[raw] = match std::str::from_utf8(digits.split_at(*len).0) {
            Ok(text) => text,
            Err(_) => panic!("a level's digits are ASCII"),
        };
        raw += 1;
    }
    table
};

/// `level` as a header value, without allocating.
pub(super) fn level_value(level: Priority) -> HeaderValue {
    HeaderValue::from_static(LEVEL_TEXT[usize::from(level.get() as u8)])
}

/// Reads a level header: an optional `-` and one to three ASCII digits
/// within `-128..=127`, nothing else (no `+`, no spaces inside, no other
/// base); `None` otherwise.
pub(super) fn parse_level(value: &HeaderValue) -> Option<Priority> {
    let bytes = value.as_bytes();
    let (negative, digits) = match bytes.split_first()? {
        (b'-', rest) => (true, rest),
        _ => (false, bytes),
    };
    if digits.is_empty() || digits.len() > 3 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let magnitude = digits
        .iter()
        .fold(0i16, |n, digit| n * 10 + i16::from(digit - b'0'));
    let value = if negative { -magnitude } else { magnitude };
    i8::try_from(value).ok().map(Priority::new)
}

/// Which reports the HTTP-mode layer writes on its responses.
#[derive(Clone, Copy, Debug)]
pub(super) struct Reports {
    pub(super) level: bool,
    pub(super) load: bool,
}

impl Default for Reports {
    fn default() -> Self {
        Reports {
            level: true,
            load: false,
        }
    }
}

/// Where the reports come from: the layer's queue, and its controller
/// when the layer owns one (for the CPU utilization).
pub(super) struct Reporter {
    queue: WorkQueue<SlotGranter>,
    controller: Option<StdArc<Controller>>,
    /// The endpoints the service calls, whose levels its own includes.
    downstreams: Option<Downstreams>,
    /// The last load report and when it goes stale: made again once it
    /// is [`LOAD_REFRESH`] old, so that a response costs a clock read, a
    /// leaf lock and a reference count instead of the queue's lock and a
    /// number formatted per figure. Shared by the layer's services.
    load: StdArc<StdMutex<Option<(Instant, HeaderValue)>>>,
}

/// How old a load report may be: the CPU controller's tick, which is as
/// often as its utilization changes.
const LOAD_REFRESH: Duration = Duration::from_millis(1);

impl Reporter {
    pub(super) fn new(
        queue: WorkQueue<SlotGranter>,
        controller: Option<StdArc<Controller>>,
    ) -> Self {
        Reporter {
            queue,
            controller,
            downstreams: None,
            load: StdArc::default(),
        }
    }

    /// The same reporter, its level including what `downstreams` believes
    /// of the endpoints it calls.
    pub(super) fn with_downstreams(&self, downstreams: Downstreams) -> Self {
        Reporter {
            queue: self.queue.clone(),
            controller: self.controller.clone(),
            downstreams: Some(downstreams),
            load: StdArc::default(),
        }
    }

    /// The level a response reports: the queue's own, or the highest level
    /// believed for a downstream, whichever is higher.
    fn level(&self, own: Priority) -> Priority {
        let downstream = self
            .downstreams
            .as_ref()
            .and_then(Downstreams::highest_level);
        downstream.map_or(own, |downstream| own.max(downstream))
    }

    /// Writes the reports `reports` asks for into `headers`, replacing
    /// what the handler put there under the same names: only the layer
    /// knows the queue's state.
    pub(super) fn stamp(&self, reports: Reports, headers: &mut HeaderMap) {
        if reports.level {
            headers.insert(LEVEL, level_value(self.level(self.queue.admission_level())));
        }
        if reports.load {
            if let Some(value) = self.load_report() {
                headers.insert(LOAD, value);
            }
        }
    }

    /// The load report, made again when the last one is
    /// [`LOAD_REFRESH`] old.
    fn load_report(&self) -> Option<HeaderValue> {
        let now = Instant::now();
        let mut cached = self.load.lock().unwrap_or_else(crate::sync::recover);
        if let Some((stale_at, value)) = cached.as_ref() {
            if now < *stale_at {
                return Some(value.clone());
            }
        }
        let load = self.queue.load();
        let utilization = self.controller.as_ref().and_then(|c| c.cpu_utilization());
        let value = LoadReport::of(&load, utilization).to_header()?;
        *cached = Some((now.checked_add(LOAD_REFRESH).unwrap_or(now), value.clone()));
        Some(value)
    }
}

impl fmt::Debug for Reporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reporter")
            .field("queue", &self.queue.name())
            .field("controller", &self.controller.is_some())
            .field("downstreams", &self.downstreams)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_level_is_written_as_its_decimal_value_and_read_back() {
        for raw in i8::MIN..=i8::MAX {
            let value = level_value(Priority::new(raw));
            assert_eq!(value, raw.to_string().as_str());
            assert_eq!(parse_level(&value), Some(Priority::new(raw)));
        }
    }

    #[test]
    fn a_level_that_is_not_a_plain_ladder_value_is_no_level() {
        let rows: &[&[u8]] = &[
            b"",
            b"-",
            b"+5",
            b"128",
            b"-129",
            b"0127",
            b"1000",
            b" 5",
            b"5 ",
            b"5,6",
            b"0x10",
            b"1e2",
            b"high",
            b"--1",
            b"\xff\xfe",
            b"99999999999999999999999",
        ];
        for &bytes in rows {
            let Ok(value) = HeaderValue::from_bytes(bytes) else {
                continue;
            };
            assert_eq!(parse_level(&value), None, "{bytes:?}");
        }
    }

    #[test]
    fn a_load_report_round_trips_through_its_text_form() {
        let report = LoadReport {
            cpu_utilization: Some(0.82),
            rps_fractional: Some(1950.25),
            in_flight: Some(2.0),
            queue_length: Some(14.0),
            wait_p50: Some(Duration::from_micros(4096)),
        };
        let value = report.to_header().expect("fits");
        assert_eq!(
            value,
            "TEXT cpu_utilization=0.820,rps_fractional=1950.250,named_metrics.in_flight=2,\
             named_metrics.queue_length=14,named_metrics.wait_p50_ms=4.096"
        );
        assert_eq!(LoadReport::parse(&value), Some(report));
        let sparse = LoadReport {
            in_flight: Some(0.0),
            ..LoadReport::default()
        };
        let value = sparse.to_header().expect("fits");
        assert_eq!(value, "TEXT named_metrics.in_flight=0");
        assert_eq!(LoadReport::parse(&value), Some(sparse));
    }

    #[test]
    fn envoys_forms_are_read_and_garbled_reports_are_no_report() {
        let read = |text: &str| LoadReport::parse(&HeaderValue::from_str(text).unwrap());
        let colon = read("TEXT cpu_utilization:0.5, named_metrics.queue_length:3, eps:2").unwrap();
        assert_eq!(
            (colon.cpu_utilization, colon.queue_length),
            (Some(0.5), Some(3.0))
        );
        assert_eq!(
            read("TEXT named_metrics.other=1"),
            Some(LoadReport::default())
        );
        for garbled in [
            "",
            "TEXT",
            "JSON {\"cpu_utilization\": 0.5}",
            "BIN abcd",
            "TEXT cpu_utilization",
            "TEXT cpu_utilization=",
            "TEXT cpu_utilization=abc",
            "TEXT cpu_utilization=NaN",
            "TEXT cpu_utilization=inf",
            "TEXT cpu_utilization=-1",
            "TEXT cpu_utilization=0.5,cpu_utilization=0.6",
            "TEXT named_metrics.wait_p50_ms=1,named_metrics.wait_p50_ms=2",
            "TEXT named_metrics.wait_p50_ms=1e300",
            "TEXT =1",
            "TEXT cpu_utilization=0.5,,",
        ] {
            assert_eq!(read(garbled), None, "{garbled:?}");
        }
        let long = format!("TEXT {}", "named_metrics.x=1,".repeat(40));
        assert_eq!(read(&long), None, "over the length bound");
    }

    #[tokio::test(start_paused = true)]
    async fn a_load_report_is_reused_for_its_refresh_period_then_made_again() {
        let queue = WorkQueue::new(4).unwrap();
        let reporter = Reporter::new(queue.clone(), None);
        let reports = Reports {
            level: false,
            load: true,
        };
        let in_flight = || {
            let mut headers = HeaderMap::new();
            reporter.stamp(reports, &mut headers);
            LoadReport::parse(&headers[LOAD_HEADER])
                .and_then(|report| report.in_flight)
                .expect("a report with the figure")
        };
        assert_eq!(in_flight(), 0.0);
        let permit = queue
            .admit(crate::WorkInfo::new(
                crate::TenantId::new(1),
                Priority::NORMAL,
            ))
            .await
            .unwrap();
        assert_eq!(in_flight(), 0.0, "the report made a moment ago");
        tokio::time::advance(LOAD_REFRESH).await;
        assert_eq!(
            in_flight(),
            1.0,
            "made again once it is the refresh period old"
        );
        drop(permit);
    }
}
