-- Shared by every lock script (scripts.py prepends it).
--
-- KEYS[1] lease  hash  t=token f=fence n=name o=owner a=acquired ms x=ttl ms
-- KEYS[2] queue  list  waiting tokens, oldest first
-- KEYS[3] state  hash  f=last fence, r=reserved token, u=reservation end ms,
--                      q=set while the queue may be non-empty,
--                      <token>=<deadline ms>|<p|s|->channel for each waiter
-- A token is in the queue exactly when the state hash has a field for it.
-- The uncontended paths read `q` instead of touching the queue, and the
-- server clock only when they need it: every redis.call costs microseconds.

local lease, queue, state = KEYS[1], KEYS[2], KEYS[3]
local clock, now_ms

local function read_clock()
  if not clock then
    clock = redis.call('TIME')
    now_ms = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
  end
  return now_ms
end

-- Raise a key's TTL to at least ms; never shortens it, never makes it eternal.
local function bump_ttl(key, ms)
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, ms)
  end
end

-- Hand the free lock's next turn to the oldest live waiter: pop it, reserve the
-- lock for it for grace ms, and wake it. Waiters whose deadline passed, or
-- whose wake-up channel nobody listens on, are dropped on the way. Returns
-- the reserved token, or false for an empty queue.
-- When the oldest live waiter is `self`, it is popped and returned unreserved:
-- the caller is already here and takes the lease in this same script.
local function promote(grace, self)
  read_clock()
  while true do
    local head = redis.call('LPOP', queue)
    if not head then
      redis.call('HDEL', state, 'r', 'u', 'q')
      return false
    end
    local info = redis.call('HGET', state, head)
    redis.call('HDEL', state, head)
    if info then
      local sep = string.find(info, '|', 1, true)
      if tonumber(string.sub(info, 1, sep - 1)) > now_ms then
        if head == self then
          redis.call('HDEL', state, 'r', 'u')
          return head
        end
        local mode = string.sub(info, sep + 1, sep + 1)
        local channel = string.sub(info, sep + 2)
        local heard = 1
        if mode == 'p' then
          heard = redis.call('PUBLISH', channel, head)
        elseif mode == 's' then
          heard = redis.call('SPUBLISH', channel, head)
        end
        -- Nobody listens on its channel: its process died (or is reconnecting,
        -- and will queue again when it is back). Reserving the turn would
        -- leave the lock idle until the next waiter's fallback timer.
        if heard > 0 then
          redis.call('HSET', state, 'r', head, 'u', now_ms + grace)
          bump_ttl(state, grace + 60000)
          return head
        end
      end
    end
  end
end
