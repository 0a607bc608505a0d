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
--   w  "<token>|<round>|<ms>": the waiter woken last, the attempt it was
--      queued by, and when it was woken (server clock). While it has not
--      looked again (its queue entry still names that attempt; any acquire
--      script that queues it again writes its new one) and was woken less
--      than WAKE_AGAIN ms ago, a release wakes nobody: its retry is on the
--      way, and each wake-up costs a waiter a round trip and a switch to its
--      process. The time bound covers a waiter that never retries (its
--      process died between its wake-up and its retry).

-- See `w`: longer than a live waiter takes to look again after its wake-up
-- (BARGE_DEFER in protocol.py, then a round trip, on a loaded host).
local WAKE_AGAIN = 20

-- The attempt number in a queue entry (see the prelude), or nil.
local function entry_round(info)
  local s1 = string.find(info, '|', 1, true)
  local s2 = s1 and string.find(info, '|', s1 + 1, true)
  local s3 = s2 and string.find(info, '|', s2 + 1, true)
  local s4 = s3 and string.find(info, '|', s3 + 1, true)
  return s4 and string.sub(info, s3 + 1, s4 - 1)
end

-- Wake the oldest live waiter with "<token>" (look again; nothing handed
-- over), unless `woken` (the state's `w`) has not looked again since it was
-- woken, less than WAKE_AGAIN ms ago. Waiters whose deadline passed, or
-- whose wake-up channel nobody listens on (their process died), are dropped
-- on the way, as hand_off does. A waiter queued without a channel finds the
-- lease free at its next retry. Called after contended(), with the lease free.
local function wake_head(woken)
  local now = slow.read_clock()
  if woken then
    local b1 = string.find(woken, '|', 1, true)
    local b2 = b1 and string.find(woken, '|', b1 + 1, true)
    if b2 and now - tonumber(string.sub(woken, b2 + 1)) < WAKE_AGAIN then
      local info = redis.call('HGET', state, string.sub(woken, 1, b1 - 1))
      if info and entry_round(info) == string.sub(woken, b1 + 1, b2 - 1) then
        return
      end
    end
  end
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
          redis.call('HSET', state, 'w', head .. '|' .. (entry_round(info) or '') .. '|' .. now)
          return
        end
      end
      redis.call('HDEL', state, head)
    end
    redis.call('LPOP', queue)
  end
end
