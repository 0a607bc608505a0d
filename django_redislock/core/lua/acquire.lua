-- Take the lease, or join the queue of waiters.
-- KEYS: lease, queue, state (see the prelude)
-- ARGV[1] token      random, unique to this acquisition
-- ARGV[2] ttl        lease length, ms
-- ARGV[3] name       readable lock name, kept for operators
-- ARGV[4] owner      owner metadata (JSON), kept for operators
-- ARGV[5] wait       ms the caller will wait; 0 = try once, never queue
-- ARGV[6] channel    <p|s|-> followed by the caller's wake-up channel
-- ARGV[7] grace      ms a woken waiter has to claim its turn
-- ARGV[8] keep       ms the state (last fence) outlives the lease
-- Returns {1, fence} when acquired, {0, ms} when busy: ms is when the state can
-- next change by itself (lease or reservation end), the waiter's fallback timer.

local token = ARGV[1]
local ttl = tonumber(ARGV[2])
local wait = tonumber(ARGV[5])
local grace = tonumber(ARGV[7])
local keep = tonumber(ARGV[8])

read_clock()
local st = redis.call('HMGET', state, 'r', 'u', 'q', 'f')
local reserved, queued = st[1], st[3]

local function enqueue()
  if wait <= 0 then
    return
  end
  if redis.call('HEXISTS', state, token) == 0 then
    redis.call('RPUSH', queue, token)
  end
  redis.call('HSET', state, token, (now_ms + wait) .. '|' .. ARGV[6], 'q', '1')
  bump_ttl(queue, wait + keep)
  bump_ttl(state, wait + keep)
end

local function grant()
  -- Fences follow the server clock in microseconds, and exceed the last one
  -- issued: they keep increasing after the state expires or Redis restarts
  -- empty, as long as the server clock does not step back.
  local fence = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
  local last = tonumber(st[4] or '0')
  if last >= fence then
    fence = last + 1
  end
  local f = string.format('%.0f', fence)
  redis.call('HSET', lease, 't', token, 'f', f, 'n', ARGV[3], 'o', ARGV[4], 'a', now_ms, 'x', ttl)
  redis.call('PEXPIRE', lease, ttl)
  redis.call('HSET', state, 'f', f)
  if queued then
    bump_ttl(state, ttl + keep)
  else
    -- No waiter: no deadline in the state can outlive this.
    redis.call('PEXPIRE', state, ttl + keep)
  end
  return {1, fence}
end

local holder = redis.call('HGET', lease, 't')
if holder then
  if holder == token then
    -- A retry of an acquire whose reply was lost: it is ours already.
    redis.call('HSET', lease, 'x', ttl)
    redis.call('PEXPIRE', lease, ttl)
    return {1, tonumber(redis.call('HGET', lease, 'f'))}
  end
  enqueue()
  return {0, redis.call('PTTL', lease)}
end

if reserved then
  if reserved == token then
    redis.call('HDEL', state, 'r', 'u')
    return grant()
  end
  local left = tonumber(st[2]) - now_ms
  if left > 0 then
    enqueue()
    return {0, left}
  end
  -- The reserved waiter missed its turn; it goes, the next one is woken below.
elseif not queued then
  return grant()
end

local head = promote(grace, token)
if head == token or not head then
  return grant()
end
enqueue()
return {0, grace}
