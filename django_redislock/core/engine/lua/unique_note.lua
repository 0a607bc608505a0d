-- Write what a unique task's lease says about its holder (django_redislock/
-- tasks/): the queued task's id, for its duplicates to be told, and the
-- owner, once a worker adopts it, for operators; stand-alone, no prelude.
-- KEYS[1] lease hash (see _prelude.lua); the id goes in field j, the owner in
--         o, and r=1 with the owner: a run adopted the lease (a revoked task
--         whose key no run adopted never ran, and its key may be taken over).
-- ARGV[1] token: only a lease this token still holds is written, never one
--         that expired and went to another task.
-- ARGV[2] task id, or '' to leave j as it is.
-- ARGV[3] owner metadata (JSON, as an acquire writes it), or '' to leave o and r.
-- Returns 1 when written, 0 when the token no longer holds the lease.
if redis.call('HGET', KEYS[1], 't') ~= ARGV[1] then
  return 0
end
if ARGV[2] ~= '' then
  redis.call('HSET', KEYS[1], 'j', ARGV[2])
end
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], 'o', ARGV[3], 'r', '1')
end
return 1
