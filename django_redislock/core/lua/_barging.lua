-- Shared by the barging scripts (Lock(..., fair=False)), after the prelude.
--
-- In the barging order a release frees the lease and wakes the oldest waiter
-- to look again, instead of handing the lease to it: whoever asks first takes
-- it, the releasing process included. Two more fields in the state:
--   b  how many leases went to others than the head of the queue while it
--      waited (barges) since the head was last served. At the caller's
--      limit the free lease is handed to the head as the first-come,
--      first-served scripts do, and `b` starts again from 0. So once a
--      waiter is at the head of the queue, at most `limit` others are served
--      before it, however often they ask.
--   w  the token of the waiter woken last and not heard from since: while it
--      is still queued, a release does not wake it (or anyone) again, its
--      retry is on the way; each wake-up costs a waiter a round trip and a
--      switch to its process. Its next acquire clears it. A waiter that dies
--      between its wake-up and its retry costs the others at most the
--      lease's TTL, as one that dies as a lease is handed to it does in the
--      first-come, first-served order.

-- Wake the oldest live waiter with "<token>" (look again; nothing handed
-- over), unless `woken` (the state's `w`) is still queued. Waiters whose
-- deadline passed, or whose wake-up channel nobody listens on (their process
-- died), are dropped on the way, as hand_off does. A waiter queued without a
-- channel finds the lease free at its next retry. Called after contended(),
-- with the lease free.
local function wake_head(woken)
  if woken and redis.call('HEXISTS', state, woken) == 1 then
    return
  end
  local now = slow.read_clock()
  while true do
    local head = redis.call('LINDEX', queue, 0)
    if not head then
      redis.call('HDEL', state, 'q', 'b', 'w')
      return
    end
    local info = redis.call('HGET', state, head)
    if info then
      local s1 = string.find(info, '|', 1, true)
      if tonumber(string.sub(info, 1, s1 - 1)) > now then
        local mode = string.sub(info, s1 + 1, s1 + 1)
        if mode == '-' then
          return
        end
        local s2 = string.find(info, '|', s1 + 1, true)
        local channel = string.sub(info, s1 + 2, s2 - 1)
        local heard
        if mode == 'p' then
          heard = redis.call('PUBLISH', channel, head)
        else
          heard = redis.call('SPUBLISH', channel, head)
        end
        if heard > 0 then
          redis.call('HSET', state, 'w', head)
          return
        end
      end
      redis.call('HDEL', state, head)
    end
    redis.call('LPOP', queue)
  end
end
