//! The protocol's scripts run in process: Lua 5.1, as Redis embeds it, with `redis.call` and
//! `redis.pcall` answered by the in-process [`Keyspace`], and replies converted both ways by
//! Redis's rules.

use std::collections::HashMap;
use std::time::Duration;

use mlua::{Function, Lua, LuaOptions, MultiValue, StdLib, Table, Value};
use tokio::time::Instant;

use super::keyspace::{Channels, Keyspace, Reply, format_score};
use crate::name::glob_matches;

/// An in-process server: a [`Keyspace`], and a Lua state that runs scripts over it, each
/// compiled once and kept by its SHA1 (as Redis's script cache keeps them), and the functions
/// of the libraries loaded (`FUNCTION LOAD`, called by `FCALL`).
pub(crate) struct Server {
    lua: Lua,
    compiled: HashMap<String, Function>,
    /// Each library's functions, by the library's name.
    libraries: HashMap<String, HashMap<String, Function>>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("compiled", &self.compiled.len())
            .finish_non_exhaustive()
    }
}

/// The keyspace and where its messages go, kept in the Lua state for `redis.call`.
struct Data {
    keyspace: Keyspace,
    channels: Box<dyn Channels + Send>,
}

impl Server {
    /// A server whose clock read `clock.0` (since 1970) at `clock.1`.
    pub(crate) fn new(
        channels: Box<dyn Channels + Send>,
        clock: (Duration, Instant),
    ) -> Result<Self, String> {
        let failed = |e: mlua::Error| e.to_string();
        // The libraries Redis opens for scripts that the protocol uses (the base library is
        // always there: `tonumber`, `type`, `unpack`).
        let lua = Lua::new_with(
            StdLib::STRING | StdLib::TABLE | StdLib::MATH,
            LuaOptions::default(),
        )
        .map_err(failed)?;
        lua.set_app_data(Data {
            keyspace: Keyspace::new(clock),
            channels,
        });
        let redis = lua.create_table().map_err(failed)?;
        let call = lua
            .create_function(|lua, a: MultiValue| command(lua, &a, false))
            .map_err(failed)?;
        let pcall = lua
            .create_function(|lua, a: MultiValue| command(lua, &a, true))
            .map_err(failed)?;
        redis.set("call", call).map_err(failed)?;
        redis.set("pcall", pcall).map_err(failed)?;
        lua.globals().set("redis", redis).map_err(failed)?;
        Ok(Self {
            lua,
            compiled: HashMap::new(),
            libraries: HashMap::new(),
        })
    }

    /// Runs one command as a server would: the scripting commands here, the rest by the
    /// keyspace.
    pub(crate) fn command(&mut self, words: &[&str]) -> Reply {
        let Some((name, rest)) = words.split_first() else {
            return Reply::Error("ERR empty command".to_owned());
        };
        let is = |command: &str| name.eq_ignore_ascii_case(command);
        if is("EVALSHA") || is("EVAL") {
            let Some((script, (keys, args))) = split_call(rest) else {
                return Reply::Error(BAD_CALL.to_owned());
            };
            return if is("EVAL") {
                let sha = redis::Script::new(script).get_hash().to_owned();
                match self.compile(&sha, script) {
                    Ok(function) => self.call(&function, keys, args),
                    Err(reply) => reply,
                }
            } else {
                let known = (self.compiled.get(script))
                    .or_else(|| self.compiled.get(&script.to_ascii_lowercase()));
                match known {
                    Some(function) => self.call(&function.clone(), keys, args),
                    None => {
                        Reply::Error("NOSCRIPT No matching script. Please use EVAL.".to_owned())
                    }
                }
            };
        }
        if is("FCALL") {
            return self.fcall(rest);
        }
        match rest {
            [load, text] if is("FUNCTION") && load.eq_ignore_ascii_case("LOAD") => {
                self.load_library(text, false)
            }
            [load, replace, text]
                if is("FUNCTION")
                    && load.eq_ignore_ascii_case("LOAD")
                    && replace.eq_ignore_ascii_case("REPLACE") =>
            {
                self.load_library(text, true)
            }
            [flush, ..] if is("FUNCTION") && flush.eq_ignore_ascii_case("FLUSH") => {
                self.libraries.clear();
                Reply::Status("OK".to_owned())
            }
            [load, text] if is("SCRIPT") && load.eq_ignore_ascii_case("LOAD") => {
                let sha = redis::Script::new(text).get_hash().to_owned();
                match self.compile(&sha, text) {
                    Ok(_) => Reply::Bulk(sha),
                    Err(reply) => reply,
                }
            }
            [] if is("PING") => Reply::Status("PONG".to_owned()),
            // One batch: every key the pattern matches.
            [_cursor, m, pattern, ..] if is("SCAN") && m.eq_ignore_ascii_case("MATCH") => {
                Reply::Array(vec![Reply::Bulk("0".to_owned()), self.matching(pattern)])
            }
            [pattern] if is("KEYS") => self.matching(pattern),
            _ => match self.lua.app_data_mut::<Data>() {
                Some(mut data) => {
                    let Data { keyspace, channels } = &mut *data;
                    keyspace.command(words, channels.as_ref())
                }
                None => Reply::Error("ERR the keyspace is in use".to_owned()),
            },
        }
    }

