-- Shared by every lock script (scripts.py prepends it).
--
-- KEYS[1] lease  hash  t=token f=fence o=owner, and n=name when the key
--                cannot hold it readably (long names); the fence is the
--                server's microsecond clock when it was granted
-- KEYS[2] queue  list  waiting tokens, oldest first
-- KEYS[3] state  hash  f=last fence, q=set while the queue may be non-empty,
--                      n=lock name,
--                      d=the last RECENT tokens released or given back,
--                        newest first, space-separated (tokens are 16 hex
--                        digits, so a match cannot straddle a separator)
--                      <token>=<deadline ms>|<p|s|-><channel>|<ttl ms>|<round>|<owner>
--                      for each waiter
-- A token is in the queue exactly when the state hash has a field for it.
-- The state's TTL is never shorter than the lease's: every path that sets the
-- lease's TTL raises the state's to at least the same plus KEEP, so a lease
-- never outlives its state and no write to the state finds it gone.
--
-- Every run of a script pays for what it does, and the uncontended paths are
-- kept to the least: they read `q` instead of touching the queue, read the
-- server clock only when they need it, keep numbers as text (Lua converts
-- between numbers and strings with printf and strtod, dearer than a
-- redis.call), and make no closure they do not call: the contended paths'
-- helpers are made on first use, by contended().

local lease, queue, state = KEYS[1], KEYS[2], KEYS[3]
-- How long the state (last fence) outlives a lease: STATE_KEEP_MS in
-- protocol.py, written in by scripts.load.
local KEEP = @STATE_KEEP_MS@
-- How many released or given-back tokens `d` remembers: a release retried
-- after its reply was lost reports success while its token is among them,
-- and an acquire that arrives after its caller gave it back grants nothing.
-- Both come within moments of the first call, in which a name sees few
-- handoffs; more entries would push the state out of Redis's compact
-- encoding (values up to 64 bytes) and make every lock script dearer.
local RECENT = 3
local clock, now_ms
local issued -- the last fence this run issued: the clock is read only once
local slow   -- the contended paths' helpers, once contended() made them

-- `d` keeps at most this much of its former value when a token is added.
local RECENT_KEPT = (RECENT - 1) * 17 - 1

-- Write a lease for `token` and return its fence, as text. Fences follow the
-- server clock in microseconds and exceed the last one issued (`last`), so
-- they keep increasing after the state expires or Redis restarts empty, as
-- long as the server clock does not step back. `ttl` is text; `state_ttl`
-- (the state's TTL) is text, or a number when `waiters`; `name` is '' when
-- the key holds it. `waiters`: whether anyone may be queued (then the state's
-- TTL may only grow, it covers their deadlines).
local function give(token, ttl, state_ttl, name, owner, last, waiters)
  clock = clock or redis.call('TIME')
  local us = clock[2]
  us = string.rep('0', 6 - #us) .. us
  -- Decimal integers without leading zeros: longer is larger, else compare text.
  local f = clock[1] .. us
  if issued and (not last or #issued > #last or (#issued == #last and issued > last)) then
    last = issued
  end
  if last and not (#f > #last or (#f == #last and f > last)) then
    f = string.format('%.0f', tonumber(last) + 1)
  end
  issued = f
  if name == '' then
    redis.call('HSET', lease, 't', token, 'f', f, 'o', owner)
  else
    redis.call('HSET', lease, 't', token, 'f', f, 'o', owner, 'n', name)
  end
  redis.call('PEXPIRE', lease, ttl)
  redis.call('HSET', state, 'f', f)
  if waiters then
    -- Only reached through contended(), which made `slow`.
    slow.bump_ttl(state, tonumber(state_ttl))
  else
    redis.call('PEXPIRE', state, state_ttl)
  end
  return f
end

local function contended()
  if slow then
    return slow
  end
  slow = {}

  -- The server clock in milliseconds, as a number (deadlines).
  function slow.read_clock()
    if not now_ms then
      clock = clock or redis.call('TIME')
      now_ms = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
    end
    return now_ms
  end

  -- Raise a key's TTL to at least ms; never shortens it, never makes it eternal.
  function slow.bump_ttl(key, ms)
    if redis.call('PTTL', key) < ms then
      redis.call('PEXPIRE', key, ms)
    end
  end

  -- The lock is free and someone may be queued: hand the lease straight to
  -- the oldest live waiter and wake it with "<token>:<fence>:<round>", so it holds the
  -- lock the moment it wakes, with no second round trip. The message also
  -- names the acquire attempt (round) that queued the waiter: a lease handed
  -- in answer to an older attempt is never taken as it is. Waiters whose
  -- deadline passed, or whose wake-up channel nobody listens on (their
  -- process died), are dropped on the way. Returns the new holder's token, or
  -- false when nobody was left. When the oldest live waiter is `self` (the
  -- caller of this very script), it is popped and returned without a lease:
  -- the caller takes it itself.
  function slow.hand_off(self)
    local now = slow.read_clock()
    while true do
      local head = redis.call('LPOP', queue)
      if not head then
        redis.call('HDEL', state, 'q')
        return false
      end
      local info = redis.call('HGET', state, head)
      redis.call('HDEL', state, head)
      if info then
        local s1 = string.find(info, '|', 1, true)
        local s2 = string.find(info, '|', s1 + 1, true)
        local s3 = string.find(info, '|', s2 + 1, true)
        local s4 = string.find(info, '|', s3 + 1, true)
        if tonumber(string.sub(info, 1, s1 - 1)) > now then
          if head == self then
            return head
          end
          local mode = string.sub(info, s1 + 1, s1 + 1)
          local channel = string.sub(info, s1 + 2, s2 - 1)
          local ttl = string.sub(info, s2 + 1, s3 - 1)
          -- An entry written before attempts were numbered has the owner
          -- (JSON, never digits) where the round is: it is woken as before,
          -- with no round, and looks again.
          local round = s4 and string.sub(info, s3 + 1, s4 - 1)
          local owner
          if round and string.find(round, '^%d+$') then
            owner = string.sub(info, s4 + 1)
          else
            round = nil
            owner = string.sub(info, s3 + 1)
          end
          local st = redis.call('HMGET', state, 'f', 'n')
          local fence = give(head, ttl, tonumber(ttl) + KEEP, st[2] or '', owner, st[1], true)
          local message = head .. ':' .. fence
          if round then
            message = message .. ':' .. round
          end
          local heard = 1
          if mode == 'p' then
            heard = redis.call('PUBLISH', channel, message)
          elseif mode == 's' then
            heard = redis.call('SPUBLISH', channel, message)
          end
          if heard > 0 or mode == '-' then
            -- A waiter without a channel finds its lease at its next retry.
            return head
          end
          -- Nobody heard: its process died. Take the lease back, try the next.
          redis.call('DEL', lease)
        end
      end
    end
  end

  return slow
end
