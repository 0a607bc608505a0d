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
-- For operators only (inspect_lock.lua): k=<token>:<server clock, us>, when
-- this holder last renewed or extended. Named by its token because a lease
-- handed on is written over in place and may keep the field of the holder
-- before: a reader counts it only when the token is the lease's.
clock = redis.call('TIME')
redis.call('HSET', lease, 'k', ARGV[1] .. ':' .. clock[1] .. string.sub('00000' .. clock[2], -6))
outlive(tonumber(ARGV[2]) + KEEP, state)
return 1
