-- Read one lock for operators (inspect.py); writes nothing. After
-- _prelude.lua alone: the keys may be of any type, or none.
-- KEYS[1] lease hash, KEYS[2] queue list, KEYS[3] state hash (see _lock.lua)
-- ARGV[1] how many live waiters to list (absent: none), oldest first
-- Returns false when KEYS[1] is not a held lease, otherwise
-- {token, fence, name ('' when the key shows it), owner, lease ms left
--  (-1: no TTL), live waiters, server now ms, k (the lease's last renewal,
--  <token>:<server us>, or ''), {token1, entry1, token2, entry2, ...}} where
-- each entry is the waiter's <deadline ms>|<channel>|<ttl>|<round>|<owner>.
-- The fence is the server's microsecond clock when the lease was granted.
-- Waiters whose deadline passed are still in the queue until the next release
-- drops them; they are neither counted nor listed.
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then
  return false
end
local v = redis.call('HMGET', KEYS[1], 't', 'f', 'n', 'o', 'k')
if not v[1] then
  return false
end
common() -- lib.alive()
local waiting = 0
local listed = {}
local shown = tonumber(ARGV[1] or '0') or 0
if redis.call('TYPE', queue).ok == 'list' and redis.call('TYPE', state).ok == 'hash' then
  for _, element in ipairs(redis.call('LRANGE', queue, 0, -1)) do
    -- <token>|<since>|<entry> (the first-come order), or a bare token whose
    -- entry is in the state (see _lock.lua).
    local bar = string.find(element, '|', 1, true)
    local token = bar and string.sub(element, 1, bar - 1) or element
    local info = bar and string.sub(element, string.find(element, '|', bar + 1, true) + 1)
      or redis.call('HGET', state, element)
    if info and lib.alive(info) then
      waiting = waiting + 1
      if waiting <= shown then
        table.insert(listed, token)
        table.insert(listed, info)
      end
    end
  end
end
return {v[1], v[2] or '', v[3] or '', v[4] or '', redis.call('PTTL', KEYS[1]), waiting, lib.now(),
  v[5] or '', listed}
