-- Give back a permit and wake as many waiters as permits are free.
-- KEYS: holders, queue, state. ARGV[1] token, ARGV[2] grace ms, ARGV[3] limit
-- (used only when the state has lost the current limit).
-- Returns 1 when released, 0 when the caller held no live permit (it expired,
-- was cleared, or was never granted).
local token = ARGV[1]
local score = redis.call('ZSCORE', holders, token)
local held = score and tonumber(score) > now_ms
  and redis.call('HEXISTS', state, 'r:' .. token) == 0
if score then
  redis.call('ZREM', holders, token)
  forget(token)
end
purge()
promote(current_limit(ARGV[3]), tonumber(ARGV[2]), false)
if held then
  return 1
end
return 0
