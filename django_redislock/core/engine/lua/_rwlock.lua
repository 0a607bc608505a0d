-- A read-write lock's own piece, after _holders.lua, in every read-write
-- lock script.
--
-- KEYS: holders (every reader, and the writer), queue (readers and writers),
-- state (see _holders.lua)
-- The state's own fields: f=the last writer's fence, x=the token of the
-- writer holding (or reserved), m:<token>=r|w per holder (its mode). A
-- writer's serial is its fence. A waiter entry is
-- w:<token>=<deadline ms>|<r|w><p|s|c|-><channel>|<owner>.
--
-- Admission: a writer is admitted when nobody holds the name, a reader when no
-- writer holds it; either only when nobody is queued ahead of it. The queue is
-- served in order: consecutive readers at its head are admitted together, a
-- writer at its head alone, and a writer that cannot be admitted yet stops
-- everyone behind it, so newcomer readers never starve a waiting writer.

-- `mode` 'r' needs no look at x.
function forget(token, mode)
  redis.call('HDEL', state, 'o:' .. token, 'a:' .. token, 'r:' .. token, 'm:' .. token,
    's:' .. token, 'e:' .. token)
  if mode ~= 'r' and redis.call('HGET', state, 'x') == token then
    redis.call('HDEL', state, 'x')
  end
end

-- Whether a `mode` ('r' or 'w') could be admitted now, queue aside.
local function compatible(mode)
  if mode == 'w' then
    return redis.call('ZCARD', holders) == 0
  end
  return redis.call('HEXISTS', state, 'x') == 0
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
  if not whole_ms(grace) then
    error(BAD_MS .. 'grace', 0) -- before it reserves anything
  end
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
    local sep = info and common().alive(info)
    local mode = sep and string.sub(info, sep + 1, sep + 1)
    if not sep then
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
      elseif common().wake(info, sep + 2, owner_at(info, sep), head) then
        redis.call('ZADD', holders, now_ms + grace, head)
        redis.call('HSET', state, 'r:' .. head, '1', 'm:' .. head, mode)
        if mode == 'w' then
          redis.call('HSET', state, 'x', head)
        end
        outlive(grace + KEEP, holders, state)
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
      local sep = string.find(info, '|', 1, true)
      common().wake(info, sep + 2, owner_at(info, sep), head)
    end
  end
  return mine, dry
end
