-- Take the lease, or join the queue of waiters.
-- KEYS: lease, queue, state (see the prelude)
-- ARGV[1] token      random, unique to this acquisition
-- ARGV[2] ttl        lease length, ms
-- ARGV[3] name       lock name, kept for operators; '' when the key shows it
-- ARGV[4] owner      owner metadata (JSON), kept for operators
-- ARGV[5] wait       ms the caller will wait; 0 = try once, never queue
-- ARGV[6] channel    <p|s|-> followed by the caller's wake-up channel
-- ARGV[7] state ttl  ms the state (last fence) lives: ttl + STATE_KEEP_MS
-- ARGV[8] round      the caller's attempt number, named when the lease is
--                    handed to it (see the prelude)
-- Numbers arrive as text and stay text where they can (see the prelude).
-- Returns the fence, as text, when acquired; when busy, the ms until the
-- state can change by itself (the holder's lease end) as an integer: the
-- waiter's fallback timer.

local token = ARGV[1]
local st = redis.call('HMGET', state, 'q', 'f', 'd', 'e', 'h')
if st[3] and string.find(st[3], token, 1, true) then
  -- Its caller gave this acquisition up already (a reply that never came,
  -- then a give-back that ran first): grant and queue nothing.
  return 0
end
local holder = redis.call('HGET', lease, 't')
if not holder and not st[1] then
  -- Free, nobody queued: the common case.
  return give(token, ARGV[2], ARGV[7], ARGV[3], ARGV[4], st[2], st[4], st[5], false)
end

contended() -- from here on, `slow` holds the contended paths' helpers

local function enqueue()
  local wait = tonumber(ARGV[5])
  if wait <= 0 then
    return
  end
  local now = slow.read_clock()
  if redis.call('HEXISTS', state, token) == 0 then
    redis.call('RPUSH', queue, token)
  end
  redis.call('HSET', state, token,
    (now + wait) .. '|' .. ARGV[6] .. '|' .. ARGV[2] .. '|' .. ARGV[8] .. '|' .. ARGV[4],
    'q', '1', 'n', ARGV[3])
  slow.bump_ttl(queue, wait + KEEP)
  slow.bump_ttl(state, wait + KEEP)
end

if holder then
  if holder == token then
    -- Handed to us while we slept (and we missed the wake-up, or it named an
    -- older attempt), or a retry of an acquire whose reply was lost: it is
    -- ours. Its validity starts now; the state must outlive it as always.
    redis.call('PEXPIRE', lease, ARGV[2])
    slow.bump_ttl(state, tonumber(ARGV[7]))
    return redis.call('HGET', lease, 'f')
  end
  enqueue()
  return redis.call('PTTL', lease)
end

-- Free, and someone may be queued: the oldest live waiter goes first.
local head = slow.hand_off(token)
if head and head ~= token then
  -- An earlier waiter holds it now; queue behind it.
  enqueue()
  return redis.call('PTTL', lease)
end
return give(token, ARGV[2], ARGV[7], ARGV[3], ARGV[4], st[2], st[4], st[5], true)
