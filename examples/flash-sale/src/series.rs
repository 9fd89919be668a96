//! The operator's plots, second by second: what each instance answered in each second
//! (purchases, checkouts, 409s, locks handed over, stale writes refused) and how long its
//! requests waited for their locks (p50 and p99).
//!
//! Each instance counts in memory ([`Tally`], kept by its [`Counters`]). Once a second, on the
//! wall clock's whole second, a task reads the totals, subtracts the previous ones and writes
//! the difference as one row of the `samples` table, under the instance's name
//! ([`Counters::name`]: its address, `127.0.0.1:8080`, for an instance that serves). The
//! database is the ring: rows older than [`KEEP`] are deleted. Any instance answers
//! `GET /api/stats/series` ([`App::series`]) with every instance's samples of the last
//! [`WINDOW`], so the operator's page, served by one instance, plots them all. An instance that
//! stopped writing (it is down, or cut off from the database) is `reporting: false`, and its
//! line stops where it went silent. Samples the database refused are kept and written with the
//! next ones, so a short database outage leaves no hole once it is over.
//!
//! A *hand-over* here is a request that waited for a lock someone else held (at least
//! [`LOCK_WAIT_THRESHOLD`](crate::LOCK_WAIT_THRESHOLD)) and got it when they let go: the lock
//! passing from one buyer to the next. A *lock wait* is what [`Counters::ran_locked`] is told:
//! the time from asking for the locks to holding them all (for a voucher, the sale's permit and
//! the order lock together). Waits go into a histogram of buckets 20% wide, so a percentile is
//! right to within 10%. A second holds too few waits for a p99 worth plotting, so each sample's
//! percentiles are taken over the waits of the [`WAIT_SPAN`] seconds that end with it.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Weak;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::{AnyPool, Row as _};

use crate::validate::MAX_SAFE_INTEGER;
use crate::{App, AppError, Counter, Counters, now_ms};

/// How often each instance writes a sample.
pub const STEP: Duration = Duration::from_secs(1);
/// How far back `GET /api/stats/series` answers.
pub const WINDOW: Duration = Duration::from_secs(300);
/// How long samples are kept in the database.
pub const KEEP: Duration = Duration::from_secs(600);
/// An instance whose newest sample is older than this is not reporting.
pub const SILENT: Duration = Duration::from_secs(5);
/// How many seconds of lock waits each sample's percentiles are taken over.
pub const WAIT_SPAN: usize = 5;

const STEP_MS: i64 = STEP.as_millis() as i64;
const WINDOW_MS: i64 = WINDOW.as_millis() as i64;
const KEEP_MS: i64 = KEEP.as_millis() as i64;
const SILENT_MS: i64 = SILENT.as_millis() as i64;

/// What the tally counts, by index.
#[derive(Debug, Clone, Copy)]
enum Count {
    Requests,
    Purchases,
    Checkouts,
    Conflicts,
    Locked,
    Handovers,
    StaleRefused,
}

const COUNTS: usize = 7;

/// The wait histogram: bucket 0 holds waits under [`FIRST_US`], bucket `i` those from
/// `FIRST_US · GROWTH^(i−1)` up to `FIRST_US · GROWTH^i`, and the last one everything longer
/// than about 6.8 s.
const BUCKETS: usize = 64;
const FIRST_US: f64 = 100.0;
const GROWTH: f64 = 1.2;

/// A purchase answered with success.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Purchase {
    /// A voucher order.
    Voucher,
    /// A cart checkout.
    Checkout,
}

/// One instance's running totals for its plots, since it started.
#[derive(Debug)]
pub struct Tally {
    counts: [AtomicU64; COUNTS],
    waits: [AtomicU64; BUCKETS],
}

impl Default for Tally {
    fn default() -> Self {
        Self {
            counts: [const { AtomicU64::new(0) }; COUNTS],
            waits: [const { AtomicU64::new(0) }; BUCKETS],
        }
    }
}

