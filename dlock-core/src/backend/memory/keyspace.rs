//! An in-process keyspace that answers the Redis commands the protocol's scripts use, as Redis
//! answers them: strings, hashes and sorted sets with expiries on tokio's clock (so tests can
//! pause it), and `TIME` from the same clock.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

/// A command's answer, as Redis would give it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Reply {
    Nil,
    Int(i64),
    Bulk(String),
    Array(Vec<Reply>),
    Status(String),
    Error(String),
}

/// Where `PUBLISH` goes, and who counts as subscribed for `PUBSUB NUMSUB`.
pub(crate) trait Channels {
    /// Delivers `message` on `channel`; returns how many subscribers got it.
    fn publish(&self, channel: &str, message: &str) -> i64;
    /// How many subscribers `channel` has.
    fn subscribers(&self, channel: &str) -> i64;
}

/// A sorted set: members by score, and in order of (score, member) as Redis orders them.
#[derive(Debug, Clone, Default)]
struct SortedSet {
    scores: BTreeMap<String, f64>,
    order: BTreeSet<(Score, String)>,
}

/// A score, totally ordered.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Score(f64);

impl Eq for Score {}

impl PartialOrd for Score {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Score {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

impl SortedSet {
    fn add(&mut self, member: &str, score: f64) -> bool {
        let new = match self.scores.insert(member.to_owned(), score) {
            Some(old) => {
                self.order.remove(&(Score(old), member.to_owned()));
                false
            }
            None => true,
        };
        self.order.insert((Score(score), member.to_owned()));
        new
    }

    fn remove(&mut self, member: &str) -> bool {
        match self.scores.remove(member) {
            Some(score) => {
                self.order.remove(&(Score(score), member.to_owned()));
                true
            }
            None => false,
        }
    }

    fn rank(&self, member: &str) -> Option<usize> {
        let score = *self.scores.get(member)?;
        Some(
            self.order
                .range(..(Score(score), member.to_owned()))
                .count(),
        )
    }
}

#[derive(Debug, Clone)]
enum Value {
    Str(String),
    Hash(BTreeMap<String, String>),
    ZSet(SortedSet),
}

#[derive(Debug, Clone)]
struct Entry {
    value: Value,
    expires: Option<Instant>,
}

/// The keyspace.
#[derive(Debug)]
pub(crate) struct Keyspace {
    /// In key order: every listing of keys (a `SCAN`, `KEYS`) comes in the same order on every
    /// run, so a paused test replays.
    entries: BTreeMap<String, Entry>,
    /// The wall clock at `started`: `TIME` is this plus tokio's time since.
    wall: Duration,
    started: Instant,
}

const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

fn err(text: &str) -> Reply {
    Reply::Error(format!("ERR {text}"))
}

/// Parses a whole number as Redis does (no sign but `-`, no spaces).
fn int(arg: &str) -> Option<i64> {
    arg.parse().ok()
}

/// Parses a score bound: `-inf`, `+inf`, `(x` (exclusive) or `x`.
fn bound(arg: &str) -> Option<(f64, bool)> {
    let (text, exclusive) = match arg.strip_prefix('(') {
        Some(rest) => (rest, true),
        None => (arg, false),
    };
    let value = match text {
        "-inf" => f64::NEG_INFINITY,
        "+inf" | "inf" => f64::INFINITY,
        _ => text.parse().ok()?,
    };
    Some((value, exclusive))
}

/// A score as Redis writes it: a whole number without a fraction, else the shortest form.
pub(crate) fn format_score(score: f64) -> String {
    if score.fract() == 0.0 && score.abs() < 1e17 {
        format!("{score:.0}")
    } else {
        format!("{score}")
    }
}

impl Keyspace {
    /// An empty keyspace whose clock read `clock.0` (since 1970) at `clock.1`.
    pub(crate) fn new((wall, started): (Duration, Instant)) -> Self {
        Self {
            entries: BTreeMap::new(),
            wall,
            started,
        }
    }

    /// The keyspace's clock: the wall clock when it was made, moved on by tokio's time.
    pub(crate) fn time(&self) -> Duration {
        self.wall + Instant::now().saturating_duration_since(self.started)
    }

    /// The live entry at `key` (an expired one is removed first).
    fn live(&mut self, key: &str) -> Option<&mut Entry> {
        let now = Instant::now();
        if (self.entries.get(key)).is_some_and(|e| e.expires.is_some_and(|at| at <= now)) {
            self.entries.remove(key);
        }
        self.entries.get_mut(key)
    }

    /// Every live key.
    pub(crate) fn keys(&mut self) -> Vec<String> {
        let now = Instant::now();
        (self.entries).retain(|_, e| e.expires.is_none_or(|at| at > now));
        self.entries.keys().cloned().collect()
    }

