-- Reset the lease to ttl ms from now, if the caller still owns it.
-- KEYS: lease, queue, state (see _lock.lua). ARGV[1] token, ARGV[2] ttl ms.
-- Returns 1 when extended, 0 when the caller did not own the lease; an error
-- (BAD_MS) for a ttl that is not a duration.
if not string.find(ARGV[2], MS) then
  return redis.error_reply(BAD_MS .. 'ttl')
end
if redis.call('HGET', lease, 't') ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', lease, ARGV[2])
outlive(tonumber(ARGV[2]) + KEEP, state)
return 1
