-- Release the lease if the caller still owns it: the barging order
-- (Lock(..., fair=False); see acquire.lua). The lease is freed and the
-- oldest waiter woken to look again, so the releasing process (or anyone)
-- may take it straight back; once the head of the queue has seen `limit`
-- others served, the lease is handed to it instead, as release.lua does.
-- KEYS: lease, queue, state (see _lock.lua). ARGV[1] token, ARGV[2] limit,
-- ARGV[3] its fence (optional).
-- Returns 1 when released, 0 when the caller did not own the lease.
-- Repeatable, as release.lua.
local held = redis.call('HMGET', lease, 't', 'f')
if held[1] ~= ARGV[1] then
  return contended().released_before(ARGV[3])
end
redis.call('DEL', lease)
redis.call('HSET', state, 'e', held[2])
local st = redis.call('HMGET', state, 'q', 'b', 'w')
if not st[1] then
  return 1
end
contended()
if st[2] and tonumber(st[2]) >= tonumber(ARGV[2]) then
  mark = st[1]
  local more = redis.call('HMGET', state, 'f', 'n')
  lib.hand_off(false, more[1], held[2], more[2])
  redis.call('HDEL', state, 'b', 'w')
  return 1
end

-- The state's `w`: "<token>|<round>|<ms>", the waiter woken last, the
-- attempt it was queued by, and when it was woken (server clock). While it
-- has not looked again (its queue entry still names that attempt; an acquire
-- that queues it again writes its new one) and was woken less than
-- WAKE_AGAIN ms ago, a release wakes nobody: its retry is on the way, and
-- each wake-up costs a waiter a round trip and a switch to its process. The
-- time bound covers a waiter that never retries (its process died between
-- its wake-up and its retry). Longer than a live waiter takes to look again
-- after its wake-up (BARGE_DEFER in protocol.py, then a round trip, on a
-- loaded host).
local WAKE_AGAIN = 20

-- The attempt number in a waiter entry (see _lock.lua), or nil.
local function entry_round(info)
  local s1 = string.find(info, '|', 1, true)
  local s2 = s1 and string.find(info, '|', s1 + 1, true)
  local s3 = s2 and string.find(info, '|', s2 + 1, true)
  local s4 = s3 and string.find(info, '|', s3 + 1, true)
  return s4 and string.sub(info, s3 + 1, s4 - 1)
end

-- A waiter's token and entry from its queue element: the first-come
-- order's "<token>|<since>|<entry>" (a handle of the default order queued
-- on this name), or a bare token whose entry is in the state.
local function waiter(element)
  local bar = string.find(element, '|', 1, true)
  if bar then
    return string.sub(element, 1, bar - 1),
      string.sub(element, string.find(element, '|', bar + 1, true) + 1), true
  end
  return element, redis.call('HGET', state, element), false
end

local woken = st[3]
if woken then
  local b1 = string.find(woken, '|', 1, true)
  local b2 = b1 and string.find(woken, '|', b1 + 1, true)
  if b2 and lib.now() - tonumber(string.sub(woken, b2 + 1)) < WAKE_AGAIN then
    local token = string.sub(woken, 1, b1 - 1)
    local info = redis.call('HGET', state, token)
    if not info then
      -- Queued in the first-come order: it was woken as the head.
      local head = redis.call('LINDEX', queue, 0)
      if head then
        local t, e = waiter(head)
        info = t == token and e
      end
    end
    if info and entry_round(info) == string.sub(woken, b1 + 1, b2 - 1) then
      return 1
    end
  end
end
-- Wake the oldest live waiter with "<token>" (look again; nothing handed
-- over). Waiters whose deadline passed, or whose wake-up channel nobody
-- listens on (their process died), are dropped on the way, as hand_off
-- does. A waiter queued without a channel finds the lease free at its next
-- retry.
while true do
  local element = redis.call('LINDEX', queue, 0)
  if not element then
    redis.call('HDEL', state, 'q', 'b', 'w')
    return 1
  end
  local head, info, inline = waiter(element)
  if info then
    local s1 = lib.alive(info)
    if s1 then
      if string.sub(info, s1 + 1, s1 + 1) == '-' then
        return 1
      end
      if lib.wake(info, s1 + 1, string.find(info, '|', s1 + 1, true), head) then
        redis.call('HSET', state, 'w', head .. '|' .. (entry_round(info) or '') .. '|' .. lib.now())
        return 1
      end
    end
    if not inline then
      redis.call('HDEL', state, head)
    end
  end
  redis.call('LPOP', queue)
end
