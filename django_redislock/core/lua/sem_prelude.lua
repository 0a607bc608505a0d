-- Shared by every semaphore script (semaphore.py prepends it).
--
-- KEYS[1] holders zset  member = token, score = expiry (server ms). A permit
--                       reserved for a woken waiter is a member too, with the
--                       short reservation expiry, so one ZCARD counts both.
-- KEYS[2] queue   list  waiting tokens, oldest first
-- KEYS[3] state   hash  n=name, l=current limit, i, h, u=the memory of
--                       losses (_losses.lua), and per token:
--                       o:<token>=owner JSON, a:<token>=acquired ms,
--                       s:<token>=serial (holders),
--                       r:<token>=1 (reservation not yet claimed),
--                       w:<token>=<deadline ms>|<p|s|->channel (waiters)
-- A token is in the queue exactly when the state hash has its w: field.
-- Every key has a TTL: each script that writes a key raises its TTL to cover
-- what it wrote (bump_ttl), so no path leaves a key without one.

local holders, queue, state = KEYS[1], KEYS[2], KEYS[3]
local clock = redis.call('TIME')
local now_ms = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

-- Raise a key's TTL to at least ms; never shortens it, never makes it eternal.
local function bump_ttl(key, ms)
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, ms)
  end
end

-- Forget everything the state hash says about one holder or reservation.
local function forget(token)
  redis.call('HDEL', state, 'o:' .. token, 'a:' .. token, 'r:' .. token, 's:' .. token)
end

-- Drop permits and reservations whose expiry has passed on the server clock:
-- a crashed holder's permit comes back here, whatever the client believed,
-- and is remembered as lost.
local function purge()
  local expired = redis.call('ZRANGEBYSCORE', holders, '-inf', now_ms)
  if #expired > 0 then
    losses().holders_lost(state, expired)
  end
  for _, token in ipairs(expired) do
    forget(token)
  end
  if #expired > 0 then
    redis.call('ZREMRANGEBYSCORE', holders, '-inf', now_ms)
  end
end

-- The limit in force: the one most recently stated by an acquirer.
local function current_limit(fallback)
  return tonumber(redis.call('HGET', state, 'l') or fallback)
end

-- Wake a waiter on its channel (message: its token). Returns whether anyone
-- may have heard: a waiter without a channel ('-') is counted as heard, it
-- looks at its next retry.
local function wake(info, token)
  local sep = string.find(info, '|', 1, true)
  local mode = string.sub(info, sep + 1, sep + 1)
  local channel = string.sub(info, sep + 2)
  if mode == 'p' then
    return redis.call('PUBLISH', channel, token) > 0
  elseif mode == 's' then
    return redis.call('SPUBLISH', channel, token) > 0
  end
  return true
end

-- A waiter's deadline has not passed (info: its w: field).
local function live(info)
  local sep = string.find(info, '|', 1, true)
  return tonumber(string.sub(info, 1, sep - 1)) > now_ms
end

-- After `count` reservations were made: wake the next `count` live waiters
-- in line, so that each runs acquire again and learns the reservations'
-- expiry as its fallback timer. Otherwise a waiter queued before them sleeps
-- until a holder's permit expires (up to its whole TTL), and a woken waiter
-- that dies before it claims would keep the permit idle all that while;
-- told, the next waiter takes it grace ms after it was reserved. `self` (the
-- caller of this script) learns it from this script's reply. Dead waiters met
-- on the way (deadline passed, nobody on their channel) leave the queue.
local function alert(count, self)
  local i = 0
  while count > 0 do
    local token = redis.call('LINDEX', queue, i)
    if not token then
      return
    end
    local info = redis.call('HGET', state, 'w:' .. token)
    if info and live(info) and (token == self or wake(info, token)) then
      i = i + 1
      count = count - 1
    else
      redis.call('LREM', queue, 1, token)
      redis.call('HDEL', state, 'w:' .. token)
    end
  end
end

-- Give free permits to the oldest live waiters: each gets a reservation for
-- grace ms (a zset member with that expiry) and is woken on its channel.
-- Waiters whose deadline passed, or whose channel nobody listens on, are
-- dropped on the way. The waiters next in line are told (alert).
-- When `self` comes up it is not reserved: the caller takes the permit in this
-- same script. Returns whether `self` came up, and how many permits are free.
local function promote(limit, grace, self)
  local free = limit - redis.call('ZCARD', holders)
  local mine = false
  local reserved = 0
  while free > 0 do
    local head = redis.call('LPOP', queue)
    if not head then
      break
    end
    local info = redis.call('HGET', state, 'w:' .. head)
    redis.call('HDEL', state, 'w:' .. head)
    if info and live(info) then
      if head == self then
        mine = true
        free = free - 1
      -- Nobody listens on its channel: its process died (or is reconnecting,
      -- and will queue again). A reservation would only keep the permit idle
      -- until it ran out: the next waiter gets it.
      elseif wake(info, head) then
        redis.call('ZADD', holders, now_ms + grace, head)
        redis.call('HSET', state, 'r:' .. head, '1')
        bump_ttl(holders, grace + 60000)
        bump_ttl(state, grace + 60000)
        free = free - 1
        reserved = reserved + 1
      end
    end
  end
  if reserved > 0 then
    alert(reserved, self)
  end
  return mine, free
end

-- Milliseconds until the state can change by itself: the earliest expiry of a
-- permit or reservation (the waiters' fallback timer, and Retry-After).
local function next_change()
  local first = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')
  if #first == 0 then
    return 1
  end
  return math.max(1, tonumber(first[2]) - now_ms)
end
