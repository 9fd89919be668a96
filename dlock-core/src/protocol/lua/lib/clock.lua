-- `now_ms(t)`: the server clock in ms — of the `TIME` reply `t` if given (a script that needs
-- the clock twice reads it once), else read now.
local function now_ms(t)
  t = t or redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
