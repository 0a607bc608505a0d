-- A waiter gives up (timeout, cancellation, interrupt): give back a lease that
-- was granted or handed to it without its hearing of it, and leave the queue.
-- KEYS: lease, queue, state. ARGV[1] token.
-- Returns 1 when a lease was passed on, 0 otherwise.
local token = ARGV[1]
if redis.call('HGET', lease, 't') == token then
  redis.call('DEL', lease)
  if redis.call('HGET', state, 'q') then
    contended().hand_off(false)
  end
  return 1
end
if redis.call('HDEL', state, token) == 1 then
  redis.call('LREM', queue, 1, token)
end
return 0
