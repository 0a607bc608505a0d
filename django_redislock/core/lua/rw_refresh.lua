-- Extend the caller's turn to ttl ms from now, if it still holds it.
-- KEYS: holders, queue, state. ARGV[1] token, ARGV[2] ttl ms, ARGV[3] keep ms.
-- Returns 1 when extended, 0 when the caller held no live turn.
local token = ARGV[1]
local score = redis.call('ZSCORE', holders, token)
if not score or tonumber(score) <= now_ms
    or redis.call('HEXISTS', state, 'r:' .. token) == 1 then
  return 0
end
local ttl = tonumber(ARGV[2])
redis.call('ZADD', holders, now_ms + ttl, token)
bump_ttl(holders, ttl + tonumber(ARGV[3]))
bump_ttl(state, ttl + tonumber(ARGV[3]))
return 1
