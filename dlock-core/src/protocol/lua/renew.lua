-- RENEW: a batch of lease changes (watchdog renewals, `extend`), one per key.
--
-- KEYS[i]     a lock, or a semaphore's permits
-- ARGV[3i-2]  the owner (for permits: the permit id)
-- ARGV[3i-1]  the new lease, ms
-- ARGV[3i]    the change's sequence number; prefixed with `p` for a permit, whose expiry moves
--             to the lease from now if it has not passed (`p<seq>x<n>`: the n permits taken
--             at once as the owner, see `permit_member`)
--
-- Returns one integer per key: 1 applied; 2 still held, but a later change was applied already
-- (this one is stale and was ignored); 0 gone or held by someone else. A key holding something
-- other than a lock answers 0 without failing the rest.
--@flags allow-oom
--@include clock
--@include sorted_sets
--@include hold
local out = {}
local now
for i = 1, #KEYS do
  if string.sub(ARGV[3 * i], 1, 1) == 'p' then
    now = now or now_ms()
    local lease = tonumber(ARGV[3 * i - 1])
    local expiry = redis.pcall('ZSCORE', KEYS[i], ARGV[3 * i - 2])
    if type(expiry) == 'string' and tonumber(expiry) > now then
      add_until(KEYS[i], ARGV[3 * i - 2], now, lease)
      local n = tonumber(string.match(ARGV[3 * i], 'x(%d+)$') or '1')
      on_permits('ZADD XX', KEYS[i], ARGV[3 * i - 2], 2, n, now + lease)
      out[i] = 1
    else
      out[i] = 0
    end
  else
    local v = redis.pcall('GET', KEYS[i])
    if type(v) == 'string' and who(v) == ARGV[3 * i - 2] then
      local seq = tonumber(ARGV[3 * i])
      if seq > tonumber(field(v, 's') or '0') then
        redis.call('PSETEX', KEYS[i], ARGV[3 * i - 1], set_field(v, 's', ARGV[3 * i]))
        out[i] = 1
      else
        out[i] = 2
      end
    else
      out[i] = 0
    end
  end
end
return out
