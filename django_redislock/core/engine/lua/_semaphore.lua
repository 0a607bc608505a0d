-- A semaphore's own piece, after _holders.lua, in every semaphore script.
--
-- KEYS: holders (one member per permit), queue, state (see _holders.lua)
-- The state's own fields: l=the current limit (the one most recently stated
-- by an acquirer). A waiter entry is
-- w:<token>=<deadline ms>|<p|s|c|-><channel>|<owner>.

function forget(token)
  redis.call('HDEL', state, 'o:' .. token, 'a:' .. token, 'r:' .. token, 's:' .. token,
    'e:' .. token)
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
    local sep = info and common().alive(info)
    if sep and (token == self or common().wake(info, sep + 1, owner_at(info, sep), token)) then
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
-- dropped on the way. The waiters next in line are told (alert). `limit`:
-- the acquirer's; nil for the current one (the state's, or else the
-- caller's: ARGV[3] of release and cancel; none for clear).
-- When `self` comes up it is not reserved: the caller takes the permit in this
-- same script. Returns whether `self` came up, and how many permits are free
-- (when there is a `self`).
local function promote(grace, self, limit)
  if not self and redis.call('EXISTS', queue) == 0 then
    -- Nobody waits (the common case of a release): no need to count.
    return false, 0
  end
  if not whole_ms(grace) then
    error(BAD_MS .. 'grace', 0) -- before it reserves anything
  end
  limit = limit or tonumber(redis.call('HGET', state, 'l') or ARGV[3] or '0')
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
    local sep = info and common().alive(info)
    if sep then
      if head == self then
        mine = true
        free = free - 1
      -- Nobody listens on its channel: its process died (or is reconnecting,
      -- and will queue again). A reservation would only keep the permit idle
      -- until it ran out: the next waiter gets it.
      elseif common().wake(info, sep + 1, owner_at(info, sep), head) then
        redis.call('ZADD', holders, now_ms + grace, head)
        redis.call('HSET', state, 'r:' .. head, '1')
        outlive(grace + KEEP, holders, state)
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
