-- Take the lease, or join the queue of waiters, in either order: first come,
-- first served, or barging (Lock(..., fair=False)), where a free lease goes
-- to whoever asks, even with waiters queued, until the head of the queue has
-- seen `limit` others served (the state's `b`); then it goes to the head, as
-- in the first order. One script for both: they differ only there.
-- KEYS: lease, queue, state (see _lock.lua)
-- ARGV[1] token      random, unique to this acquisition
-- ARGV[2] ttl        lease length, ms
-- ARGV[3] name       lock name, kept for operators; '' when the key shows it
-- ARGV[4] owner      owner metadata (JSON), kept for operators
-- ARGV[5] wait       ms the caller will wait; 0 = try once, never queue
-- ARGV[6] channel    <p|s|c|-> followed by the caller's wake-up channel
-- ARGV[7] state ttl  ttl + STATE_KEEP_MS (KEEP): what the state's TTL is set
--                    to when the lease is granted. The caller adds them: in
--                    Lua the sum would cost two number conversions on the
--                    uncontended path (about what a redis.call costs)
-- ARGV[8] round      the caller's attempt number, named when the lease is
--                    handed to it (see hand_off in _lock.lua)
-- ARGV[9] limit      the barging order only: barges allowed while the head
--                    of the queue waits; absent in the first-come order
-- Numbers arrive as text and stay text where they can (see the prelude).
-- Returns the fence, as text, when acquired; when busy, the ms until the
-- state can change by itself (the holder's lease end) as an integer: the
-- waiter's fallback timer. An error (BAD_MS, in the prelude) for a ttl, state
-- ttl or wait that is not a duration, before anything is written.

if not (string.find(ARGV[2], MS) and string.find(ARGV[7], MS)) then
  return redis.error_reply(BAD_MS .. 'ttl, state ttl')
end
local token, limit = ARGV[1], ARGV[9]
-- q f d e h and, barging, the caller's own waiter entry (whether it is
-- queued) and b.
local st
if limit then
  st = redis.call('HMGET', state, 'q', 'f', 'd', 'e', 'h', token, 'b')
else
  st = redis.call('HMGET', state, 'q', 'f', 'd', 'e', 'h')
end
if st[3] and string.find(st[3], token, 1, true) then
  -- Its caller gave this acquisition up already (a reply that never came,
  -- then a give-back that ran first): grant and queue nothing.
  return 0
end
mark = st[1]
-- The holder's token and, when someone is queued, the lease's end as
-- granted: the waiter's fallback timer, below (see _lock.lua); both from
-- the state's copy of the lease when it has one, after the helpers. Nobody
-- queued: the lease's token alone, and none read when the state says the
-- lease is free: no lease was ever granted (a lease has a state, with `f`:
-- it outlives every lease), or the last one granted ended without a loss
-- (`e` names it).
local held
if not st[1] and st[2] and st[2] ~= st[4] then
  held = { redis.call('HGET', lease, 't') }
end
local lost -- the fence of a lease that ended in a loss, for the grant to record
if not st[1] and not (held and held[1]) then
  -- Free, nobody queued: the common case. The lease, then the state's fence
  -- (with the horizon of the memory of losses when the state has none yet),
  -- each with its TTL set outright: `q` is unset, so no mark says more.
  clock = redis.call('TIME')
  local f = serial(clock, st[2])
  issued = f
  if ARGV[3] == '' then
    redis.call('HSET', lease, 't', token, 'f', f, 'o', ARGV[4])
  else
    redis.call('HSET', lease, 't', token, 'f', f, 'o', ARGV[4], 'n', ARGV[3])
  end
  redis.call('PEXPIRE', lease, ARGV[2])
  if not st[2] or not st[5] then
    -- A new state (or one from before the memory of losses): it answers for
    -- the fences it issues from here on.
    redis.call('HSET', state, 'f', f, 'h', f)
  else
    redis.call('HSET', state, 'f', f)
  end
  redis.call('PEXPIRE', state, ARGV[7])
  if not held or not st[5] then
    return f
  end
  -- The lease before ran out or was force-released (`e` does not name it).
  lost = st[2]
end
if st[1] then
  -- Someone is queued. A lease granted with waiters queued left its copy in
  -- the state's `e`, <token>|<end>|<fence> (give() in _lock.lua): while its
  -- fence is the state's `f` (the last lease issued, which has not ended
  -- without a loss, or `e` would name it), its end has not passed and its
  -- holder is another, that holder holds it, and the caller queues behind
  -- it without reading the lease. (A force-release either hands the lease
  -- on, writing `f`, or finds nobody queued and clears `q`; an extend that
  -- shortened the lease may have let it end sooner: then this waiter,
  -- queued behind the others, looks again at the copy's end, as they look
  -- at the end they read.) Otherwise the lease is read, after the helpers:
  -- its holder may be the caller, or nobody.
  local copy = st[4]
  local b1 = copy and string.find(copy, '|', 1, true)
  if b1 then
    local b2 = string.find(copy, '|', b1 + 1, true)
    local by = string.sub(copy, 1, b1 - 1)
    if string.sub(copy, b2 + 1) == st[2] and by ~= token then
      local ends = string.sub(copy, b1 + 1, b2 - 1)
      -- The server clock in ms, as common().now() reads it.
      clock = redis.call('TIME')
      local us = clock[2] + 0
      now_ms = clock[1] * 1000 + (us - us % 1000) / 1000
      ends = ends + 0
      if ends > now_ms then
        held = { by, ends }
      end
    end
  end
  -- The first-come order's waiter on its first attempt, behind that holder,
  -- the state's mark covering its wait already: the contended common case.
  -- It queues here, as enqueue() below would, and makes none of the helpers.
  -- Anything else (a later attempt, which may be queued already; a wait the
  -- mark does not cover; not waiting; a bad wait) is enqueue()'s.
  if held and not limit and ARGV[8] == '1' and string.find(ARGV[5], MS) then
    local wait, covered = ARGV[5] + 0, tonumber(mark)
    if wait > 0 and covered and covered >= now_ms + wait + KEEP then
      -- Numbers as text by '%d' (see give() in _lock.lua).
      local entry = string.format('%d|', now_ms + wait) .. ARGV[6] .. '|' .. ARGV[2] .. '|1|'
        .. ARGV[4]
      if redis.call('RPUSH', queue, token .. string.format('|%d|', now_ms) .. entry) == 1 then
        -- A queue made anew has no TTL; the mark covers this waiter already.
        redis.call('PEXPIREAT', queue, mark)
      end
      return held[2] - now_ms
    end
  end
