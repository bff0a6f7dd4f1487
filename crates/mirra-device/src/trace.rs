//! A Chrome trace of what each thread did: spans of named work (forward, backward, a
//! bucket's all-reduce, ...) recorded while tracing is on, written as the JSON that
//! chrome://tracing and Perfetto read (`mirra train --trace FILE`).
//!
//! Off by default; then [`span`] is one relaxed atomic load and returns `None`. On, a span
//! records its thread, start and duration when it ends (one short mutex hold per span:
//! a training step records a few dozen). Threads are named in the trace by their
//! `std::thread` names (`mirra-replica-1`, `mirra-progress-1`, ...).

use std::borrow::Cow;
use std::cell::Cell;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use crate::sync::lock;

static ENABLED: AtomicBool = AtomicBool::new(false);
static NEXT_TID: AtomicU64 = AtomicU64::new(1);

struct Recorder {
    origin: Instant,
    events: Vec<Event>,
    /// (tid, name) of every thread that recorded a span.
    threads: Vec<(u64, String)>,
}

fn recorder() -> &'static Mutex<Recorder> {
    static REC: OnceLock<Mutex<Recorder>> = OnceLock::new();
    REC.get_or_init(|| {
        Mutex::new(Recorder {
            origin: Instant::now(),
            events: Vec::new(),
            threads: Vec::new(),
        })
    })
}

thread_local! {
    /// This thread's id in the trace (0: not assigned yet).
    static TID: Cell<u64> = const { Cell::new(0) };
}

/// One finished span.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// What was done.
    pub name: Cow<'static, str>,
    /// The kind of work (`compute`, `comm`, `optimizer`, ...), for colouring and filtering.
    pub category: &'static str,
    /// The thread's id in the trace.
    pub tid: u64,
    /// Microseconds from the start of tracing.
    pub start_us: f64,
    /// Microseconds it took.
    pub dur_us: f64,
}

/// Starts recording (clearing anything recorded before).
pub fn start() {
    let mut r = lock(recorder());
    r.origin = Instant::now();
    r.events.clear();
    r.threads.clear();
    drop(r);
    ENABLED.store(true, Ordering::Release);
}

/// Whether spans are being recorded.
#[inline]
pub fn is_enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Stops recording and returns what was recorded.
pub fn stop() -> Trace {
    ENABLED.store(false, Ordering::Release);
    let mut r = lock(recorder());
    Trace {
        events: std::mem::take(&mut r.events),
        threads: std::mem::take(&mut r.threads),
    }
}

/// A span in progress; it records itself when dropped.
#[derive(Debug)]
#[must_use = "a span records when it is dropped: bind it to a variable"]
pub struct Span {
    name: Cow<'static, str>,
    category: &'static str,
    start: Instant,
}

/// A span named `name`, or `None` when tracing is off.
#[inline]
pub fn span(category: &'static str, name: &'static str) -> Option<Span> {
    span_with(category, || Cow::Borrowed(name))
}

/// A span whose name is made only when tracing is on (`|| format!("bucket {i}")`).
#[inline]
pub fn span_with(category: &'static str, name: impl FnOnce() -> Cow<'static, str>) -> Option<Span> {
    is_enabled().then(|| Span {
        name: name(),
        category,
        start: Instant::now(),
    })
}

impl Drop for Span {
    fn drop(&mut self) {
        if !is_enabled() {
            return;
        }
        let end = Instant::now();
        let tid = TID.with(|t| {
            if t.get() == 0 {
                t.set(NEXT_TID.fetch_add(1, Ordering::Relaxed));
            }
            t.get()
        });
        let mut r = lock(recorder());
        if !r.threads.iter().any(|(t, _)| *t == tid) {
            let name = std::thread::current()
                .name()
                .map_or_else(|| format!("thread {tid}"), str::to_owned);
            r.threads.push((tid, name));
        }
        let origin = r.origin;
        let micros = |t: Instant| t.saturating_duration_since(origin).as_secs_f64() * 1e6;
        r.events.push(Event {
            name: std::mem::take(&mut self.name),
            category: self.category,
            tid,
            start_us: micros(self.start),
            dur_us: (end - self.start).as_secs_f64() * 1e6,
        });
    }
}

