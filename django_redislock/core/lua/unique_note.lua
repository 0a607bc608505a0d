-- Write a queued task's id into a lock's lease, for a unique task's
-- duplicates to be told (django_redislock/unique.py); stand-alone, no prelude.
-- KEYS[1] lease hash (see _prelude.lua); the id goes in field j.
-- ARGV[1] token: only a lease this token still holds gets the id, never one
--         that expired and went to another task.
-- ARGV[2] task id.
-- Returns 1 when written, 0 when the token no longer holds the lease.
if redis.call('HGET', KEYS[1], 't') ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'j', ARGV[2])
return 1