end
-- @HELPERS@
if lost then
  -- Recorded as a loss in the memory of losses (the prelude), now that the
  -- grant above wrote its own fence.
  local u, h = common().losses().record(redis.call('HGET', state, 'u'), st[5], lost)
  if u then
    redis.call('HSET', state, 'h', h, 'u', u)
  end
  return issued
end
contended()

if st[1] and not held then
  -- Someone is queued, and the state's copy of the lease (above) did not
  -- name its holder.
  held = redis.call('HMGET', lease, 't', 'x')
end
local holder = held[1]

local function enqueue()
  if not string.find(ARGV[5], MS) then
    return redis.error_reply(BAD_MS .. 'wait')
  end
  local wait = tonumber(ARGV[5])
  if wait > 0 then
    local now = lib.now()
    local entry = (now + wait) .. '|' .. ARGV[6] .. '|' .. ARGV[2] .. '|' .. ARGV[8] .. '|'
      .. ARGV[4]
    local made
    -- `q` unset: nobody is queued, nor is the caller. It queues, has both
    -- TTLs raised (cover()) and then writes `q`, the mark they were raised
    -- to, with `n` (and, barging, its entry): the mark never claims more
    -- than Redis holds.
    local fresh = not mark
    if limit then
      -- The barging order: the queue holds the token, the state its entry.
      -- The caller joins the queue when its entry is new: HSET counts the
      -- fields it made. With `q` set, `n` is (they are written together),
      -- and `q` still is (a hand_off before this kept it: it handed the
      -- lease on).
      local new = fresh or redis.call('HSET', state, token, entry) == 1
      made = new and redis.call('RPUSH', queue, token) == 1
    else
      -- The first-come order: the queue's element is the whole entry (see
      -- _lock.lua). A first attempt cannot be queued yet (a token is new
      -- with each acquisition); a later one (its wake-up missed, its
      -- channel come up) may be: it keeps its place and when it began to
      -- wait, with its entry brought up to date.
      local at, since
      if ARGV[8] ~= '1' and not fresh then
        local prefix = token .. '|'
        for i, element in ipairs(redis.call('LRANGE', queue, 0, -1)) do
          if string.sub(element, 1, #prefix) == prefix then
            at = i - 1
            since = string.sub(element, #prefix + 1, string.find(element, '|', #prefix + 1, true) - 1)
            break
          end
        end
      end
      if at then
        redis.call('LSET', queue, at, token .. '|' .. since .. '|' .. entry)
      else
        made = redis.call('RPUSH', queue, token .. '|' .. now .. '|' .. entry) == 1
      end
    end
    if fresh then
      mark = lib.cover(now_ms + wait + KEEP, made)
      if limit then
        redis.call('HSET', state, token, entry, 'q', mark, 'n', ARGV[3])
      else
        redis.call('HSET', state, 'q', mark, 'n', ARGV[3])
      end
    elseif not lib.cover(now_ms + wait + KEEP, made) and made then
      -- A queue made anew has no TTL; the mark covers this waiter already.
      redis.call('PEXPIREAT', queue, mark)
    end
  end
  if holder and held[2] and now_ms then
    -- The lease's end as granted (the PEXPIREAT of give()): unless it was
    -- extended since, when it has passed and PTTL says. (A caller that
    -- will not wait has read the clock only when the state's copy told the
    -- holder.)
    local left = tonumber(held[2]) - now_ms
    if left > 0 then
      return left
    end
  end
  return redis.call('PTTL', lease)
end

if holder then
  if holder == token then
    -- Handed to us while we slept (and we missed the wake-up, or it named an
    -- older attempt), or a retry of an acquire whose reply was lost: it is
    -- ours. Its validity starts now; the state must outlive it as always.
    redis.call('PEXPIRE', lease, ARGV[2])
    outlive(tonumber(ARGV[7]), state)
    return redis.call('HGET', lease, 'f')
  end
  -- Busy: queue (or keep our place in the queue) and wait.
  return enqueue()
end

-- Free, and someone may be queued.
local more
if limit and not (st[7] and tonumber(st[7]) >= tonumber(limit)) then
  -- Barging, and the head has not yet seen `limit` others served: whoever
  -- asks takes it.
  if not st[6] then
    -- Not queued (its entry, read above): a barge, counted in the state with
    -- the grant.
    more = { 'b', (tonumber(st[7]) or 0) + 1 }
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
      mark = false
    end
  end
else
  -- The oldest live waiter goes first (in the barging order: the head has
  -- seen enough others served, and its count starts again).
  local head = lib.hand_off(token, st[2], st[4], ARGV[3], st[5])
  if limit then
    redis.call('HDEL', state, 'b')
  end
  if head and head ~= token then
    -- An earlier waiter holds it now; queue behind it (`held` is not its).
    holder = false
    return enqueue()
  end
end
return give(token, ARGV[2], ARGV[7], ARGV[3], ARGV[4], st[2], st[4], st[5], more)
