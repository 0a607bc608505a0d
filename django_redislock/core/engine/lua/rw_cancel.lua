-- A waiter gives up (timeout, cancellation, interrupt): give back a turn or
-- reservation it got without hearing of it, and leave the queue; a writer
-- that leaves the head of the queue lets the readers behind it in.
-- KEYS: holders, queue, state (see _holders.lua). ARGV[1] token, ARGV[2]
-- grace ms.
-- Returns 1 when a turn or reservation was passed on, 0 otherwise.
local token = ARGV[1]
local given = redis.call('ZREM', holders, token) == 1
if given then
  forget(token, nil)
elseif redis.call('HDEL', state, 'w:' .. token) == 1 then
  redis.call('LREM', queue, 1, token)
else
  return 0
end
purge()
promote(tonumber(ARGV[2]), false, nil)
return given and 1 or 0
