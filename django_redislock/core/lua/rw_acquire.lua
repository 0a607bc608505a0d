-- Take the name for reading or writing, or join the queue of waiters.
-- KEYS: holders, queue, state (see rw_prelude.lua)
-- ARGV[1] token      random, unique to this acquisition
-- ARGV[2] ttl        lease length, ms
-- ARGV[3] name       readable name, kept for operators
-- ARGV[4] owner      owner metadata (JSON), kept for operators
-- ARGV[5] wait       ms the caller will wait; 0 = try once, never queue
-- ARGV[6] channel    <p|s|-> followed by the caller's wake-up channel
-- ARGV[7] grace      ms a woken waiter has to claim its turn
-- ARGV[8] keep       ms the state outlives the last holder or waiter
-- ARGV[9] mode       'r' (read) or 'w' (write)
-- Returns {1, fence, serial} when admitted (fence, as text: the writer's own
-- for a writer, the last writer's for a reader, '0' when none is known; the
-- serial its release sends, see _losses.lua), and {0, ms} when not: ms is the
-- waiter's fallback timer.

local token = ARGV[1]
local ttl = tonumber(ARGV[2])
local wait = tonumber(ARGV[5])
local grace = tonumber(ARGV[7])
local keep = tonumber(ARGV[8])
local mode = ARGV[9]

purge()

local function admit()
  return grant(token, mode, ttl, keep, ARGV[4], ARGV[3])
end

if redis.call('ZSCORE', holders, token) then
  local st = redis.call('HMGET', state, 'r:' .. token, 'f', 's:' .. token)
  if not st[1] then
    -- A retry of an acquire whose reply was lost: the turn is ours already.
    redis.call('ZADD', holders, now_ms + ttl, token)
    bump_ttl(holders, ttl + keep)
    bump_ttl(state, ttl + keep)
    return {1, st[2] or '0', st[3] or '0'}
  end
  -- The turn reserved for us when we were woken: claim it.
  redis.call('HDEL', state, 'r:' .. token)
  return admit()
end

local result = nil
local mine, dry = promote(grace, token, function() result = admit() end)
if mine then
  return result
end
if dry and compatible(mode) then
  -- Nobody waits ahead of us (we were not queued, or the queue ran dry).
  return admit()
end
if wait > 0 then
  if redis.call('HSET', state, 'w:' .. token, (now_ms + wait) .. '|' .. mode .. ARGV[6]) == 1 then
    redis.call('RPUSH', queue, token)
  end
  bump_ttl(queue, wait + keep)
  bump_ttl(state, wait + keep)
end
return {0, next_change()}
