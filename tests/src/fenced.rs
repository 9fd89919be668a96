//! A fenced resource: a Redis hash that refuses writes carrying a stale fencing token.
//!
//! The resource key is a hash with two fields, `fence` (the highest token that wrote) and `value`
//! (what it wrote). [`write()`] runs one Lua script: a write whose token is lower than `fence` is
//! refused (the script returns 0) and changes nothing; any other write stores its token and value
//! (returns 1). An equal token is accepted: one holder writes many times under one hold.
//!
//! Tokens are compared as Lua numbers (doubles): exact for integers below 2^53, which dlock's
//! tokens (the server clock in microseconds) stay under until the year 2255.

use dlock_core::redis::{self, aio::MultiplexedConnection};

/// The script behind [`write()`]: `KEYS[1]` the resource, `ARGV[1]` the token, `ARGV[2]` the value.
pub const SCRIPT: &str = r"
local top = redis.call('HGET', KEYS[1], 'fence')
if top and tonumber(top) > tonumber(ARGV[1]) then
    return 0
end
redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'value', ARGV[2])
return 1
";

/// Writes `value` to `resource` under `token`: `true` if accepted, `false` if refused because a
/// higher token already wrote.
pub async fn write(
    con: &mut MultiplexedConnection,
    resource: &str,
    token: u64,
    value: &str,
) -> redis::RedisResult<bool> {
    let accepted: i64 = redis::cmd("EVAL")
        .arg(SCRIPT)
        .arg(1)
        .arg(resource)
        .arg(token)
        .arg(value)
        .query_async(con)
        .await?;
    Ok(accepted == 1)
}

/// The highest token that wrote `resource` and the value it wrote, if any write was accepted.
pub async fn read(
    con: &mut MultiplexedConnection,
    resource: &str,
) -> redis::RedisResult<Option<(u64, String)>> {
    let (fence, value): (Option<u64>, Option<String>) = redis::cmd("HMGET")
        .arg(resource)
        .arg("fence")
        .arg("value")
        .query_async(con)
        .await?;
    Ok(fence.zip(value))
}
