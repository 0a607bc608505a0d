-- Give back a permit and wake as many waiters as permits are free.
-- KEYS: holders, queue, state (see _holders.lua). ARGV[1] token, ARGV[2]
-- grace ms, ARGV[3] limit (used only when the state has lost the current
-- limit), ARGV[4] unused (callers send STATE_KEEP_MS; the scripts know it as
-- KEEP), ARGV[5] the permit's serial (optional).
-- Returns 1 when released, 0 when the caller held no live permit (it expired,
-- was cleared, or was never granted).
-- Repeatable: a retry of a release whose reply was lost reports success,
-- however many permits were released in between, even when this one went
-- straight on to a waiter: the state remembers the permits lost, not the
-- ones released (see the memory of losses in the prelude). Without the
-- serial, only a permit still held is released.
local token = ARGV[1]
local score = redis.call('ZSCORE', holders, token)
local live = score and tonumber(score) > now_ms
local st = live and redis.call('HMGET', state, 'r:' .. token, 's:' .. token, 'h')
if live then
  -- Ours, or a reservation (never ours to release). One that ran out is
  -- left to purge, which remembers it lost.
  redis.call('ZREM', holders, token)
  forget(token)
end
local purged = purge()
promote(tonumber(ARGV[2]), false)
if live and not st[1] then
  released(st[2], st[3], purged)
  return 1
end
return score and 0 or common().losses().holder_released(ARGV[5])
