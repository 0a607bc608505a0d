-- What semaphores and read-write locks share, after _prelude.lua and before
-- their own piece (_semaphore.lua, _rwlock.lua). Both keep many holders the
-- same way; the refresh script needs nothing more, so one script serves both.
--
-- KEYS[1] holders zset  member = token, score = expiry (server ms): every
--                       holder of the name. A permit or turn reserved for a
--                       woken waiter is a member too, with the short
--                       reservation expiry, so one ZCARD counts both and a
--                       reservation keeps newcomers out.
-- KEYS[2] queue   list  (see the prelude)
-- KEYS[3] state   hash  n=name, i=the last serial issued, h, u, g=the memory
--                       of losses (the prelude), the kind's own fields, and per
--                       token:
--                       o:<token>=owner JSON, a:<token>=acquired ms,
--                       s:<token>=serial (holders),
--                       r:<token>=1 (reservation not yet claimed),
--                       w:<token>=<deadline ms>|<the kind's part>|<owner>
--                       (waiters; the owner JSON, as ARGV[4] of acquire, is
--                       for operators, and ends the entry: it may hold '|')

local holders = KEYS[1]
-- Every script of these kinds reads the clock (expiries are server ms): read
-- here, as now() in the prelude would, without making lib for it.
clock = redis.call('TIME')
local us = clock[2] + 0
now_ms = clock[1] * 1000 + (us - us % 1000) / 1000

-- Whether `n`, a duration the client sent (ms, converted), may go into an
-- expiry: a whole number of at most 12 digits (MS, the prelude).
local function whole_ms(n)
  return n and n >= 0 and n < 1e12 and n % 1 == 0
end

-- forget(token, mode): drop what the state says of one holder or
-- reservation (`mode`: its m: field when the caller read it). The kind's
-- piece makes it.
local forget

-- Drop the holders and reservations whose expiry has passed on the server
-- clock (every one, when `all`: a force-release), and remember the holders
-- lost: a crashed holder's permit or turn comes back here, whatever the
-- client believed. Returns how many were dropped.
local function purge(all)
  local upto = all and '+inf' or now_ms
  local gone = redis.call('ZRANGEBYSCORE', holders, '-inf', upto)
  if #gone > 0 then
    common().losses().holders_lost(gone)
    for _, token in ipairs(gone) do
      forget(token, nil)
    end
    redis.call('ZREMRANGEBYSCORE', holders, '-inf', upto)
  end
  return #gone
end

-- A holder with `serial` was released; `h`: the state's horizon as read
-- before this script's purge, `purged`: what that purge dropped. Below the
-- horizon (more losses after its grant than the memory holds, while it held
-- or in this very purge), the memory of losses must remember the release
-- (the prelude). A purge that dropped holders may have raised h: read again.
local function released(serial, h, purged)
  if purged > 0 then
    h = redis.call('HGET', state, 'h')
  end
  if serial and h and (#h > #serial or (#h == #serial and h > serial)) then
    common().losses().released_below(serial, h)
  end
end

-- `token` holds for ttl ms from now, with `serial` (issue()); `fields`: the
-- kind's own state fields to write with it (field, value, ...), which this
-- extends. `horizon`: the state's h, false in a new state (it answers for
-- the serials it issues from here on).
local function hold(token, ttl, owner, serial, horizon, fields)
  redis.call('ZADD', holders, now_ms + ttl, token)
  local n = #fields
  fields[n + 1], fields[n + 2] = 'o:' .. token, owner
  fields[n + 3], fields[n + 4] = 'a:' .. token, now_ms
  fields[n + 5], fields[n + 6] = 's:' .. token, serial
  fields[n + 7], fields[n + 8] = 'i', serial
  if not horizon then
    fields[n + 9], fields[n + 10] = 'h', serial
  end
  redis.call('HSET', state, unpack(fields))
  outlive(ttl + KEEP, holders, state)
end

-- Where the kind's part of waiter entry `info` ends (its second '|'), for
-- wake()'s `stop`: the owner follows.
local function owner_at(info, sep)
  return string.find(info, '|', sep + 1, true)
end

-- Not admitted: queue `token` (at the back, or the front when `first`) with
-- waiter entry "<deadline>|<rest>|<owner>" (ARGV[4]) if it will wait (`wait` ms > 0), or keep
-- its place with the new entry. Returns the acquire script's reply {0, ms}:
-- ms until the state can change by itself, the earliest expiry of a holder
-- or reservation (the waiter's fallback timer, and Retry-After).
local function wait_in_line(token, wait, rest, first)
  if not whole_ms(wait) then
    error(BAD_MS .. 'wait', 0)
  end
  if wait > 0 then
    local entry = (now_ms + wait) .. '|' .. rest .. '|' .. ARGV[4]
    if redis.call('HSET', state, 'w:' .. token, entry) == 1 then
      redis.call(first and 'LPUSH' or 'RPUSH', queue, token)
    end
    outlive(wait + KEEP, queue, state)
  end
  local soonest = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')
  return {0, #soonest == 0 and 1 or math.max(1, tonumber(soonest[2]) - now_ms)}
end
