-- Take the lease, or join the queue of waiters.
-- KEYS: lease, queue, state (see the prelude)
-- ARGV[1] token      random, unique to this acquisition
-- ARGV[2] ttl        lease length, ms
-- ARGV[3] name       readable lock name, kept for operators
-- ARGV[4] owner      owner metadata (JSON), kept for operators
-- ARGV[5] wait       ms the caller will wait; 0 = try once, never queue
-- ARGV[6] channel    <p|s|-> followed by the caller's wake-up channel
-- ARGV[7] grace      unused since leases are handed over directly; kept so
--                    callers of either version agree on the arguments
-- ARGV[8] keep       ms the state (last fence) outlives the lease
-- Returns {1, fence} when acquired, {0, ms} when busy: ms is when the state can
-- change by itself (the holder's lease end), the waiter's fallback timer.

local token = ARGV[1]
local ttl = tonumber(ARGV[2])
local wait = tonumber(ARGV[5])
local keep = tonumber(ARGV[8])

local st = redis.call('HMGET', state, 'q', 'f')
local queued = st[1]

local function enqueue()
  if wait <= 0 then
    return
  end
  read_clock()
  if redis.call('HEXISTS', state, token) == 0 then
    redis.call('RPUSH', queue, token)
  end
  redis.call('HSET', state, token,
    (now_ms + wait) .. '|' .. ARGV[6] .. '|' .. ttl .. '|' .. ARGV[4], 'q', '1', 'n', ARGV[3])
  bump_ttl(queue, wait + keep)
  bump_ttl(state, wait + keep)
end

local holder = redis.call('HGET', lease, 't')
if holder then
  if holder == token then
    -- Handed to us while we slept (and we missed the wake-up), or a retry of
    -- an acquire whose reply was lost: it is ours. Its validity starts now.
    redis.call('HSET', lease, 'x', ttl)
    redis.call('PEXPIRE', lease, ttl)
    return {1, tonumber(redis.call('HGET', lease, 'f'))}
  end
  enqueue()
  return {0, redis.call('PTTL', lease)}
end

if queued then
  local head = hand_off(token)
  if head and head ~= token then
    -- An earlier waiter holds it now; queue behind it.
    enqueue()
    return {0, redis.call('PTTL', lease)}
  end
end
return {1, give(token, ttl, ARGV[3], ARGV[4], st[2], queued)}
