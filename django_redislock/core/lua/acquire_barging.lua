-- Take the lease, or join the queue of waiters: the barging order
-- (Lock(..., fair=False); see _barging.lua). A free lease goes to whoever
-- asks, even with waiters queued, until the head of the queue has seen
-- `limit` others served; then it goes to the head, as acquire.lua does.
-- KEYS: lease, queue, state (see the prelude)
-- ARGV[1..8] as acquire.lua
-- ARGV[9] limit      barges allowed while the head of the queue waits
-- Returns as acquire.lua.

local token = ARGV[1]
local st = redis.call('HMGET', state, 'q', 'f', 'd', 'b', 'e', 'h')
if st[3] and string.find(st[3], token, 1, true) then
  -- Given up by its caller already (see acquire.lua): grant and queue nothing.
  return 0
end
local holder = redis.call('HGET', lease, 't')
if not holder and not st[1] then
  -- Free, nobody queued: the same common case as acquire.lua.
  return give(token, ARGV[2], ARGV[7], ARGV[3], ARGV[4], st[2], st[5], st[6], false)
end

contended()

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
    -- Handed to us (the bound was reached), or a retry whose reply was lost.
    redis.call('PEXPIRE', lease, ARGV[2])
    slow.bump_ttl(state, tonumber(ARGV[7]))
    return redis.call('HGET', lease, 'f')
  end
  -- Busy: queue (or keep our place in the queue) and wait to be woken.
  enqueue()
  return redis.call('PTTL', lease)
end

-- Free, and someone may be queued.
if st[4] and tonumber(st[4]) >= tonumber(ARGV[9]) then
  -- The head has seen enough others served: it goes first, as in acquire.lua.
  local head = slow.hand_off(token)
  redis.call('HDEL', state, 'b')
  if head and head ~= token then
    enqueue()
    return redis.call('PTTL', lease)
  end
  return give(token, ARGV[2], ARGV[7], ARGV[3], ARGV[4], st[2], st[5], st[6], true)
end
if redis.call('HEXISTS', state, token) == 0 then
  -- Not queued: a barge.
  redis.call('HINCRBY', state, 'b', 1)
else
  if redis.call('LINDEX', queue, 0) == token then
    -- The head itself, woken to look again: served, the count starts again.
    redis.call('HDEL', state, 'b')
  else
    redis.call('HINCRBY', state, 'b', 1)
  end
  redis.call('HDEL', state, token)
  redis.call('LREM', queue, 1, token)
  if redis.call('LLEN', queue) == 0 then
    redis.call('HDEL', state, 'q', 'b', 'w')
  end
end
return give(token, ARGV[2], ARGV[7], ARGV[3], ARGV[4], st[2], st[5], st[6], true)
