-- Shared by every read-write lock script (rwlock.py prepends it).
--
-- KEYS[1] holders zset  member = token, score = expiry (server ms): every
--                       reader, and the writer, of the name. A turn reserved
--                       for a woken waiter is a member too, with the short
--                       reservation expiry, so it keeps newcomers out.
-- KEYS[2] queue   list  waiting tokens, oldest first, readers and writers
-- KEYS[3] state   hash  n=name, f=last writer fence, x=token of the writer
--                       holding (or reserved), i, h, u=the memory of losses
--                       (_losses.lua; a writer's serial is its fence), and
--                       per token:
--                       m:<token>=r|w (holders), o:<token>=owner JSON,
--                       a:<token>=acquired ms, s:<token>=serial,
--                       r:<token>=1 (reservation not yet claimed),
--                       w:<token>=<deadline ms>|<r|w><p|s|->channel (waiters)
-- A token is in the queue exactly when the state hash has its w: field.
-- Every key has a TTL: each script that writes a key raises its TTL to cover
-- what it wrote (bump_ttl), so no path leaves a key without one.
--
-- Admission: a writer is admitted when nobody holds the name, a reader when no
-- writer holds it; either only when nobody is queued ahead of it. The queue is
-- served in order: consecutive readers at its head are admitted together, a
-- writer at its head alone, and a writer that cannot be admitted yet stops
-- everyone behind it, so newcomer readers never starve a waiting writer.

local holders, queue, state = KEYS[1], KEYS[2], KEYS[3]
local clock = redis.call('TIME')
local now_ms = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

-- Raise a key's TTL to at least ms; never shortens it, never makes it eternal.
local function bump_ttl(key, ms)
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, ms)
  end
end

-- Forget everything the state hash says about one holder or reservation;
-- `mode`: its m: field when the caller read it ('r' needs no look at x).
local function forget(token, mode)
  redis.call('HDEL', state, 'o:' .. token, 'a:' .. token, 'r:' .. token, 'm:' .. token,
    's:' .. token)
  if mode ~= 'r' and redis.call('HGET', state, 'x') == token then
    redis.call('HDEL', state, 'x')
  end
end

-- Drop holders and reservations whose expiry has passed on the server clock:
-- a crashed reader's or writer's turn comes back here, whatever it believed,
-- and is remembered as lost.
local function purge()
  local expired = redis.call('ZRANGEBYSCORE', holders, '-inf', now_ms)
  if #expired > 0 then
    losses().holders_lost(state, expired)
  end
  for _, token in ipairs(expired) do
    forget(token, nil)
  end
  if #expired > 0 then
    redis.call('ZREMRANGEBYSCORE', holders, '-inf', now_ms)
  end
end

-- Whether a `mode` ('r' or 'w') could be admitted now, queue aside.
local function compatible(mode)
  if mode == 'w' then
    return redis.call('ZCARD', holders) == 0
  end
  return redis.call('HEXISTS', state, 'x') == 0
end

-- A waiter's w: field: deadline, mode, channel mode, channel.
local function parse(info)
  local sep = string.find(info, '|', 1, true)
  return tonumber(string.sub(info, 1, sep - 1)), string.sub(info, sep + 1, sep + 1),
    string.sub(info, sep + 2, sep + 2), string.sub(info, sep + 3)
end

-- Wake a waiter on its channel (message: its token, "look again"). Returns
-- whether anyone may have heard: a waiter without a channel ('-') is counted
-- as heard, it looks at its next retry.
local function wake(chmode, channel, token)
  if chmode == 'p' then
    return redis.call('PUBLISH', channel, token) > 0
  elseif chmode == 's' then
    return redis.call('SPUBLISH', channel, token) > 0
  end
  return true
end

-- Admit `token` in `mode` for ttl ms (its w: and r: fields are gone by now).
-- Every holder gets a serial (_losses.lua); a writer's is its fence, so
-- fences are the server's microsecond clock, floored above the last serial,
-- as the lock's are. Returns the acquire script's reply: {1, the writer's
-- own fence or, for a reader, the last writer's ('0': none known), serial}.
local function grant(token, mode, ttl, keep, owner, name)
  redis.call('ZADD', holders, now_ms + ttl, token)
  local st = redis.call('HMGET', state, 'f', 'i', 'h')
  -- A state from before serials has a last fence and no i.
  local serial = issue(clock, st[2] or st[1])
  local fence = st[1] or '0'
  local fields = { 'n', name, 'o:' .. token, owner, 'a:' .. token, now_ms, 'm:' .. token, mode,
    's:' .. token, serial, 'i', serial }
  if mode == 'w' then
    fence = serial
    fields[13], fields[14], fields[15], fields[16] = 'x', token, 'f', serial
  end
  if not st[3] then
    -- A new state: it answers for the serials it issues from here on.
    fields[#fields + 1] = 'h'
    fields[#fields + 1] = serial
  end
  redis.call('HSET', state, unpack(fields))
  bump_ttl(holders, ttl + keep)
  bump_ttl(state, ttl + keep)
  return {1, fence, serial}
end

-- Serve the queue from its head while its head can be admitted: readers
-- together, a writer alone. Each admitted waiter gets a reservation for grace
-- ms (a zset member with that expiry) and is woken on its channel; `self`
-- (the caller of this very script) is admitted by grant_self instead.
-- Waiters whose deadline passed, or whose channel nobody listens on, are
-- dropped on the way. If turns were reserved and someone still waits, the new
-- head is told, so that it learns the reservations' expiry as its timer.
-- Returns whether `self` was admitted, and whether the queue ran dry.
local function promote(grace, self, grant_self)
  local mine = false
  local reserved = 0
  local dry = false
  while true do
    local head = redis.call('LINDEX', queue, 0)
    if not head then
      dry = true
      break
    end
    local info = redis.call('HGET', state, 'w:' .. head)
    local deadline, mode, chmode, channel
    if info then
      deadline, mode, chmode, channel = parse(info)
    end
    if not info or deadline <= now_ms then
      redis.call('LPOP', queue)
      redis.call('HDEL', state, 'w:' .. head)
    elseif not compatible(mode) then
      break
    else
      redis.call('LPOP', queue)
      redis.call('HDEL', state, 'w:' .. head)
      local admitted = true
      if head == self then
        grant_self()
        mine = true
      elseif wake(chmode, channel, head) then
        redis.call('ZADD', holders, now_ms + grace, head)
        redis.call('HSET', state, 'r:' .. head, '1', 'm:' .. head, mode)
        if mode == 'w' then
          redis.call('HSET', state, 'x', head)
        end
        bump_ttl(holders, grace + 60000)
        bump_ttl(state, grace + 60000)
        reserved = reserved + 1
      else
        -- Nobody listens on its channel: its process died (or is
        -- reconnecting, and will queue again). The next waiter goes.
        admitted = false
      end
      if admitted and mode == 'w' then
        break
      end
    end
  end
  if reserved > 0 and not dry then
    -- Tell the new head, if it still waits: a reservation that is never
    -- claimed (its waiter died) ends its wait grace ms from now.
    local head = redis.call('LINDEX', queue, 0)
    local info = head and head ~= self and redis.call('HGET', state, 'w:' .. head)
    if info then
      local _, _, chmode, channel = parse(info)
      wake(chmode, channel, head)
    end
  end
  return mine, dry
end

-- Milliseconds until the state can change by itself: the earliest expiry of a
-- holder or reservation (the waiters' fallback timer, and Retry-After).
local function next_change()
  local first = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')
  if #first == 0 then
    return 1
  end
  return math.max(1, tonumber(first[2]) - now_ms)
end
