-- Take a permit, or join the queue of waiters. One script: purge, count, admit.
-- KEYS: holders, queue, state (see _holders.lua and _semaphore.lua)
-- ARGV[1] token      random, unique to this acquisition
-- ARGV[2] ttl        permit length, ms
-- ARGV[3] name       readable semaphore name, kept for operators
-- ARGV[4] owner      owner metadata (JSON), kept for operators
-- ARGV[5] wait       ms the caller will wait; 0 = try once, never queue
-- ARGV[6] channel    <p|s|c|-> followed by the caller's wake-up channel
-- ARGV[7] grace      ms a woken waiter has to claim its permit
-- ARGV[8] unused     (callers send STATE_KEEP_MS; the scripts know it as KEEP)
-- ARGV[9] limit      the caller's limit; it becomes the current limit
-- Returns {1, serial} when a permit was granted (the serial its release
-- sends, see the memory of losses in the prelude), and {0, ms} when none is
-- free: ms is the waiter's fallback timer. An error (BAD_MS, the prelude) for
-- a ttl, wait or grace that is not a duration, before what needs it is written.

local token = ARGV[1]
local ttl = tonumber(ARGV[2])
local wait = tonumber(ARGV[5])
local limit = tonumber(ARGV[9])
-- The wait and grace are checked where they are used (whole_ms).
if not whole_ms(ttl) then
  return redis.error_reply(BAD_MS .. 'ttl')
end

purge()
if redis.call('HSET', state, 'n', ARGV[3], 'l', limit) > 0 then
  -- A new state (a state that was there has a TTL already).
  outlive(KEEP, state)
end

local function grant()
  redis.call('HDEL', state, 'r:' .. token, 'w:' .. token)
  local st = redis.call('HMGET', state, 'i', 'h')
  local serial = issue(clock, st[1])
  hold(token, ttl, ARGV[4], serial, st[2], {})
  return {1, serial}
end

if redis.call('ZSCORE', holders, token) then
  if redis.call('HEXISTS', state, 'r:' .. token) == 0 then
    -- A retry of an acquire whose reply was lost: the permit is ours already.
    redis.call('ZADD', holders, now_ms + ttl, token)
    outlive(ttl + KEEP, holders, state)
    return {1, redis.call('HGET', state, 's:' .. token) or '0'}
  end
  -- Our reserved permit. If the limit fell below the permits in use since it
  -- was reserved, claiming it would overfill: give it back and go first in line.
  if redis.call('ZCARD', holders) > limit then
    redis.call('ZREM', holders, token)
    forget(token)
    return wait_in_line(token, wait, ARGV[6], true)
  end
  return grant()
end

local mine, free = promote(tonumber(ARGV[7]), token, limit)
if mine or free > 0 then
  -- free > 0 after promote means the queue ran dry without reaching us: we
  -- were not queued, and nobody is ahead.
  return grant()
end
return wait_in_line(token, wait, ARGV[6], false)
