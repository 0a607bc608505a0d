-- Force-release (operators): delete the lease whoever holds it, and hand it
-- to the next waiter. The former holder learns of it at its next extend or release.
-- KEYS: lease, queue, state (see _lock.lua). ARGV[1] grace ms. ARGV[2] expected token or ''.
-- Returns 1 when a lease was deleted, 0 when none was held (or another token).
local holder = redis.call('HGET', lease, 't')
if not holder or (ARGV[2] ~= '' and holder ~= ARGV[2]) then
  return 0
end
redis.call('DEL', lease)
local st = redis.call('HMGET', state, 'q', 'f', 'e', 'n', 'h')
if st[1] then
  mark = st[1]
  -- The lease ended in a loss (`e` does not name it): the grant records it.
  contended().hand_off(false, st[2], st[3], st[4], st[5])
end
return 1
