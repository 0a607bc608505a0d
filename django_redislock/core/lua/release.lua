-- Release the lease if the caller still owns it, and hand it to the next waiter.
-- KEYS: lease, queue, state. ARGV[1] token.
-- Returns 1 when released, 0 when the caller did not own the lease.
-- Repeatable: state field d remembers the last token released, so a retry of
-- a release whose reply was lost reports success, not a lost lease.
local holder = redis.call('HGET', lease, 't')
if holder ~= ARGV[1] then
  if not holder and redis.call('HGET', state, 'd') == ARGV[1] then
    return 1
  end
  return 0
end
redis.call('DEL', lease)
redis.call('HSET', state, 'd', ARGV[1])
if redis.call('HGET', state, 'q') then
  contended().hand_off(false)
end
return 1
