-- Release the lease if the caller still owns it, and hand it to the next waiter.
-- KEYS: lease, queue, state. ARGV[1] token.
-- Returns 1 when released, 0 when the caller did not own the lease.
-- Repeatable: `d` remembers the tokens released lately (see the prelude), so
-- a retry of a release whose reply was lost reports success, also when the
-- lease went to a waiter meanwhile, or that waiter released it in turn.
local token = ARGV[1]
local holder = redis.call('HGET', lease, 't')
local st = redis.call('HMGET', state, 'd', 'q')
if holder ~= token then
  if st[1] and string.find(st[1], token, 1, true) then
    return 1
  end
  return 0
end
redis.call('DEL', lease)
-- The lease existed, so the state does, with a TTL (see the prelude).
redis.call('HSET', state, 'd', st[1] and token .. ' ' .. string.sub(st[1], 1, RECENT_KEPT) or token)
if st[2] then
  contended().hand_off(false)
end
return 1
