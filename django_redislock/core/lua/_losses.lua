-- The memory of losses, shared by every lock, semaphore and read-write lock
-- script (scripts.py puts it first, before the kind's prelude). Pure: it
-- reads and writes no key; each kind keeps its fields in its state hash.
--
-- A release sent again after its reply was lost (scripts.py: repeatable)
-- must report success when its first run released, and a loss when the
-- lease was lost (invariants 7 and 14), however often the name changed hands
-- in between. Releases are the common case and losses the rare one, so the
-- state remembers the losses: every grant gets a serial (a lock's or a
-- writer's fence; a private number for a permit or a reader), strictly
-- increasing per name, and the state keeps
--   h  the horizon: the first serial it answers for (the first it issued)
--   u  the serials at or above h of grants that ended in a loss (ran out,
--      force-released), at most LOST of them, space-separated
-- A retried release of serial s that finds it held no longer is answered:
-- s below h or above the last serial issued: unknown, a loss; s in u: a
-- loss; otherwise: released. A loss that would make u longer than LOST
-- drops its smallest entry and raises h past it. So a loss is never reported
-- as a release, memory stays constant however hot the name, and a release is
-- reported lost only when more than LOST grants issued after it were lost
-- before its retry ran (or the state was gone).

-- Room for 3 serials of 16 digits: `u` stays under 64 bytes, the longest
-- value Redis keeps a hash compact with (a lock's state is one).
local LOST = 3

local issued -- the last serial this run issued

-- A new serial, as text: the server clock (`clock`, TIME's reply) in
-- microseconds, above `last` (text, or false/nil) and above any serial this
-- run issued. Serials keep increasing after the state expires or Redis
-- restarts empty, as long as the server clock does not step back.
local function issue(clock, last)
  local us = clock[2]
  local s = clock[1] .. string.rep('0', 6 - #us) .. us
  -- Decimal integers without leading zeros: longer is larger, else compare
  -- as text (no number conversion on the common path).
  if issued and (not last or #issued > #last or (#issued == #last and issued > last)) then
    last = issued
  end
  if last and not (#s > #last or (#s == #last and s > last)) then
    s = string.format('%.0f', tonumber(last) + 1)
  end
  issued = s
  return s
end

-- The rest serves the rarer paths (a loss, a retried release, a holder
-- dropped): made on first use, by losses(), so that a run that needs none
-- of it pays for none of its closures.
local memory

local function losses()
  if memory then
    return memory
  end
  memory = {}

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

  -- Semaphores and read-write locks have many holders: their state hash
  -- keeps i = the last serial issued and s:<token> = each holder's serial.
  -- Record the grants of `tokens`, holders dropped from `key`'s kind without
  -- being released (ran out, force-released), as lost. Call it before their
  -- s: fields are deleted. Reservations have no serial: nothing to record.
  function memory.holders_lost(key, tokens)
    local fields = { 'h', 'u' }
    for i, token in ipairs(tokens) do
      fields[i + 2] = 's:' .. token
    end
    local got = redis.call('HMGET', key, unpack(fields))
    local h, u = got[1], got[2]
    local before = u
    for i = 3, #fields do
      if got[i] then
        u, h = memory.record(u, h, got[i])
      end
    end
    if u ~= before then
      redis.call('HSET', key, 'h', h, 'u', u)
    end
  end

  return memory
end
