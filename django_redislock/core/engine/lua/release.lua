-- Release the lease if the caller still owns it, and hand it to the next waiter.
-- KEYS: lease, queue, state (see _lock.lua). ARGV[1] token, ARGV[2] its fence
-- (optional).
-- Returns 1 when released, 0 when the caller did not own the lease.
-- Repeatable: a retry of a release whose reply was lost reports success, also
-- when the lease went to a waiter meanwhile and changed hands any number of
-- times since: the state remembers the leases that ended in a loss, not the
-- ones released (see the memory of losses in the prelude). Without the
-- fence, only a lease still held is released.
local held = redis.call('HMGET', lease, 't', 'f')
if held[1] ~= ARGV[1] then
  return contended().released_before(ARGV[2])
end
redis.call('DEL', lease)
-- The lease existed, so the state does, with a TTL (see _lock.lua).
redis.call('HSET', state, 'e', held[2])
if redis.call('HGET', state, 'q') then
  contended().hand_off(false)
end
return 1
