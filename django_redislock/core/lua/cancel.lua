-- A waiter gives up (timeout, cancellation, interrupt): give back a lease that
-- was granted without the caller hearing of it, pass on a turn it was just
-- given, and leave the queue.
-- KEYS: lease, queue, state. ARGV[1] token, ARGV[2] grace ms.
-- Returns 1 when a lease or turn was passed on, 0 otherwise.
local token = ARGV[1]
local grace = tonumber(ARGV[2])
if redis.call('HGET', lease, 't') == token then
  redis.call('DEL', lease)
  if redis.call('HGET', state, 'q') then
    promote(grace, false)
  end
  return 1
end
if redis.call('HGET', state, 'r') == token then
  redis.call('HDEL', state, 'r', 'u')
  if redis.call('EXISTS', lease) == 0 then
    promote(grace, false)
  end
  return 1
end
if redis.call('HDEL', state, token) == 1 then
  redis.call('LREM', queue, 1, token)
end
return 0