impl Tally {
    fn add(&self, count: Count) {
        self.counts[count as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one of the shop's counters.
    pub(crate) fn bump(&self, counter: Counter) {
        self.add(match counter {
            Counter::Request => Count::Requests,
            Counter::Locked => Count::Locked,
            Counter::LockWait => Count::Handovers,
            Counter::Conflict => Count::Conflicts,
            Counter::StaleRefused => Count::StaleRefused,
        });
    }

    /// Counts a purchase answered with success.
    pub(crate) fn sold(&self, purchase: Purchase) {
        self.add(match purchase {
            Purchase::Voucher => Count::Purchases,
            Purchase::Checkout => Count::Checkouts,
        });
    }

    /// Records how long a request waited for its locks.
    pub(crate) fn waited(&self, wait: Duration) {
        self.waits[bucket(wait)].fetch_add(1, Ordering::Relaxed);
    }

    fn totals(&self) -> Totals {
        Totals {
            counts: std::array::from_fn(|i| self.counts[i].load(Ordering::Relaxed)),
            waits: std::array::from_fn(|i| self.waits[i].load(Ordering::Relaxed)),
        }
    }
}

/// The bucket of a wait.
fn bucket(wait: Duration) -> usize {
    let us = wait.as_secs_f64() * 1e6;
    if us < FIRST_US {
        return 0;
    }
    // A float that is too large for `usize` converts to `usize::MAX`.
    let above = ((us / FIRST_US).ln() / GROWTH.ln()).floor() as usize;
    above.saturating_add(1).min(BUCKETS - 1)
}

/// The middle of bucket `i` (geometrically), in milliseconds to the microsecond.
fn middle_ms(i: usize) -> f64 {
    let us = if i == 0 {
        FIRST_US / 2.0
    } else {
        FIRST_US * GROWTH.powf(i as f64 - 0.5)
    };
    us.round() / 1000.0
}

/// The `q` quantile of the waits counted in `waits`; `None` without any.
fn quantile(waits: &[u64; BUCKETS], q: f64) -> Option<f64> {
    let n: u64 = waits.iter().sum();
    if n == 0 {
        return None;
    }
    let rank = ((q * n as f64).ceil() as u64).clamp(1, n);
    let mut seen = 0;
    for (i, count) in waits.iter().enumerate() {
        seen += count;
        if seen >= rank {
            return Some(middle_ms(i));
        }
    }
    Some(middle_ms(BUCKETS - 1))
}

/// The tally read at one moment.
#[derive(Debug, Clone)]
struct Totals {
    counts: [u64; COUNTS],
    waits: [u64; BUCKETS],
}

/// The lock waits of the last [`WAIT_SPAN`] samples, newest last.
#[derive(Debug, Default)]
struct RecentWaits(VecDeque<[u64; BUCKETS]>);

impl RecentWaits {
    /// Adds the waits of `sample`'s span, `waits`, and sets its percentiles to those of the
    /// last [`WAIT_SPAN`] spans.
    fn add(&mut self, sample: &mut Sample, waits: [u64; BUCKETS]) {
        self.0.push_back(waits);
        while self.0.len() > WAIT_SPAN {
            self.0.pop_front();
        }
        let all = std::array::from_fn(|i| self.0.iter().map(|w| w[i]).sum());
        sample.wait_p50_ms = quantile(&all, 0.5);
        sample.wait_p99_ms = quantile(&all, 0.99);
    }
}

impl Totals {
    /// What was counted since `before`, as the sample of the `ms` milliseconds ending at `at_ms`
    /// (its percentiles not set), and the lock waits among it.
    fn since(&self, before: &Totals, at_ms: i64, ms: i64) -> (Sample, [u64; BUCKETS]) {
        let count = |c: Count| self.counts[c as usize].wrapping_sub(before.counts[c as usize]);
        let waits = std::array::from_fn(|i| self.waits[i].wrapping_sub(before.waits[i]));
        let sample = Sample {
            at_ms,
            ms,
            requests: count(Count::Requests),
            purchases: count(Count::Purchases),
            checkouts: count(Count::Checkouts),
            conflicts: count(Count::Conflicts),
            locked: count(Count::Locked),
            handovers: count(Count::Handovers),
            stale_refused: count(Count::StaleRefused),
            wait_p50_ms: None,
            wait_p99_ms: None,
        };
        (sample, waits)
    }
}

/// What one instance answered in about a second. Counts are whole numbers from 0 to 2⁵³ − 1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// The end of the span, ms since the epoch (a whole second).
    pub at_ms: i64,
    /// How long the span is, ms (about 1,000: a rate is a count × 1,000 / `ms`).
    pub ms: i64,
    /// Purchase requests (voucher orders and checkouts).
    pub requests: u64,
    /// Voucher orders answered with success.
    pub purchases: u64,
    /// Checkouts answered with success.
    pub checkouts: u64,
    /// Purchase requests answered 409.
    pub conflicts: u64,
    /// Purchase requests that got their lock(s).
    pub locked: u64,
    /// Of those, the ones that waited for a holder to let go: locks handed over.
    pub handovers: u64,
    /// Fenced writes refused (a stale holder's).
    pub stale_refused: u64,
    /// The median lock wait of the requests that got their locks in the [`WAIT_SPAN`] seconds
    /// that end at `at_ms`, ms; `None` if none did.
    pub wait_p50_ms: Option<f64>,
    /// Their 99th percentile lock wait, ms; `None` if none did.
    pub wait_p99_ms: Option<f64>,
}

/// One instance's samples.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceSeries {
    /// The instance's name: its address (`127.0.0.1:8080`).
    pub name: String,
    /// The end of its newest sample, ms since the epoch.
    pub last_ms: i64,
    /// Whether its newest sample is at most [`SILENT`] old. An instance that is down, or can't
    /// reach the database, stops reporting.
    pub reporting: bool,
    /// Its samples after the asked time (or of the whole window), oldest first. A missing
    /// second is a second it did not report.
    pub samples: Vec<Sample>,
}