    /// Removes `key`; whether it was there.
    pub(crate) fn delete(&mut self, key: &str) -> bool {
        self.live(key).is_some() && self.entries.remove(key).is_some()
    }

    fn set_string(&mut self, key: &str, value: String, ttl: Option<Duration>) {
        let expires = ttl.map(|ttl| Instant::now() + ttl);
        let value = Value::Str(value);
        self.entries
            .insert(key.to_owned(), Entry { value, expires });
    }

    fn pttl(&mut self, key: &str) -> i64 {
        match self.live(key) {
            None => -2,
            Some(Entry { expires: None, .. }) => -1,
            Some(Entry {
                expires: Some(at), ..
            }) => {
                let left = at.saturating_duration_since(Instant::now());
                // Redis rounds a key's remaining time to the nearest millisecond.
                i64::try_from((left.as_micros() + 500) / 1000).unwrap_or(i64::MAX)
            }
        }
    }

    fn zset(&mut self, key: &str) -> Result<Option<&mut SortedSet>, Reply> {
        match self.live(key) {
            None => Ok(None),
            Some(Entry {
                value: Value::ZSet(z),
                ..
            }) => Ok(Some(z)),
            Some(_) => Err(Reply::Error(WRONGTYPE.to_owned())),
        }
    }

    /// Drops `key` if it is a sorted set left empty, as Redis does.
    fn drop_if_empty(&mut self, key: &str) {
        if let Some(Entry {
            value: Value::ZSet(z),
            ..
        }) = self.entries.get(key)
            && z.scores.is_empty()
        {
            self.entries.remove(key);
        }
    }

