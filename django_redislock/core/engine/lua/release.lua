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
if contended().hand_off(false, held[2], held[2], held[4], held[2]) or issued then
  -- Handed on, or handed to waiters nobody heard, each taken back (and `e`
  -- written with it).
  return 1
end
redis.call('DEL', lease)
redis.call('HSET', state, 'e', held[2])
return 1
