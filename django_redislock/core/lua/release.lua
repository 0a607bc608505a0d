-- Release the lease if the caller still owns it, and wake the next waiter.
-- KEYS: lease, queue, state. ARGV[1] token, ARGV[2] grace ms.
-- Returns 1 when released, 0 when the caller did not own the lease.
if redis.call('HGET', lease, 't') ~= ARGV[1] then
  return 0
end
redis.call('DEL', lease)
if redis.call('HGET', state, 'q') then
  promote(tonumber(ARGV[2]), false)
end
return 1