    /// Runs one command (`args[0]` its name) and answers as Redis does.
    pub(crate) fn command(&mut self, args: &[&str], channels: &dyn Channels) -> Reply {
        let Some((name, args)) = args.split_first() else {
            return err("empty command");
        };
        // The scripts name commands in capitals: no copy for them.
        let name = match name.bytes().any(|b| b.is_ascii_lowercase()) {
            true => std::borrow::Cow::Owned(name.to_ascii_uppercase()),
            false => std::borrow::Cow::Borrowed(*name),
        };
        match (name.as_ref(), args) {
            ("GET", [key]) => match self.live(key) {
                None => Reply::Nil,
                Some(Entry {
                    value: Value::Str(s),
                    ..
                }) => Reply::Bulk(s.clone()),
                Some(_) => Reply::Error(WRONGTYPE.to_owned()),
            },
            ("SET", [key, value, options @ ..]) => self.set(key, value, options),
            ("PSETEX", [key, ms, value]) => match int(ms).filter(|ms| *ms > 0) {
                Some(ms) => {
                    let ttl = Duration::from_millis(ms.unsigned_abs());
                    self.set_string(key, (*value).to_owned(), Some(ttl));
                    Reply::Status("OK".to_owned())
                }
                None => err("invalid expire time in 'psetex' command"),
            },
            ("APPEND", [key, tail]) => match self.live(key) {
                Some(Entry {
                    value: Value::Str(s),
                    ..
                }) => {
                    s.push_str(tail);
                    Reply::Int(i64::try_from(s.len()).unwrap_or(i64::MAX))
                }
                Some(_) => Reply::Error(WRONGTYPE.to_owned()),
                None => {
                    self.set_string(key, (*tail).to_owned(), None);
                    Reply::Int(i64::try_from(tail.len()).unwrap_or(i64::MAX))
                }
            },
            ("DEL", keys) if !keys.is_empty() => {
                let removed = keys.iter().filter(|k| self.delete(k)).count();
                Reply::Int(i64::try_from(removed).unwrap_or(i64::MAX))
            }
            ("EXISTS", keys) if !keys.is_empty() => {
                let found = keys.iter().filter(|k| self.live(k).is_some()).count();
                Reply::Int(i64::try_from(found).unwrap_or(i64::MAX))
            }
            ("TYPE", [key]) => Reply::Status(
                match self.live(key).map(|e| &e.value) {
                    None => "none",
                    Some(Value::Str(_)) => "string",
                    Some(Value::Hash(_)) => "hash",
                    Some(Value::ZSet(_)) => "zset",
                }
                .to_owned(),
            ),
            ("PTTL", [key]) => Reply::Int(self.pttl(key)),
            ("PEXPIRE", [key, ms]) => match int(ms) {
                Some(ms) => match self.live(key) {
                    Some(entry) if ms > 0 => {
                        let ttl = Duration::from_millis(ms.unsigned_abs());
                        entry.expires = Some(Instant::now() + ttl);
                        Reply::Int(1)
                    }
                    Some(_) => Reply::Int(i64::from(self.delete(key))),
                    None => Reply::Int(0),
                },
                None => err("value is not an integer or out of range"),
            },
            ("TIME", []) => {
                let now = self.time();
                Reply::Array(vec![
                    Reply::Bulk(now.as_secs().to_string()),
                    Reply::Bulk(now.subsec_micros().to_string()),
                ])
            }
            ("HGET", [key, field]) => match self.live(key) {
                None => Reply::Nil,
                Some(Entry {
                    value: Value::Hash(h),
                    ..
                }) => h.get(*field).map_or(Reply::Nil, |v| Reply::Bulk(v.clone())),
                Some(_) => Reply::Error(WRONGTYPE.to_owned()),
            },
            ("HGETALL", [key]) => match self.live(key) {
                None => Reply::Array(Vec::new()),
                Some(Entry {
                    value: Value::Hash(h),
                    ..
                }) => {
                    let mut pairs: Vec<(&String, &String)> = h.iter().collect();
                    pairs.sort();
                    let flat = pairs.into_iter().flat_map(|(f, v)| [f.clone(), v.clone()]);
                    Reply::Array(flat.map(Reply::Bulk).collect())
                }
                Some(_) => Reply::Error(WRONGTYPE.to_owned()),
            },
            ("HSET", [key, pairs @ ..]) if !pairs.is_empty() && pairs.len() % 2 == 0 => {
                let entry = match self.live(key) {
                    Some(entry) => entry,
                    None => {
                        let value = Value::Hash(BTreeMap::new());
                        let entry = Entry {
                            value,
                            expires: None,
                        };
                        self.entries.entry((*key).to_owned()).or_insert(entry)
                    }
                };
                let Value::Hash(h) = &mut entry.value else {
                    return Reply::Error(WRONGTYPE.to_owned());
                };
                let added = (pairs.chunks(2))
                    .filter(|p| h.insert(p[0].to_owned(), p[1].to_owned()).is_none())
                    .count();
                Reply::Int(i64::try_from(added).unwrap_or(i64::MAX))
            }
            // `XX`: only members already there get the new score (the key is not made).
            ("ZADD", [key, xx, pairs @ ..])
                if xx.eq_ignore_ascii_case("XX") && !pairs.is_empty() && pairs.len() % 2 == 0 =>
            {
                let Some(scored) = scored(pairs) else {
                    return err("value is not a valid float");
                };
                match self.zset(key) {
                    Ok(Some(set)) => {
                        for (score, member) in scored {
                            if set.scores.contains_key(member) {
                                set.add(member, score);
                            }
                        }
                        Reply::Int(0)
                    }
                    Ok(None) => Reply::Int(0),
                    Err(reply) => reply,
                }
            }
            ("ZADD", [key, pairs @ ..]) if !pairs.is_empty() && pairs.len() % 2 == 0 => {
                let Some(scored) = scored(pairs) else {
                    return err("value is not a valid float");
                };
                let set = match self.zset(key) {
                    Ok(Some(set)) => set,
                    Ok(None) => {
                        let entry = Entry {
                            value: Value::ZSet(SortedSet::default()),
                            expires: None,
                        };
                        let entry = self.entries.entry((*key).to_owned()).or_insert(entry);
                        let Value::ZSet(set) = &mut entry.value else {
                            return Reply::Error(WRONGTYPE.to_owned());
                        };
                        set
                    }
                    Err(reply) => return reply,
                };
                let added = scored.iter().filter(|(s, m)| set.add(m, *s)).count();
                Reply::Int(i64::try_from(added).unwrap_or(i64::MAX))
            }
            ("ZREM", [key, members @ ..]) if !members.is_empty() => {
                let removed = match self.zset(key) {
                    Ok(Some(set)) => members.iter().filter(|m| set.remove(m)).count(),
                    Ok(None) => 0,
                    Err(reply) => return reply,
                };
                self.drop_if_empty(key);
                Reply::Int(i64::try_from(removed).unwrap_or(i64::MAX))
            }
            ("ZSCORE", [key, member]) => match self.zset(key) {
                Ok(set) => (set.and_then(|s| s.scores.get(*member)))
                    .map_or(Reply::Nil, |score| Reply::Bulk(format_score(*score))),
                Err(reply) => reply,
            },
            ("ZRANK", [key, member]) => match self.zset(key) {
                Ok(set) => (set.and_then(|s| s.rank(member))).map_or(Reply::Nil, |r| {
                    Reply::Int(i64::try_from(r).unwrap_or(i64::MAX))
                }),
                Err(reply) => reply,
            },
            ("ZCARD", [key]) => match self.zset(key) {
                Ok(set) => {
                    Reply::Int(set.map_or(0, |s| i64::try_from(s.scores.len()).unwrap_or(0)))
                }
                Err(reply) => reply,
            },
            ("ZRANGE", [key, start, stop, rest @ ..]) => {
                let with_scores = match rest {
                    [] => false,
                    [w] if w.eq_ignore_ascii_case("WITHSCORES") => true,
                    _ => return err("syntax error"),
                };
                let (Some(start), Some(stop)) = (int(start), int(stop)) else {
                    return err("value is not an integer or out of range");
                };
                match self.zset(key) {
                    Ok(None) => Reply::Array(Vec::new()),
                    Ok(Some(set)) => {
                        let len = i64::try_from(set.order.len()).unwrap_or(i64::MAX);
                        let at = |i: i64| if i < 0 { (len + i).max(0) } else { i };
                        let (from, to) = (at(start), at(stop).min(len - 1));
                        let mut out = Vec::new();
                        if from <= to {
                            let skip = usize::try_from(from).unwrap_or(usize::MAX);
                            let take = usize::try_from(to - from + 1).unwrap_or(0);
                            for (score, member) in set.order.iter().skip(skip).take(take) {
                                out.push(Reply::Bulk(member.clone()));
                                if with_scores {
                                    out.push(Reply::Bulk(format_score(score.0)));
                                }
                            }
                        }
                        Reply::Array(out)
                    }
                    Err(reply) => reply,
                }
            }
            ("ZCOUNT", [key, min, max]) => {
                let (Some(min), Some(max)) = (bound(min), bound(max)) else {
                    return err("min or max is not a float");
                };
                match self.zset(key) {
                    Ok(set) => {
                        let n = set.map_or(0, |s| {
                            (s.scores.values())
                                .filter(|v| in_range(**v, min, max))
                                .count()
                        });
                        Reply::Int(i64::try_from(n).unwrap_or(i64::MAX))
                    }
                    Err(reply) => reply,
                }
            }
            ("ZREMRANGEBYSCORE", [key, min, max]) => {
                let (Some(min), Some(max)) = (bound(min), bound(max)) else {
                    return err("min or max is not a float");
                };
                let removed = match self.zset(key) {
                    Ok(Some(set)) => {
                        let gone: Vec<String> = (set.scores.iter())
                            .filter(|(_, v)| in_range(**v, min, max))
                            .map(|(m, _)| m.clone())
                            .collect();
                        gone.iter().filter(|m| set.remove(m)).count()
                    }
                    Ok(None) => 0,
                    Err(reply) => return reply,
                };
                self.drop_if_empty(key);
                Reply::Int(i64::try_from(removed).unwrap_or(i64::MAX))
            }
            ("PUBLISH" | "SPUBLISH", [channel, message]) => {
                Reply::Int(channels.publish(channel, message))
            }
            ("PUBSUB", [sub, names @ ..])
                if sub.eq_ignore_ascii_case("NUMSUB")
                    || sub.eq_ignore_ascii_case("SHARDNUMSUB") =>
            {
                let mut out = Vec::with_capacity(2 * names.len());
                for name in names {
                    out.push(Reply::Bulk((*name).to_owned()));
                    out.push(Reply::Int(channels.subscribers(name)));
                }
                Reply::Array(out)
            }
            _ => Reply::Error(format!(
                "ERR unknown command or wrong number of arguments for '{name}'"
            )),
        }
    }

