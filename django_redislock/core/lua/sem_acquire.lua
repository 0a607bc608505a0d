-- Take a permit, or join the queue of waiters. One script: purge, count, admit.
-- KEYS: holders, queue, state (see sem_prelude.lua)
-- ARGV[1] token      random, unique to this acquisition
-- ARGV[2] ttl        permit length, ms
-- ARGV[3] name       readable semaphore name, kept for operators
-- ARGV[4] owner      owner metadata (JSON), kept for operators
-- ARGV[5] wait       ms the caller will wait; 0 = try once, never queue
-- ARGV[6] channel    <p|s|-> followed by the caller's wake-up channel
-- ARGV[7] grace      ms a woken waiter has to claim its permit
-- ARGV[8] keep       ms the state outlives the last permit or waiter
-- ARGV[9] limit      the caller's limit; it becomes the current limit
-- Returns {1, serial} when a permit was granted (the serial its release
-- sends, see _losses.lua), and {0, ms} when none is free: ms is the waiter's
-- fallback timer.

local token = ARGV[1]
local ttl = tonumber(ARGV[2])
local wait = tonumber(ARGV[5])
local grace = tonumber(ARGV[7])
local keep = tonumber(ARGV[8])
local limit = tonumber(ARGV[9])

purge()
redis.call('HSET', state, 'n', ARGV[3], 'l', limit)
bump_ttl(state, keep)

local function enqueue()
  if wait > 0 then
    if redis.call('HEXISTS', state, 'w:' .. token) == 0 then
      redis.call('RPUSH', queue, token)
    end
    redis.call('HSET', state, 'w:' .. token, (now_ms + wait) .. '|' .. ARGV[6])
    bump_ttl(queue, wait + keep)
    bump_ttl(state, wait + keep)
  end
  return {0, next_change()}
end

local function grant()
  redis.call('ZADD', holders, now_ms + ttl, token)
  redis.call('HDEL', state, 'r:' .. token, 'w:' .. token)
  local st = redis.call('HMGET', state, 'i', 'h')
  local serial = issue(clock, st[1])
  if st[2] then
    redis.call('HSET', state, 'o:' .. token, ARGV[4], 'a:' .. token, now_ms,
      's:' .. token, serial, 'i', serial)
  else
    -- A new state: it answers for the serials it issues from here on.
    redis.call('HSET', state, 'o:' .. token, ARGV[4], 'a:' .. token, now_ms,
      's:' .. token, serial, 'i', serial, 'h', serial)
  end
  bump_ttl(holders, ttl + keep)
  bump_ttl(state, ttl + keep)
  return {1, serial}
end

if redis.call('ZSCORE', holders, token) then
  if redis.call('HEXISTS', state, 'r:' .. token) == 0 then
    -- A retry of an acquire whose reply was lost: the permit is ours already.
    redis.call('ZADD', holders, now_ms + ttl, token)
    bump_ttl(holders, ttl + keep)
    bump_ttl(state, ttl + keep)
    return {1, redis.call('HGET', state, 's:' .. token) or '0'}
  end
  -- Our reserved permit. If the limit fell below the permits in use since it
  -- was reserved, claiming it would overfill: give it back and go first in line.
  if redis.call('ZCARD', holders) > limit then
    redis.call('ZREM', holders, token)
    forget(token)
    if wait > 0 then
      redis.call('LPUSH', queue, token)
      redis.call('HSET', state, 'w:' .. token, (now_ms + wait) .. '|' .. ARGV[6])
      bump_ttl(queue, wait + keep)
      bump_ttl(state, wait + keep)
    end
    return {0, next_change()}
  end
  return grant()
end

local mine, free = promote(limit, grace, token)
if mine or free > 0 then
  -- free > 0 after promote means the queue ran dry without reaching us: we
  -- were not queued, and nobody is ahead.
  return grant()
end
return enqueue()
