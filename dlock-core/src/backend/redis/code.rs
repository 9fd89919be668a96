//! How the protocol's code reaches a server: this version's scripts as functions of one library
//! (`FCALL`, the library loaded with `FUNCTION LOAD` where a server lacks it; see
//! `protocol/library.rs`), or each script by its hash (`EVALSHA`, the script loaded after
//! `NOSCRIPT`): an earlier layout's frozen scripts, and every script once a server has refused
//! functions (a server without `FCALL`, or an ACL user that may not call or load them).

use std::sync::atomic::{AtomicBool, Ordering};

use redis::aio::ConnectionLike;
use redis::{FromRedisValue, RedisError, RedisResult, Value};

use super::acks::Acked;
use crate::protocol::layout::FrozenLayout;
use crate::protocol::{Call, LIBRARY, Lua, Out};
use crate::replication::ReplicaAck;

/// Whether this backend's servers refused functions: shared by the backend's clones. Set once
/// (a server that refuses them once is not asked again), read on every script call.
#[derive(Debug, Default)]
pub(crate) struct Functions {
    refused: AtomicBool,
}

impl Functions {
    /// Whether calls may go by `FCALL`.
    pub(crate) fn usable(&self) -> bool {
        !self.refused.load(Ordering::Relaxed)
    }

    /// Calls go by `EVALSHA` from now on.
    pub(crate) fn refuse(&self) {
        if !self.refused.swap(true, Ordering::Relaxed) {
            tracing::info!(
                "the server refused Redis functions (FCALL or FUNCTION LOAD): scripts are sent \
                 by EVALSHA"
            );
        }
    }
}