/// What a tracing session recorded.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    /// The spans, in the order they ended.
    pub events: Vec<Event>,
    /// (tid, name) of the threads that recorded them.
    pub threads: Vec<(u64, String)>,
}

impl Trace {
    /// Writes the Chrome trace-event JSON (`{"traceEvents": [...]}`: one complete event
    /// `ph: "X"` per span, one `thread_name` metadata event per thread).
    pub fn write_json(&self, out: &mut dyn Write) -> std::io::Result<()> {
        writeln!(out, "{{\"displayTimeUnit\":\"ms\",\"traceEvents\":[")?;
        let mut first = true;
        let mut sep = |out: &mut dyn Write| -> std::io::Result<()> {
            if !std::mem::take(&mut first) {
                writeln!(out, ",")?;
            }
            Ok(())
        };
        for (tid, name) in &self.threads {
            sep(out)?;
            write!(
                out,
                "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":{tid},\"args\":{{\"name\":{}}}}}",
                json_string(name)
            )?;
        }
        for e in &self.events {
            sep(out)?;
            write!(
                out,
                "{{\"name\":{},\"cat\":{},\"ph\":\"X\",\"pid\":1,\"tid\":{},\"ts\":{:.3},\"dur\":{:.3}}}",
                json_string(&e.name),
                json_string(e.category),
                e.tid,
                e.start_us,
                e.dur_us
            )?;
        }
        writeln!(out, "\n]}}")
    }

    /// Writes the trace to `path`.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
        self.write_json(&mut out)?;
        out.flush()
    }
}

/// `s` as a JSON string literal.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_record_only_while_tracing_and_carry_their_thread() {
        // The only test in this crate that starts the process-wide recorder.
        assert!(span("compute", "before").is_none());
        start();
        {
            let _s = span("compute", "forward");
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        std::thread::Builder::new()
            .name("mirra-replica-1".into())
            .spawn(|| {
                let _s = span_with("comm", || format!("all-reduce bucket {}", 3).into());
            })
            .unwrap()
            .join()
            .unwrap();
        let t = stop();
        assert!(span("compute", "after").is_none());
        assert_eq!(t.events.len(), 2, "{t:?}");
        let fwd = &t.events[0];
        assert_eq!((fwd.name.as_ref(), fwd.category), ("forward", "compute"));
        assert!(fwd.dur_us >= 2000.0, "{}", fwd.dur_us);
        let bucket = &t.events[1];
        assert_eq!(bucket.name, "all-reduce bucket 3");
        assert_ne!(bucket.tid, fwd.tid);
        let replica = t
            .threads
            .iter()
            .find(|(tid, _)| *tid == bucket.tid)
            .unwrap();
        assert_eq!(replica.1, "mirra-replica-1");
    }

    #[test]
    fn the_json_is_what_chrome_reads() {
        let t = Trace {
            events: vec![Event {
                name: "a \"quoted\" name".into(),
                category: "comm",
                tid: 2,
                start_us: 1.5,
                dur_us: 10.25,
            }],
            threads: vec![(2, "mirra-replica-0".into())],
        };
        let mut out = Vec::new();
        t.write_json(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains(
                r#""name":"thread_name","ph":"M","pid":1,"tid":2,"args":{"name":"mirra-replica-0"}"#
            ),
            "{text}"
        );
        assert!(text.contains(r#"{"name":"a \"quoted\" name","cat":"comm","ph":"X","pid":1,"tid":2,"ts":1.500,"dur":10.250}"#), "{text}");
        assert!(text.trim_end().ends_with("]}"));
    }
}