    /// `SET key value [NX] [PX ms]`.
    fn set(&mut self, key: &str, value: &str, options: &[&str]) -> Reply {
        let (mut nx, mut ttl) = (false, None);
        let mut options = options.iter();
        while let Some(option) = options.next() {
            if option.eq_ignore_ascii_case("NX") {
                nx = true;
            } else if option.eq_ignore_ascii_case("PX") {
                match options.next().and_then(|ms| int(ms)).filter(|ms| *ms > 0) {
                    Some(ms) => ttl = Some(Duration::from_millis(ms.unsigned_abs())),
                    None => return err("invalid expire time in 'set' command"),
                }
            } else {
                return err("syntax error");
            }
        }
        if nx && self.live(key).is_some() {
            return Reply::Nil;
        }
        self.set_string(key, value.to_owned(), ttl);
        Reply::Status("OK".to_owned())
    }
}

fn in_range(value: f64, (min, min_open): (f64, bool), (max, max_open): (f64, bool)) -> bool {
    let above = if min_open { value > min } else { value >= min };
    let below = if max_open { value < max } else { value <= max };
    above && below
}

/// `ZADD`'s `score member` pairs, or `None` when a score is not a number.
fn scored<'a>(pairs: &[&'a str]) -> Option<Vec<(f64, &'a str)>> {
    (pairs.chunks(2))
        .map(|pair| match pair[0].parse::<f64>() {
            Ok(score) if !score.is_nan() => Some((score, pair[1])),
            _ => None,
        })
        .collect()
}