/// What a script call runs on the server: a function of the library, or a script by its hash.
#[derive(Clone, Copy)]
pub(crate) enum Code {
    Function(&'static Lua),
    Script(&'static Lua),
}

impl Code {
    /// What a call of `lua` runs: its function while `functions` are usable, else the script.
    pub(crate) fn of(lua: &'static Lua, functions: &Functions) -> Self {
        match lua.function() {
            Some(_) if functions.usable() => Self::Function(lua),
            _ => Self::Script(lua),
        }
    }

    /// Loads what the call needs where the connection's server lacks it (on a cluster, on every
    /// master).
    pub(crate) async fn load<C: ConnectionLike>(self, c: &mut C) -> RedisResult<()> {
        match self {
            Self::Function(_) => load_library(c).await,
            Self::Script(lua) => lua.script().prepare_invoke().load_async(c).await.map(drop),
        }
    }
}

/// Loads this version's library, replacing one of the same name (the same code: the name is its
/// hash), so loads from many processes at once all succeed.
pub(crate) async fn load_library<C: ConnectionLike>(c: &mut C) -> RedisResult<()> {
    redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(LIBRARY.text())
        .query_async::<redis::Value>(c)
        .await
        .map(drop)
}

/// Whether `err` says the server lacks the code a call ran: `NOSCRIPT` for a script, "Function
/// not found" for a function (also inside a pipeline's error).
pub(crate) fn is_missing(err: &RedisError) -> bool {
    err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
        || err.to_string().contains("Function not found")
}

/// Whether `err` says the server will not run or load functions: it has no such command (before
/// Redis 7, or a proxy that does not pass it on), or the user may not use them.
pub(crate) fn refuses_functions(err: &RedisError) -> bool {
    let text = err.to_string().to_ascii_lowercase();
    (text.contains("unknown command") || err.code() == Some("NOPERM") || text.contains("noperm"))
        && (text.contains("fcall") || text.contains("function"))
}

/// `call`'s script: this version's, or the frozen layout's that stands in for it.
pub(super) fn lua_of(call: &impl Call, frozen: Option<&'static FrozenLayout>) -> &'static Lua {
    match frozen {
        None => call.lua(),
        Some(layout) => layout.script_for(call.lua()),
    }
}

/// One script call: `FCALL` or `EVALSHA` with its keys and arguments, and the code to load when
/// the server does not have it — or a plain command, with no script behind it.
pub(crate) struct ScriptCall<'b> {
    code: Option<Code>,
    /// The backend's choice between `FCALL` and `EVALSHA`, for a server that refuses the first.
    functions: Option<&'b Functions>,
    pub(super) cmd: redis::Cmd,
}

impl<'b> ScriptCall<'b> {
    /// The call as `FCALL` of its function, when it has one and `functions` are usable, else
    /// as `EVALSHA`.
    pub(super) fn of(
        call: &impl Call,
        frozen: Option<&'static FrozenLayout>,
        functions: &'b Functions,
    ) -> Self {
        let lua = lua_of(call, frozen);
        let mut cmd = ScriptCall::with_room(call);
        let code = Code::of(lua, functions);
        match (code, lua.function()) {
            (Code::Function(_), Some(function)) => cmd.arg("FCALL").arg(function),
            _ => cmd.arg("EVALSHA").arg(lua.script().get_hash()),
        };
        cmd.arg(call.key_count());
        call.write(&mut CmdOut(&mut cmd));
        Self {
            code: Some(code),
            functions: Some(functions),
            cmd,
        }
    }

    /// The call as `EVAL` with the script's text: it runs even on a server whose script cache
    /// is empty (and one that lacks the library).
    pub(super) fn eval(call: &impl Call, frozen: Option<&'static FrozenLayout>) -> redis::Cmd {
        let mut cmd = ScriptCall::with_room(call);
        cmd.arg("EVAL")
            .arg(lua_of(call, frozen).text())
            .arg(call.key_count());
        call.write(&mut CmdOut(&mut cmd));
        cmd
    }

    /// A command with room for a call's parts up front: growing the buffers argument by
    /// argument costs an allocation each time they double, on every acquisition and release.
    fn with_room(call: &impl Call) -> redis::Cmd {
        redis::Cmd::with_capacity(call.key_count() + 12, 64 * call.key_count() + 192)
    }

    /// A plain command.
    fn command(cmd: redis::Cmd) -> Self {
        Self {
            code: None,
            functions: None,
            cmd,
        }
    }

    /// `SPUBLISH <channel> <message>`: a wake-up sent by the client, routed to the node that
    /// serves the channel's slot.
    #[cfg(feature = "cluster")]
    pub(super) fn spublish(channel: &str, message: &str) -> Self {
        let mut cmd = redis::Cmd::with_capacity(3, channel.len() + message.len() + 16);
        cmd.arg("SPUBLISH").arg(channel).arg(message);
        Self::command(cmd)
    }

    pub(super) fn set_nx(key: &str, value: &str, ms: u64) -> Self {
        let mut cmd = redis::Cmd::with_capacity(6, key.len() + value.len() + 32);
        cmd.arg("SET")
            .arg(key)
            .arg(value)
            .arg("NX")
            .arg("PX")
            .arg(ms);
        Self::command(cmd)
    }

    /// The key the call is routed by: a script's first key, or a command's first argument.
    pub(super) fn first_key(&self) -> Option<&str> {
        let mut args = self.cmd.args_iter().filter_map(|arg| match arg {
            redis::Arg::Simple(bytes) => Some(bytes),
            _ => None,
        });
        // `FCALL <function> <number of keys> <key>..`, the same for `EVALSHA <sha>`, or
        // `<command> <key>..`.
        let skip = if self.code.is_some() { 3 } else { 1 };
        std::str::from_utf8(args.nth(skip)?).ok()
    }

    /// Sends the call, and `WAIT` behind it in one pipeline when `ack` asks for it; loads the
    /// code and sends again when the server did not have it; sends it again by `EVALSHA` when
    /// the server refused `FCALL` (it ran nothing).
    pub(super) async fn run<C: ConnectionLike, T: FromRedisValue>(
        &self,
        c: &mut C,
        ack: Option<ReplicaAck>,
    ) -> RedisResult<(T, Acked)> {
        match self.once(&self.cmd, c, ack).await {
            Err(err)
                if is_missing(&err)
                    && let Some(code) = self.code =>
            {
                match code.load(c).await {
                    Err(err)
                        if refuses_functions(&err)
                            && let Code::Function(lua) = code =>
                    {
                        self.by_hash(lua, c, ack).await
                    }
                    Err(err) => Err(err),
                    Ok(()) => self.once(&self.cmd, c, ack).await,
                }
            }
            Err(err)
                if refuses_functions(&err)
                    && let Some(Code::Function(lua)) = self.code =>
            {
                self.by_hash(lua, c, ack).await
            }
            other => other,
        }
    }

    /// The call sent again as `EVALSHA` of `lua`, after the server refused functions: from now
    /// on the backend sends every script so.
    async fn by_hash<C: ConnectionLike, T: FromRedisValue>(
        &self,
        lua: &'static Lua,
        c: &mut C,
        ack: Option<ReplicaAck>,
    ) -> RedisResult<(T, Acked)> {
        if let Some(functions) = self.functions {
            functions.refuse();
        }
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(lua.script().get_hash());
        // Everything after `FCALL <function>`: the key count, the keys and the arguments.
        for arg in self.cmd.args_iter().skip(2) {
            if let redis::Arg::Simple(bytes) = arg {
                cmd.arg(bytes);
            }
        }
        match self.once(&cmd, c, ack).await {
            Err(err) if is_missing(&err) => {
                Code::Script(lua).load(c).await?;
                self.once(&cmd, c, ack).await
            }
            other => other,
        }
    }

    async fn once<C: ConnectionLike, T: FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
        c: &mut C,
        ack: Option<ReplicaAck>,
    ) -> RedisResult<(T, Acked)> {
        match ack {
            None => Ok((cmd.query_async(c).await?, None)),
            Some(ack) => {
                let mut pipe = redis::pipe();
                pipe.add_command(cmd.clone()).add_command(ack.command());
                let (reply, answer): (T, Value) = pipe.query_async(c).await?;
                Ok((reply, Some((ack.count(answer)?, ack))))
            }
        }
    }
}

/// A command being built, as a call writes its keys and arguments into it.
struct CmdOut<'c>(&'c mut redis::Cmd);

impl Out for CmdOut<'_> {
    fn text(&mut self, text: &str) {
        self.0.arg(text);
    }

    fn number(&mut self, n: u64) {
        self.0.arg(n);
    }
}

#[cfg(test)]
mod tests {
    use super::{is_missing, refuses_functions};

    fn server_error(line: &str) -> redis::RedisError {
        let (code, detail) = line.split_once(' ').unwrap_or((line, ""));
        redis::make_extension_error(code.to_owned(), Some(detail.to_owned()))
    }

    #[test]
    fn missing_code_and_refused_functions_are_told_apart() {
        assert!(is_missing(&server_error("ERR Function not found")));
        assert!(!is_missing(&server_error("ERR wrong number of arguments")));
        assert!(refuses_functions(&server_error(
            "ERR unknown command 'FCALL', with args beginning with: 'dlock_x'"
        )));
        assert!(refuses_functions(&server_error(
            "NOPERM User locks has no permissions to run the 'function|load' command"
        )));
        assert!(!refuses_functions(&server_error(
            "NOPERM No permissions to access a key"
        )));
        assert!(!refuses_functions(&server_error("ERR Function not found")));
    }
}
