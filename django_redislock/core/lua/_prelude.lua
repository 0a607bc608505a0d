-- Shared by every lock script (scripts.py prepends it).
--
-- KEYS[1] lease  hash  t=token f=fence o=owner, and n=name when the key
--                cannot hold it readably (long names); the fence is the
--                server's microsecond clock when it was granted
-- KEYS[2] queue  list  waiting tokens, oldest first
-- KEYS[3] state  hash  f=last fence, q=set while the queue may be non-empty,
--                      n=lock name,
--                      e=the fence of the last lease that ended without a
--                        loss (released, or given back unused),
--                      h, u=the memory of losses (_losses.lua): a lease's
--                        fence is its serial, and a lease ended in a loss
--                        when it ended without `e` naming it (it ran out,
--                        or was force-released); the next grant records it
--                      d=the last RECENT tokens given back, newest first,
--                        space-separated (tokens are 16 hex digits, so a
--                        match cannot straddle a separator)
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
-- How many given-back tokens `d` remembers: an acquire that arrives after
-- its caller gave it back (a reply that never came, then a give-back that
-- ran first) grants nothing. It comes within moments of the give-back, in
-- which a name sees few others; more entries would push the state out of
-- Redis's compact encoding (values up to 64 bytes) and make every lock
-- script dearer. (A retried release is answered by the memory of losses.)
local RECENT = 3
local clock, now_ms
local slow   -- the contended paths' helpers, once contended() made them

-- `d` keeps at most this much of its former value when a token is added.
local RECENT_KEPT = (RECENT - 1) * 17 - 1

-- Write a lease for `token` and return its fence, as text: its serial
-- (_losses.lua), the server clock in microseconds above the last fence
-- issued (`last`). `ended` is the state's `e`: when it does not name `last`,
-- that lease ended in a loss and is recorded as one; `horizon` is its `h`
-- (false in a state that has none yet: it starts here). `ttl` is text;
-- `state_ttl` (the state's TTL) is text, or a number when `waiters`; `name`
-- is '' when the key holds it. `waiters`: whether anyone may be queued (then
-- the state's TTL may only grow, it covers their deadlines).
local function give(token, ttl, state_ttl, name, owner, last, ended, horizon, waiters)
  clock = clock or redis.call('TIME')
  if issued then
    -- This run gave a lease already and took it back (a waiter nobody
    -- heard): that one is the last, and it ended without a loss.
    last, ended, horizon = issued, issued, horizon or issued
  end
  local f = issue(clock, last)
  if name == '' then
    redis.call('HSET', lease, 't', token, 'f', f, 'o', owner)
  else
    redis.call('HSET', lease, 't', token, 'f', f, 'o', owner, 'n', name)
  end
  redis.call('PEXPIRE', lease, ttl)
  if not last or not horizon then
    -- A new state (or one from before the memory of losses): it answers for
    -- the fences it issues from here on.
    redis.call('HSET', state, 'f', f, 'h', f)
  elseif ended == last then
    redis.call('HSET', state, 'f', f)
  else
    local u, h = losses().record(redis.call('HGET', state, 'u'), horizon, last)
    if u then
      redis.call('HSET', state, 'f', f, 'h', h, 'u', u)
    else
      redis.call('HSET', state, 'f', f)
    end
  end
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

  -- A release of `fence` (text from the client; '' or nil when it did not
  -- say) that found the lease not its own: 1 if that lease was released all
  -- the same (this is a retry, and the first run released it), else 0.
  function slow.released_before(fence)
    if not fence or fence == '' then
      return 0
    end
    local st = redis.call('HMGET', state, 'f', 'e', 'h', 'u')
    if fence == st[1] then
      -- The last lease issued, and gone: released only if `e` says so (it
      -- may have run out since, unrecorded until the next grant).
      return st[2] == fence and 1 or 0
    end
    return losses().released(fence, st[1], st[3], st[4]) and 1 or 0
  end

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
          local st = redis.call('HMGET', state, 'f', 'n', 'e', 'h')
          local fence = give(head, ttl, tonumber(ttl) + KEEP, st[2] or '', owner, st[1], st[3],
            st[4], true)
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
          -- Nobody heard: its process died. Take the lease back (nobody
          -- will release it: no loss to remember), try the next.
          redis.call('DEL', lease)
          redis.call('HSET', state, 'e', fence)
        end
      end
    end
  end

  return slow
end
