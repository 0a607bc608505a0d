-- The prelude of every lock, semaphore and read-write lock script: what the
-- three kinds share. scripts.py puts it first, then the kind's own piece
-- (_lock.lua; or _holders.lua, shared by semaphores and read-write locks,
-- then _semaphore.lua or _rwlock.lua), then the script's body.
--
-- KEYS[1] the kind's own: a lock's lease (hash), or the holders of a
--         semaphore or read-write lock (zset)
-- KEYS[2] queue  list  waiting tokens, oldest first (a lock's first-come
--                      order keeps each waiter's entry in its element
--                      instead: see _lock.lua)
-- KEYS[3] state  hash  n=name, h and u=the memory of losses (below), one
--                      waiter entry per token queued bare, and the kind's
--                      own fields (see its piece)
-- A waiter entry is "<deadline ms>|..."; the kind says what follows, and
-- where in it the waiter's wake-up channel is: "<p|s|c|-><channel>", p for
-- PUBLISH on a single server, s for SPUBLISH (a Cluster's channel of the
-- lock's slot), c for PUBLISH where the count of receivers proves nothing
-- (a Cluster node without sharded pub/sub, or a Sentinel client's primary),
-- - for none (the waiter looks again at its next retry). A token is queued
-- bare exactly when the state has its waiter entry.
--
-- Every key has a TTL. Each script that writes a key raises its TTL to cover
-- what it wrote, plus KEEP for the state (outlive; it never lowers a TTL;
-- a lock's contended paths skip it while the mark in its state's `q` says
-- the TTLs cover enough: cover() in _lock.lua), so no path leaves a key
-- without one, and the state outlives every lease, holder, reservation and
-- waiter it speaks of by KEEP.
--
-- Every run of a script pays for what it does (Redis compiles a script once;
-- each run makes the closures its chunk defines), and the uncontended paths
-- are kept to the least: they read the server clock only when they need it,
-- keep numbers as text where they can (a conversion between number and text
-- costs about what a redis.call does; where one is needed, text known to be
-- a number is converted by arithmetic, `x + 0`, which reads it once, where
-- tonumber() reads it twice and is a call besides), and make few closures (each costs
-- about half a redis.call, and more per local of the script it refers to):
-- the uncontended acquire and release return before any helper is made (the
-- HELPERS line below); other runs make issue() and outlive(), and what the
-- rarer paths need is made on first use, by common() here and by contended()
-- in _lock.lua.

local queue, state = KEYS[2], KEYS[3]
-- How long the state outlives what it holds: STATE_KEEP_MS in protocol.py,
-- written in by scripts.load. The one way the scripts learn it (a constant
-- of the protocol, not a caller's choice; see docs/internals.rst, Scripts).
local KEEP = @STATE_KEEP_MS@
-- A duration a script writes into an expiry (ms, as the client sent it) must
-- be 1 to 12 digits, under 32 years (the library sends at most a year:
-- core/validate.py). A script checks it before it writes: Redis refuses a
-- larger expiry only after the write, and the key would stay without a TTL.
-- MS matches such text; a bad one is refused with BAD_MS, naming the
-- argument. (Semaphores and read-write locks, which convert their numbers,
-- check the numbers: whole_ms in _holders.lua.)
local MS = '^%d%d?%d?%d?%d?%d?%d?%d?%d?%d?%d?%d?$'
local BAD_MS = 'ERR a duration must be a whole number of ms, at most 12 digits: '
local clock, now_ms -- TIME's reply, and it in ms: read once, when first needed

-- The memory of losses. A release sent again after its reply was lost
-- (scripts.py: repeatable) must report success when its first run released,
-- and a loss when the lease was lost (invariants 7 and 14), however often the
-- name changed hands in between. Releases are the common case and losses the
-- rare one, so the state remembers the losses: every grant gets a serial (a
-- lock's or a writer's fence; a private number for a permit or a reader),
-- strictly increasing per name, and the state keeps
--   h  the horizon: the first serial it answers for (the first it issued)
--   u  the serials at or above h of grants that ended in a loss (ran out,
--      force-released), at most LOST (in losses()) of them, space-separated
-- A retried release of serial s that finds it held no longer is answered:
-- s below h or above the last serial issued: unknown, a loss; s in u: a
-- loss; otherwise: released. A loss that would make u longer than LOST
-- drops its smallest entry and raises h past it. So a loss is never reported
-- as a release, memory stays constant however hot the name, and a release is
-- reported lost only when more than LOST grants issued after it were lost
-- between its first run and its retry (or the state was gone). Losses while
-- it still held (many holders) are covered by `g` (memory.released_below).

local issued -- the last serial this run issued

-- A serial, as text: the server clock (`clock`, TIME's reply) in
-- microseconds, or one more than `last` (text, or false/nil) when that is not
-- above it. Serials keep increasing after the state expires or Redis
-- restarts empty, as long as the server clock does not step back. It uses no
-- local of the script (no upvalue), so making it costs every run little: an
-- uncontended acquire calls it before the helpers below are made.
local function serial(clock, last)
  local us = clock[2]
  local s = clock[1] .. string.rep('0', 6 - #us) .. us
  -- Decimal integers without leading zeros: longer is larger, else compare
  -- as text (no number conversion on the common path).
  if last and not (#s > #last or (#s == #last and s > last)) then
    s = string.format('%.0f', tonumber(last) + 1)
  end
  return s
end

-- What comes before this line, every run makes; the helpers after it, only
-- a run that gets past a script's fast path (see scripts.py, HELPERS).
-- @HELPERS@

-- A new serial (serial()) above `last` and above any serial this run issued.
local function issue(clock, last)
  if issued and (not last or #issued > #last or (#issued == #last and issued > last)) then
    last = issued
  end
  issued = serial(clock, last)
  return issued
end

-- Raise the TTL of `key` (and of `other`, if given) to at least ms; never
-- shortens one, never makes one eternal.
local function outlive(ms, key, other)
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, ms)
  end
  if other and redis.call('PTTL', other) < ms then
    redis.call('PEXPIRE', other, ms)
  end
end

-- The helpers of the rarer paths, in one table made by common() on first
-- use (a run that needs none of them pays for none; one table, not a local
-- per helper, keeps cheap the closures of every run that refer to them).
-- losses() makes the memory's own, rarer still.
local lib

local function common()
  if lib then
    return lib
  end

  -- The server clock in ms, as a number (deadlines, expiries).
  local function now()
    if not now_ms then
      clock = clock or redis.call('TIME')
      local us = clock[2] + 0
      now_ms = clock[1] * 1000 + (us - us % 1000) / 1000
    end
    return now_ms
  end

  -- Where the deadline of waiter entry `info` ends (its first '|') when the
  -- deadline has not passed on the server clock, else false.
  local function alive(info)
    local sep = string.find(info, '|', 1, true)
    return tonumber(string.sub(info, 1, sep - 1)) > (now_ms or now()) and sep
  end

  -- Send `message` on the wake-up channel at `at` in waiter entry `info`,
  -- which ends before `stop` (nil: at the end of the entry). Whether anyone
  -- may have heard: a waiter without a channel ('-') counts as heard, and so
  -- does one on a Cluster or through Sentinel ('s', 'c'). There a server
  -- counts only its own listeners, while Redis delivers the message to every
  -- node of the shard (SPUBLISH), of the Cluster (PUBLISH), or to a
  -- primary's replicas: a live process may listen on a replica, hear its
  -- wake-up and act on it. Only a single server's count ('p') says that the
  -- waiter's process is gone.
  local function wake(info, at, stop, message)
    local mode = string.sub(info, at, at)
    if mode == '-' then
      return true
    end
    local channel = string.sub(info, at + 1, stop and stop - 1 or -1)
    if mode == 'p' then
      return redis.call('PUBLISH', channel, message) > 0
    end
    redis.call(mode == 's' and 'SPUBLISH' or 'PUBLISH', channel, message)
    return true
  end

  local memory

  local function losses()
    if memory then
      return memory
    end
    memory = {}

    -- Room for 3 serials of 16 digits: `u` stays under 64 bytes, the longest
    -- value Redis keeps a hash compact with (a lock's state is one).
    local LOST = 3

    -- Whether decimal integer text `a` is larger than `b` (as in issue()).
    local function above(a, b)
      return #a > #b or (#a == #b and a > b)
    end

    -- Whether `u` (text or false) holds `serial`.
    local function among(u, serial)
      if u then
        for s in string.gmatch(u, '%d+') do
          if s == serial then
            return true
          end
        end
      end
      return false
    end

    -- The new `u` and `h` once the grant `serial` ended in a loss (u, h: their
    -- values, false when unset; h is set with the first serial a state issues).
    function memory.record(u, h, serial)
      if not h or above(h, serial) or among(u, serial) then
        return u, h -- below the horizon: any retry of it is answered lost already
      end
      if not u then
        return serial, h
      end
      local list = { serial }
      for s in string.gmatch(u, '%d+') do
        list[#list + 1] = s
      end
      if #list > LOST then
        local low = 1
        for i = 2, #list do
          if above(list[low], list[i]) then
            low = i
          end
        end
        h = string.format('%.0f', tonumber(list[low]) + 1)
        table.remove(list, low)
      end
      return table.concat(list, ' '), h
    end

    -- Whether the grant `serial` (text from the client: '' or nil when it did
    -- not say), which holds no longer, was released. `last`: the last serial
    -- issued; h and u as above (false when unset).
    function memory.released(serial, last, h, u)
      if not serial or not last or not h or not string.find(serial, '^[1-9]%d*$') then
        return false
      end
      return not (above(serial, last) or above(h, serial) or among(u, serial))
    end

    -- Semaphores and read-write locks have many holders: their state keeps
    -- i = the last serial issued and s:<token> = each holder's serial.
    -- Record the grants of `tokens`, holders dropped without being released
    -- (ran out, force-released), as lost. Call it before their s: fields are
    -- deleted. Reservations have no serial: nothing to record.
    function memory.holders_lost(tokens)
      local fields = { 'h', 'u' }
      for i, token in ipairs(tokens) do
        fields[i + 2] = 's:' .. token
      end
      local got = redis.call('HMGET', state, unpack(fields))
      local h, u = got[1], got[2]
      local before = u
      for i = 3, #fields do
        if got[i] then
          u, h = memory.record(u, h, got[i])
        end
      end
      if u ~= before then
        redis.call('HSET', state, 'h', h, 'u', u)
      end
    end

    -- Many holders at once: grants issued after a holder's own can be lost
    -- while it still holds, and raise h past its serial. Such a holder's
    -- release (`serial` below `h`, rare) is remembered as released in `g`
    -- ('serial:until ...', newest first, until in server ms) for KEEP ms, the
    -- time a state outlives its last use, so that a retry of it hears
    -- "released"; at most RELEASED of them, the oldest let go first (its
    -- retry then hears "lost": the safe answer). Only releases are put there:
    -- a loss is never reported as a release.
    local RELEASED = 8
    function memory.released_below(serial, h)
      if not (serial and h and above(h, serial)) then
        return
      end
      local kept = { serial .. ':' .. (now() + KEEP) }
      for s, t in string.gmatch(redis.call('HGET', state, 'g') or '', '(%d+):(%d+)') do
        if #kept < RELEASED and tonumber(t) > now() then
          kept[#kept + 1] = s .. ':' .. t
        end
      end
      redis.call('HSET', state, 'g', table.concat(kept, ' '))
    end

    -- The same kinds' answer to a release of `serial` (as memory.released)
    -- that found its holder gone: 1 if it was released all the same, else 0.
    function memory.holder_released(serial)
      local mem = redis.call('HMGET', state, 'i', 'h', 'u', 'g')
      if memory.released(serial, mem[1], mem[2], mem[3]) then
        return 1
      end
      for s, t in string.gmatch(mem[4] or '', '(%d+):(%d+)') do
        if s == serial and tonumber(t) > now() then
          return 1
        end
      end
      return 0
    end

    return memory
  end

  -- A lock's piece adds its own (contended() in _lock.lua).
  lib = { now = now, alive = alive, wake = wake, losses = losses }
  return lib
end
