-- A waiter gives up (timeout, cancellation, interrupt): give back a turn or
-- reservation it got without hearing of it, and leave the queue.
-- KEYS: holders, queue, state. ARGV[1] token, ARGV[2] grace ms.
-- Returns 1 when a turn or reservation was passed on, 0 otherwise.
local token = ARGV[1]
if redis.call('ZREM', holders, token) == 1 then
  forget(token, nil)
  purge()
  promote(tonumber(ARGV[2]), false, nil)
  return 1
end
if redis.call('HDEL', state, 'w:' .. token) == 1 then
  redis.call('LREM', queue, 1, token)
  -- A writer that leaves the head lets the readers behind it in.
  purge()
  promote(tonumber(ARGV[2]), false, nil)
end
return 0
