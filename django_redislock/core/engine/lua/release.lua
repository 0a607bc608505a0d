-- Release the lease if the caller still owns it, and hand it to the next waiter.
-- KEYS: lease, queue, state (see _lock.lua). ARGV[1] token, ARGV[2] its fence
-- (optional).
-- Returns 1 when released, 0 when the caller did not own the lease.
-- Repeatable: a retry of a release whose reply was lost reports success, also
-- when the lease went to a waiter meanwhile and changed hands any number of
-- times since: the state remembers the leases that ended in a loss, not the
-- ones released (see the memory of losses in the prelude). Without the
-- fence, only a lease still held is released.
local held = redis.call('HMGET', lease, 't', 'f', 'j', 'n', 'q')
-- The oldest waiter's entry, once this run popped it (below).
local head
-- Ours, and nobody queued: the common case, which makes none of the helpers.
-- A lease granted with waiters queued carries the state's mark as it was
-- then (give() in _lock.lua): someone was queued, and the TTLs cover that
-- much; any other has the state's `q` read (a waiter may have queued since,
-- by any version of the library).
if held[1] == ARGV[1] then
  mark = held[5] or redis.call('HGET', state, 'q')
  if not mark then
    -- The lease existed, so the state does, with a TTL (see _lock.lua).
    redis.call('DEL', lease)
    redis.call('HSET', state, 'e', held[2])
    return 1
  end
  -- Ours, with waiters queued: the contended common case, which makes none
  -- of the helpers either. The oldest entry is handed the lease here, as
  -- hand_off() and give() in _lock.lua would, when it needs nothing more: a
  -- first-come entry <token>|<since>|<deadline>|<mode><channel>|<ttl>|
  -- <round>|<owner> whose deadline has not passed, woken on a single
  -- server's channel or none, and a mark that covers the new lease and KEEP
  -- (so no TTL is raised). hand_off() takes any other entry, as it popped
  -- it, after the helpers; and the rest of the queue, when nobody heard this
  -- one (its process died: the lease is taken back, as hand_off() does).
  head = held[2] and not held[3] and redis.call('LPOP', queue)
  if head then
    local b1 = string.find(head, '|', 1, true)
    local b2 = b1 and string.find(head, '|', b1 + 1, true)
    local s1 = b2 and string.find(head, '|', b2 + 1, true)
    local s2 = s1 and string.find(head, '|', s1 + 1, true)
    local s3 = s2 and string.find(head, '|', s2 + 1, true)
    local s4 = s3 and string.find(head, '|', s3 + 1, true)
    local mode = s4 and string.sub(head, s1 + 1, s1 + 1)
    local round = s4 and string.sub(head, s3 + 1, s4 - 1)
    if (mode == 'p' or mode == '-') and string.find(round, '^%d+$') then
      clock = redis.call('TIME')
      local us = clock[2] + 0
      now_ms = clock[1] * 1000 + (us - us % 1000) / 1000
      local ends = now_ms + string.sub(head, s2 + 1, s3 - 1)
      local covered = tonumber(mark)
      if string.sub(head, b2 + 1, s1 - 1) - now_ms > 0 and covered
          and covered >= ends + KEEP then
        -- As text once, for the three places it goes (see give()).
        ends = string.format('%d', ends)
        local token = string.sub(head, 1, b1 - 1)
        local f = serial(clock, held[2])
        issued = f
        redis.call('HSET', state, 'f', f, 'e', token .. '|' .. ends .. '|' .. f)
        -- The lease is written over in place: its name (`n`) stays, and so
        -- does its mark when it carried one (`mark` is that copy then).
        local owner = string.sub(head, s4 + 1)
        if held[5] then
          redis.call('HSET', lease, 't', token, 'f', f, 'o', owner, 'x', ends)
        else
          redis.call('HSET', lease, 't', token, 'f', f, 'o', owner, 'x', ends, 'q', mark)
        end
        redis.call('PEXPIREAT', lease, ends)
        if mode == '-' or redis.call('PUBLISH', string.sub(head, s1 + 2, s2 - 1),
            token .. ':' .. f .. ':' .. round) > 0 then
          return 1
        end
        redis.call('DEL', lease)
        redis.call('HSET', state, 'e', f)
        head = false
      end
    end
  end
end
-- @HELPERS@
if held[1] ~= ARGV[1] then
  return contended().released_before(ARGV[2])
end
-- Someone may be queued. Its last fence is the lease's (a lease is granted
-- only when free), and the name the lease holds is the state's: the
-- hand-off needs no more of it; a hand-off that finds the queue empty
-- clears the state's `q`.
if held[3] then
  -- A lease that carries more than give() writes (a unique task's id) is
  -- deleted and made anew.
  redis.call('DEL', lease)
  redis.call('HSET', state, 'e', held[2])
  contended().hand_off(false, held[2], held[2], held[4], held[2])
  return 1
end
-- Any other is written over for the next waiter.
if contended().hand_off(false, held[2], held[2], held[4], held[2], head) or issued then
  -- Handed on, or handed to waiters nobody heard, each taken back (and `e`
  -- written with it).
  return 1
end
redis.call('DEL', lease)
redis.call('HSET', state, 'e', held[2])
return 1