    /// Every live key `pattern` matches.
    fn matching(&self, pattern: &str) -> Reply {
        let keys = self.with_keyspace(|k| k.keys()).unwrap_or_default();
        let found = keys.into_iter().filter(|key| glob_matches(pattern, key));
        Reply::Array(found.map(Reply::Bulk).collect())
    }

    /// The keyspace, for what no command reads (every key, for operators).
    pub(crate) fn with_keyspace<T>(&self, f: impl FnOnce(&mut Keyspace) -> T) -> Option<T> {
        let mut data = self.lua.app_data_mut::<Data>()?;
        Some(f(&mut data.keyspace))
    }

    /// The script `text` (whose SHA1 is `sha`), compiled once.
    fn compile(&mut self, sha: &str, text: &str) -> Result<Function, Reply> {
        if let Some(function) = self.compiled.get(sha) {
            return Ok(function.clone());
        }
        match self.lua.load(text).set_name("user_script").into_function() {
            Ok(function) => {
                self.compiled.insert(sha.to_owned(), function.clone());
                Ok(function)
            }
            Err(e) => Err(Reply::Error(format!("ERR Error compiling script {e}"))),
        }
    }

    /// `FCALL <function> <number of keys> <key>.. <arg>..`: the function's reply, or Redis's
    /// error for a function no library has.
    fn fcall(&self, rest: &[&str]) -> Reply {
        let Some((name, (keys, args))) = split_call(rest) else {
            return Reply::Error(BAD_CALL.to_owned());
        };
        let found = (self.libraries.values()).find_map(|functions| functions.get(name));
        let Some(function) = found else {
            return Reply::Error("ERR Function not found".to_owned());
        };
        let run = || {
            let lua = &self.lua;
            let keys = lua.create_sequence_from(keys.iter().copied())?;
            let args = lua.create_sequence_from(args.iter().copied())?;
            let value: Value = function.call((keys, args))?;
            from_lua(&value)
        };
        run().unwrap_or_else(|e| Reply::Error(script_error(&e)))
    }

    /// `FUNCTION LOAD [REPLACE] <library>`: runs the library's code once, keeping the functions
    /// it registers (`redis.register_function(name, callback)` or
    /// `redis.register_function{function_name = .., callback = .., flags = ..}`; flags are
    /// not checked here). Without `replace`, a library of the same name is an error, as on Redis.
    fn load_library(&mut self, text: &str, replace: bool) -> Reply {
        let Some((shebang, code)) = text.split_once('\n') else {
            return Reply::Error("ERR Missing library metadata".to_owned());
        };
        let Some(name) = (shebang.strip_prefix("#!lua name="))
            .map(str::trim)
            .filter(|n| !n.is_empty())
        else {
            return Reply::Error("ERR Missing library metadata".to_owned());
        };
        if !replace && self.libraries.contains_key(name) {
            return Reply::Error(format!("ERR Library '{name}' already exists"));
        }
        match self.register(code) {
            Ok(functions) => {
                self.libraries.insert(name.to_owned(), functions);
                Reply::Bulk(name.to_owned())
            }
            Err(e) => Reply::Error(format!("ERR Error registering functions {e}")),
        }
    }

    /// Runs a library's code with `redis.register_function` in place: the functions it
    /// registered, by name.
    fn register(&self, code: &str) -> mlua::Result<HashMap<String, Function>> {
        let lua = &self.lua;
        let registered = lua.create_table()?;
        let into = registered.clone();
        let register =
            lua.create_function(move |_, (first, callback): (Value, Option<Function>)| {
                match (first, callback) {
                    (Value::Table(named), _) => into.set(
                        named.get::<String>("function_name")?,
                        named.get::<Function>("callback")?,
                    ),
                    (Value::String(name), Some(callback)) => into.set(name, callback),
                    _ => Err(mlua::Error::RuntimeError(
                        "ERR wrong arguments to redis.register_function".to_owned(),
                    )),
                }
            })?;
        let redis: Table = lua.globals().get("redis")?;
        redis.set("register_function", register)?;
        // The `#!lua` line left out, its line kept: errors name the library's own lines.
        let loaded = (lua.load(format!("\n{code}")).set_name("library")).exec();
        redis.set("register_function", Value::Nil)?;
        loaded?;
        registered.pairs::<String, Function>().collect()
    }

    /// Runs a compiled script with `keys` and `args`.
    fn call(&self, function: &Function, keys: &[&str], args: &[&str]) -> Reply {
        match self.run(function, keys, args) {
            Ok(reply) => reply,
            Err(e) => Reply::Error(script_error(&e)),
        }
    }

