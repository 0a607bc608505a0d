-- Give back a permit and wake as many waiters as permits are free.
-- KEYS: holders, queue, state. ARGV[1] token, ARGV[2] grace ms, ARGV[3] limit
-- (used only when the state has lost the current limit), ARGV[4] keep ms (no
-- longer used; kept for the order of arguments), ARGV[5] the permit's serial
-- (optional).
-- Returns 1 when released, 0 when the caller held no live permit (it expired,
-- was cleared, or was never granted).
-- Repeatable: a retry of a release whose reply was lost reports success,
-- however many permits were released in between, even when this one went
-- straight on to a waiter: the state remembers the permits lost, not the
-- ones released (see _losses.lua). Without the serial, only a permit still
-- held is released.
local token = ARGV[1]
local score = redis.call('ZSCORE', holders, token)
local live = score and tonumber(score) > now_ms
local held = live and redis.call('HEXISTS', state, 'r:' .. token) == 0
if live then
  -- Ours, or a reservation (never ours to release). One that ran out is
  -- left to purge, which remembers it lost.
  redis.call('ZREM', holders, token)
  forget(token)
end
purge()
promote(current_limit(ARGV[3]), tonumber(ARGV[2]), false)
if held then
  return 1
end
if score then
  return 0
end
local mem = redis.call('HMGET', state, 'i', 'h', 'u')
return losses().released(ARGV[5], mem[1], mem[2], mem[3]) and 1 or 0
