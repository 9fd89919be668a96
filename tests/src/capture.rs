//! A `tracing` subscriber that keeps every span and event, for tests that check what dlock
//! logs. Set it as the thread's default on a current-thread runtime
//! (`tracing::subscriber::set_default`) and it sees everything dlock spawns there too.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// A span's or an event's fields, by name (`message` for an event's message).
pub type Fields = BTreeMap<String, String>;

/// One span: its name, level and fields (including those recorded after it was created).
#[derive(Debug, Clone)]
pub struct SpanRecord {
    /// The span's name, e.g. `dlock.acquire`.
    pub name: String,
    /// Its level.
    pub level: Level,
    /// Its fields.
    pub fields: Fields,
}

/// One event: its level and fields.
#[derive(Debug, Clone)]
pub struct EventRecord {
    /// Its level.
    pub level: Level,
    /// Its fields; the message is `message`.
    pub fields: Fields,
}

impl EventRecord {
    /// The event's message.
    pub fn message(&self) -> &str {
        self.fields.get("message").map_or("", String::as_str)
    }
}

/// Keeps every span and event; clones share what was captured.
#[derive(Clone, Debug, Default)]
pub struct Capture {
    next: Arc<AtomicU64>,
    spans: Arc<Mutex<BTreeMap<u64, SpanRecord>>>,
    events: Arc<Mutex<Vec<EventRecord>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Capture {
    /// The spans named `name`, oldest first.
    pub fn spans(&self, name: &str) -> Vec<SpanRecord> {
        lock(&self.spans)
            .values()
            .filter(|s| s.name == name)
            .cloned()
            .collect()
    }

    /// The fields of the spans named `name`, oldest first, forgetting them.
    pub fn take_spans(&self, name: &str) -> Vec<Fields> {
        let mut spans = lock(&self.spans);
        let ids: Vec<u64> = spans
            .iter()
            .filter(|(_, s)| s.name == name)
            .map(|(id, _)| *id)
            .collect();
        ids.into_iter()
            .filter_map(|id| spans.remove(&id).map(|s| s.fields))
            .collect()
    }

    /// Every event, oldest first.
    pub fn events(&self) -> Vec<EventRecord> {
        lock(&self.events).clone()
    }

    /// The events whose message contains `words`.
    pub fn events_saying(&self, words: &str) -> Vec<EventRecord> {
        lock(&self.events)
            .iter()
            .filter(|e| e.message().contains(words))
            .cloned()
            .collect()
    }

    /// Everything captured, as text: for checking that something never shows.
    pub fn text(&self) -> String {
        format!("{:?}\n{:?}", lock(&self.spans), lock(&self.events))
    }
}

struct Collect<'a>(&'a mut Fields);

impl Visit for Collect<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let id = self.next.fetch_add(1, Ordering::SeqCst) + 1;
        let mut fields = Fields::new();
        span.record(&mut Collect(&mut fields));
        let meta = span.metadata();
        lock(&self.spans).insert(
            id,
            SpanRecord {
                name: meta.name().to_owned(),
                level: *meta.level(),
                fields,
            },
        );
        Id::from_u64(id)
    }

    fn record(&self, span: &Id, values: &Record<'_>) {
        if let Some(s) = lock(&self.spans).get_mut(&span.into_u64()) {
            values.record(&mut Collect(&mut s.fields));
        }
    }

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields::new();
        event.record(&mut Collect(&mut fields));
        lock(&self.events).push(EventRecord {
            level: *event.metadata().level(),
            fields,
        });
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}