/// Every instance's samples (`GET /api/stats/series`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Series {
    /// The answering instance's clock, ms since the epoch.
    pub now_ms: i64,
    /// How far back samples are kept for plotting, ms.
    pub window_ms: i64,
    /// How often an instance reports, ms.
    pub step_ms: i64,
    /// The name of the instance that answered.
    pub answered_by: String,
    /// Every instance that reported within the window, by name.
    pub instances: Vec<InstanceSeries>,
}

/// Starts the instance's sampler on the current runtime; it ends once `counters` is gone.
pub(crate) fn start(db: AnyPool, counters: Weak<Counters>) {
    tokio::spawn(sample(db, counters));
}

/// How long until the next whole second of the wall clock, and a few milliseconds more.
fn until_next_second() -> Duration {
    let into = now_ms().rem_euclid(STEP_MS);
    Duration::from_millis(u64::try_from(STEP_MS - into + 5).unwrap_or(1_000))
}

async fn sample(db: AnyPool, counters: Weak<Counters>) {
    // The tally starts at zero with its counters: the first sample counts from there.
    let mut before = Totals {
        counts: [0; COUNTS],
        waits: [0; BUCKETS],
    };
    let mut before_ms = now_ms();
    let mut recent = RecentWaits::default();
    let mut unwritten = VecDeque::new();
    let (mut failing, mut clashed) = (false, false);
    // The first sample is written at the second whole second from now, not the first: an
    // instance that serves is named by its address just after it is built, and its samples
    // should all go by that name.
    tokio::time::sleep(until_next_second()).await;
    let mut ticks: u64 = 0;
    loop {
        tokio::time::sleep(until_next_second()).await;
        let Some(counters) = counters.upgrade() else {
            return;
        };
        let now = now_ms();
        let totals = counters.tally().totals();
        let at_ms = (now + STEP_MS / 2).div_euclid(STEP_MS) * STEP_MS;
        let (mut sample, waits) = totals.since(&before, at_ms, now - before_ms);
        recent.add(&mut sample, waits);
        unwritten.push_back(sample);
        (before, before_ms) = (totals, now);
        // What no plot would show any more is not worth writing.
        let most = usize::try_from(WINDOW_MS / STEP_MS).unwrap_or(300);
        while unwritten.len() > most {
            unwritten.pop_front();
        }
        let name = counters.name();
        drop(counters);
        match write(&db, &name, &mut unwritten).await {
            Ok(taken) => {
                if failing {
                    tracing::info!("sampler: the database takes samples again");
                    failing = false;
                }
                if taken > 0 && !clashed {
                    tracing::warn!(
                        name,
                        "sampler: another instance writes samples by this name; give each \
                         instance its own (SHOP_INSTANCE_NAME)"
                    );
                    clashed = true;
                }
            }
            Err(err) => {
                if !failing {
                    tracing::warn!(error = %err, "sampler: samples not written; kept for later");
                    failing = true;
                }
            }
        }
        ticks += 1;
        if ticks.is_multiple_of(60) {
            let old = sqlx::query("DELETE FROM samples WHERE at_ms < $1")
                .bind(now - KEEP_MS)
                .execute(&db)
                .await;
            if let Err(err) = old {
                tracing::debug!(error = %err, "sampler: old samples not deleted");
            }
        }
    }
}

