-- A waiter gives up (timeout, cancellation, interrupt): give back a permit or
-- reservation it got without hearing of it, and leave the queue.
-- KEYS: holders, queue, state (see _holders.lua). ARGV[1] token, ARGV[2]
-- grace ms, ARGV[3] limit (used only when the state has lost the current
-- limit).
-- Returns 1 when a permit or reservation was passed on, 0 otherwise.
local token = ARGV[1]
if redis.call('ZREM', holders, token) == 1 then
  forget(token)
  purge()
  promote(tonumber(ARGV[2]), false)
  return 1
end
if redis.call('HDEL', state, 'w:' .. token) == 1 then
  redis.call('LREM', queue, 1, token)
end
return 0