    fn run(&self, function: &Function, keys: &[&str], args: &[&str]) -> mlua::Result<Reply> {
        let lua = &self.lua;
        let globals = lua.globals();
        globals.raw_set("KEYS", lua.create_sequence_from(keys.iter().copied())?)?;
        globals.raw_set("ARGV", lua.create_sequence_from(args.iter().copied())?)?;
        let value: Value = function.call(())?;
        from_lua(&value)
    }
}

/// What Redis answers a script call whose key count is missing or too large.
const BAD_CALL: &str = "ERR Number of keys can't be greater than number of args";

/// A script call's keys and arguments.
type KeysAndArgs<'w> = (&'w [&'w str], &'w [&'w str]);

/// A script call's words after its command (`EVAL`, `EVALSHA`, `FCALL`): the script or
/// function, then its keys and its arguments, as its key count splits them.
fn split_call<'w>(rest: &'w [&'w str]) -> Option<(&'w str, KeysAndArgs<'w>)> {
    let (script, rest) = rest.split_first()?;
    let count = rest.first()?.parse::<usize>().ok()?;
    let words = rest.get(1..)?;
    (count <= words.len()).then(|| (*script, words.split_at(count)))
}

/// `redis.call` (`protected`: `redis.pcall`).
fn command(lua: &Lua, args: &MultiValue, protected: bool) -> mlua::Result<Value> {
    let words = command_words(args)?;
    let words: Vec<&str> = words.iter().map(AsRef::as_ref).collect();
    let reply = {
        let Some(mut data) = lua.app_data_mut::<Data>() else {
            return Err(mlua::Error::RuntimeError(
                "ERR the keyspace is in use".to_owned(),
            ));
        };
        let Data { keyspace, channels } = &mut *data;
        keyspace.command(&words, channels.as_ref())
    };
    match reply {
        Reply::Error(e) if !protected => Err(mlua::Error::RuntimeError(e)),
        reply => to_lua(lua, reply),
    }
}

/// A script's failure as Redis words it.
fn script_error(e: &mlua::Error) -> String {
    match e {
        mlua::Error::CallbackError { cause, .. } => script_error(cause),
        mlua::Error::RuntimeError(text) if text.starts_with("ERR") || text.contains(' ') => {
            text.clone()
        }
        other => format!("ERR {other}"),
    }
}

/// A word of a command: a script's string as it is, a number as Redis writes it.
enum Word {
    Text(mlua::BorrowedStr),
    Number(String),
}

impl AsRef<str> for Word {
    fn as_ref(&self) -> &str {
        match self {
            Word::Text(s) => s,
            Word::Number(s) => s,
        }
    }
}

/// A `redis.call`'s arguments as the words of a command.
fn command_words(args: &MultiValue) -> mlua::Result<Vec<Word>> {
    args.iter()
        .map(|arg| match arg {
            Value::String(s) => Ok(Word::Text(s.to_str()?)),
            Value::Integer(n) => Ok(Word::Number(n.to_string())),
            Value::Number(n) => Ok(Word::Number(format_score(*n))),
            _ => Err(mlua::Error::RuntimeError(
                "ERR Lua redis lib command arguments must be strings or integers".to_owned(),
            )),
        })
        .collect()
}

/// A reply as a script sees it.
fn to_lua(lua: &Lua, reply: Reply) -> mlua::Result<Value> {
    Ok(match reply {
        Reply::Nil => Value::Boolean(false),
        Reply::Int(n) => Value::Number(n as f64),
        Reply::Bulk(s) => Value::String(lua.create_string(&s)?),
        Reply::Array(items) => {
            let table = lua.create_table_with_capacity(items.len(), 0)?;
            for (i, item) in items.into_iter().enumerate() {
                table.raw_set(i + 1, to_lua(lua, item)?)?;
            }
            Value::Table(table)
        }
        Reply::Status(s) => Value::Table(lua.create_table_from([("ok", s)])?),
        Reply::Error(s) => Value::Table(lua.create_table_from([("err", s)])?),
    })
}

/// A script's return value as a reply.
fn from_lua(value: &Value) -> mlua::Result<Reply> {
    Ok(match value {
        Value::Nil | Value::Boolean(false) => Reply::Nil,
        Value::Boolean(true) => Reply::Int(1),
        Value::Integer(n) => Reply::Int(*n),
        // Redis truncates a number to an integer.
        Value::Number(n) => Reply::Int(n.trunc() as i64),
        Value::String(s) => Reply::Bulk(s.to_str()?.to_owned()),
        Value::Table(t) => table_reply(t)?,
        _ => Reply::Nil,
    })
}

fn table_reply(t: &Table) -> mlua::Result<Reply> {
    if let Value::String(e) = t.raw_get::<Value>("err")? {
        return Ok(Reply::Error(e.to_str()?.to_owned()));
    }
    if let Value::String(s) = t.raw_get::<Value>("ok")? {
        return Ok(Reply::Status(s.to_str()?.to_owned()));
    }
    let mut items = Vec::new();
    for i in 1.. {
        let item: Value = t.raw_get(i)?;
        if item.is_nil() {
            break;
        }
        items.push(from_lua(&item)?);
    }
    Ok(Reply::Array(items))
}