/// A count as the database stores it.
fn db_count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Milliseconds as the database stores a wait: whole microseconds.
fn db_us(ms: Option<f64>) -> Option<i64> {
    ms.map(|ms| (ms * 1000.0).round() as i64)
}

/// Writes `unwritten`, oldest first, under `name`; what fails stays in `unwritten`. Returns
/// how many samples found a row of theirs already there: another instance by the same name.
async fn write(
    db: &AnyPool,
    name: &str,
    unwritten: &mut VecDeque<Sample>,
) -> Result<u64, sqlx::Error> {
    let mut taken = 0;
    while let Some(sample) = unwritten.front() {
        let written = sqlx::query(
            "INSERT INTO samples (instance, at_ms, ms, requests, purchases, checkouts, conflicts,
                                  locked, handovers, stale_refused, wait_p50_us, wait_p99_us)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
             ON CONFLICT (instance, at_ms) DO NOTHING",
        )
        .bind(name)
        .bind(sample.at_ms)
        .bind(sample.ms)
        .bind(db_count(sample.requests))
        .bind(db_count(sample.purchases))
        .bind(db_count(sample.checkouts))
        .bind(db_count(sample.conflicts))
        .bind(db_count(sample.locked))
        .bind(db_count(sample.handovers))
        .bind(db_count(sample.stale_refused))
        .bind(db_us(sample.wait_p50_ms))
        .bind(db_us(sample.wait_p99_ms))
        .execute(db)
        .await?;
        if written.rows_affected() == 0 {
            taken += 1;
        }
        unwritten.pop_front();
    }
    Ok(taken)
}

/// A count as the API answers it: 0 to 2⁵³ − 1.
fn api_count(n: i64) -> u64 {
    n.clamp(0, MAX_SAFE_INTEGER) as u64
}

