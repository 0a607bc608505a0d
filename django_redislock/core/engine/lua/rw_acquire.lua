-- Take the name for reading or writing, or join the queue of waiters.
-- KEYS: holders, queue, state (see _holders.lua and _rwlock.lua)
-- ARGV[1] token      random, unique to this acquisition
-- ARGV[2] ttl        lease length, ms
-- ARGV[3] name       readable name, kept for operators
-- ARGV[4] owner      owner metadata (JSON), kept for operators
-- ARGV[5] wait       ms the caller will wait; 0 = try once, never queue
-- ARGV[6] channel    <p|s|c|-> followed by the caller's wake-up channel
-- ARGV[7] grace      ms a woken waiter has to claim its turn
-- ARGV[8] unused     (callers send STATE_KEEP_MS; the scripts know it as KEEP)
-- ARGV[9] mode       'r' (read) or 'w' (write)
-- Returns {1, fence, serial} when admitted (fence, as text: the writer's own
-- for a writer, the last writer's for a reader, '0' when none is known; the
-- serial its release sends, see the memory of losses in the prelude), and
-- {0, ms} when not: ms is the waiter's fallback timer. An error (BAD_MS, the
-- prelude) for a ttl, wait or grace that is not a duration, before what needs
-- it is written.

local token = ARGV[1]
local ttl = tonumber(ARGV[2])
local mode = ARGV[9]
-- The wait and grace are checked where they are used (whole_ms).
if not whole_ms(ttl) then
  return redis.error_reply(BAD_MS .. 'ttl')
end

purge()

-- Admit the caller (its w: and r: fields are gone by now). Every holder gets
-- a serial; a writer's is its fence, so fences are the server's microsecond
-- clock, floored above the last serial, as the lock's are.
local function admit()
  local st = redis.call('HMGET', state, 'f', 'i', 'h')
  -- A state from before serials has a last fence and no i.
  local serial = issue(clock, st[2] or st[1])
  local fields = { 'n', ARGV[3], 'm:' .. token, mode }
  if mode == 'w' then
    fields[5], fields[6], fields[7], fields[8] = 'x', token, 'f', serial
    hold(token, ttl, ARGV[4], serial, st[3], fields)
    return {1, serial, serial}
  end
  hold(token, ttl, ARGV[4], serial, st[3], fields)
  return {1, st[1] or '0', serial}
end

if redis.call('ZSCORE', holders, token) then
  local st = redis.call('HMGET', state, 'r:' .. token, 'f', 's:' .. token)
  if not st[1] then
    -- A retry of an acquire whose reply was lost: the turn is ours already.
    redis.call('ZADD', holders, now_ms + ttl, token)
    outlive(ttl + KEEP, holders, state)
    return {1, st[2] or '0', st[3] or '0'}
  end
  -- The turn reserved for us when we were woken: claim it.
  redis.call('HDEL', state, 'r:' .. token)
  return admit()
end

local result = nil
local mine, dry = promote(tonumber(ARGV[7]), token, function() result = admit() end)
if mine then
  return result
end
if dry and compatible(mode) then
  -- Nobody waits ahead of us (we were not queued, or the queue ran dry).
  return admit()
end
return wait_in_line(token, tonumber(ARGV[5]), mode .. ARGV[6], false)
