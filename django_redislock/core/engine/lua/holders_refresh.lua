-- Extend the caller's permit or turn (a semaphore's or a read-write lock's:
-- one script for both) to ttl ms from now, if it still holds it.
-- KEYS: holders, queue, state (see _holders.lua). ARGV[1] token, ARGV[2] ttl
-- ms, ARGV[3] unused (callers send STATE_KEEP_MS; the scripts know it as KEEP).
-- Returns 1 when extended, 0 when the caller held no live permit or turn; an
-- error (BAD_MS, the prelude) for a ttl that is not a duration.
local token = ARGV[1]
local ttl = tonumber(ARGV[2])
if not whole_ms(ttl) then
  return redis.error_reply(BAD_MS .. 'ttl')
end
local score = redis.call('ZSCORE', holders, token)
if not score or tonumber(score) <= now_ms
    or redis.call('HEXISTS', state, 'r:' .. token) == 1 then
  return 0
end
redis.call('ZADD', holders, now_ms + ttl, token)
-- For operators only (inspect_holders.lua): when this holder last renewed
-- or extended, server ms; forget() drops it with the holder's other fields.
redis.call('HSET', state, 'e:' .. token, now_ms)
outlive(ttl + KEEP, holders, state)
return 1