impl App {
    /// Every instance's samples of the last [`WINDOW`]; with `since_ms`, only those that end
    /// after it (the page asks for what it doesn't have yet), though every instance of the
    /// window is listed, with its newest sample's time.
    pub async fn series(&self, since_ms: Option<i64>) -> Result<Series, AppError> {
        let now = now_ms();
        let from = now - WINDOW_MS;
        let after = since_ms.map_or(from, |since| since.max(from));
        let newest = sqlx::query(
            "SELECT instance, MAX(at_ms) AS last_ms FROM samples WHERE at_ms > $1
             GROUP BY instance",
        )
        .bind(from)
        .fetch_all(&self.db)
        .await?;
        let mut instances = BTreeMap::new();
        for row in &newest {
            let name: String = row.try_get("instance")?;
            let last_ms: i64 = row.try_get("last_ms")?;
            let reporting = now - last_ms <= SILENT_MS;
            instances.insert(
                name.clone(),
                InstanceSeries {
                    name,
                    last_ms,
                    reporting,
                    samples: Vec::new(),
                },
            );
        }
        let rows = sqlx::query(
            "SELECT instance, at_ms, ms, requests, purchases, checkouts, conflicts, locked,
                    handovers, stale_refused, wait_p50_us, wait_p99_us
             FROM samples WHERE at_ms > $1 ORDER BY at_ms",
        )
        .bind(after)
        .fetch_all(&self.db)
        .await?;
        for row in &rows {
            let name: String = row.try_get("instance")?;
            let ms = |column: &str| {
                row.try_get::<Option<i64>, _>(column)
                    .map(|us| us.map(|us| us as f64 / 1000.0))
            };
            let count = |column: &str| row.try_get::<i64, _>(column).map(api_count);
            let sample = Sample {
                at_ms: row.try_get("at_ms")?,
                ms: row.try_get("ms")?,
                requests: count("requests")?,
                purchases: count("purchases")?,
                checkouts: count("checkouts")?,
                conflicts: count("conflicts")?,
                locked: count("locked")?,
                handovers: count("handovers")?,
                stale_refused: count("stale_refused")?,
                wait_p50_ms: ms("wait_p50_us")?,
                wait_p99_ms: ms("wait_p99_us")?,
            };
            // A row written between the two reads belongs to an instance listed by now.
            if let Some(instance) = instances.get_mut(&name) {
                instance.samples.push(sample);
            }
        }
        Ok(Series {
            now_ms: now,
            window_ms: WINDOW_MS,
            step_ms: STEP_MS,
            answered_by: self.counters.name(),
            instances: instances.into_values().collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_fall_into_buckets_twenty_percent_wide() {
        assert_eq!(bucket(Duration::ZERO), 0);
        assert_eq!(bucket(Duration::from_micros(99)), 0);
        assert_eq!(bucket(Duration::from_micros(100)), 1);
        assert_eq!(bucket(Duration::from_micros(119)), 1);
        assert_eq!(bucket(Duration::from_micros(121)), 2);
        assert_eq!(bucket(Duration::from_secs(3600)), BUCKETS - 1);
        for ms in [0.3, 1.0, 5.0, 42.0, 250.0, 1_900.0] {
            let i = bucket(Duration::from_secs_f64(ms / 1000.0));
            let middle = middle_ms(i);
            assert!((middle / ms - 1.0).abs() <= 0.1, "{ms} ms read as {middle}");
        }
    }

    #[test]
    fn a_sample_is_the_difference_of_two_readings() {
        let tally = Tally::default();
        tally.bump(Counter::Request);
        let before = tally.totals();
        for _ in 0..3 {
            tally.bump(Counter::Request);
            tally.bump(Counter::Locked);
        }
        tally.bump(Counter::LockWait);
        tally.bump(Counter::Conflict);
        tally.sold(Purchase::Voucher);
        tally.sold(Purchase::Checkout);
        tally.sold(Purchase::Checkout);
        for _ in 0..98 {
            tally.waited(Duration::from_millis(1));
        }
        tally.waited(Duration::from_millis(50));
        tally.waited(Duration::from_millis(800));
        let (mut sample, waits) = tally.totals().since(&before, 2_000, 1_000);
        let mut recent = RecentWaits::default();
        recent.add(&mut sample, waits);
        assert_eq!(
            (sample.requests, sample.locked, sample.handovers),
            (3, 3, 1)
        );
        assert_eq!((sample.purchases, sample.checkouts), (1, 2));
        assert_eq!((sample.conflicts, sample.stale_refused), (1, 0));
        let p50 = sample.wait_p50_ms.unwrap();
        let p99 = sample.wait_p99_ms.unwrap();
        assert!((0.9..=1.1).contains(&p50), "{p50}");
        assert!((45.0..=55.0).contains(&p99), "{p99}");
        // A quiet second: no waits of its own, the percentiles of the seconds before it.
        let (mut quiet, waits) = tally.totals().since(&tally.totals(), 3_000, 1_000);
        assert_eq!(quiet.requests, 0);
        recent.add(&mut quiet, waits);
        assert_eq!(quiet.wait_p99_ms, sample.wait_p99_ms);
        // Once the busy second is more than the span ago, there are none.
        for _ in 0..WAIT_SPAN {
            recent.add(&mut quiet, waits);
        }
        assert_eq!((quiet.wait_p50_ms, quiet.wait_p99_ms), (None, None));
    }
}
