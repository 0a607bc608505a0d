-- A lock's own piece, after _prelude.lua, in every lock script.
--
-- KEYS[1] lease  hash  t=token f=fence o=owner, and n=name when the key
--                cannot hold it readably (long names); the fence is the
--                server's microsecond clock when it was granted; and,
--                when granted with waiters queued (give()), x=its end
--                (server ms; unless extended since) and q=the state's mark
--                then (see cover()), if set
-- KEYS[2] queue  list  (see the prelude); in the first-come order each
--                element is the waiter's whole entry, written once when
--                it queues: <token>|<since ms>|<entry> (entry as below;
--                since: when it queued, server ms), so that a hand-off
--                reads and drops it with the LPOP it makes anyway; the
--                barging order queues bare tokens, with their entries in
--                the state
-- KEYS[3] state  hash  f=last fence, q=set while the queue may be non-empty,
--                        to the mark: a time (server ms) before which
--                        neither the state nor the queue expires (cover()),
--                        or 0 (1 from earlier versions): none known,
--                      n=lock name,
--                      e=the fence of the last lease that ended without a
--                        loss (released, or given back unused), or, once
--                        a lease was granted with waiters queued (give()),
--                        its copy <token>|<end ms>|<fence>: not a fence,
--                        so as before it tells that the last lease issued
--                        has not yet ended without a loss (every script
--                        only ever compares `e` with `f`), and a waiter
--                        that queues behind it learns its holder and end
--                        from the state it reads anyway (acquire.lua),
--                      h, u=the memory of losses (the prelude): a lease's
--                        fence is its serial, and a lease ended in a loss
--                        when it ended without `e` naming it (it ran out,
--                        or was force-released); the next grant records it
--                      d=the last RECENT tokens given back, newest first,
--                        space-separated (tokens are 16 hex digits, so a
--                        match cannot straddle a separator)
--                      <token>=<entry> for each waiter queued as a bare
--                      token (the barging order, and earlier versions),
--                      where an entry is
--                      <deadline ms>|<p|s|c|-><channel>|<ttl ms>|<round>|<owner>
--                      and, in the barging order (Lock(..., fair=False)):
--                      b=how many leases went to others than the head of
--                        the queue while it waited (barges) since it was
--                        last served (acquire.lua),
--                      w=the waiter woken last (release_barging.lua)
-- The state's TTL is never shorter than the lease's: every path that sets the
-- lease's TTL raises the state's to at least the same plus KEEP, so a lease
-- never outlives its state and no write to the state finds it gone. The
-- uncontended paths read `q` instead of touching the queue.

local lease = KEYS[1]
-- How many given-back tokens `d` remembers: an acquire that arrives after
-- its caller gave it back (a reply that never came, then a give-back that
-- ran first) grants nothing. It comes within moments of the give-back, in
-- which a name sees few others; more entries would push the state out of
-- Redis's compact encoding (values up to 64 bytes) and make every lock
-- script dearer. (A retried release is answered by the memory of losses.)
local RECENT = 3

-- `d` keeps at most this much of its former value when a token is added.
local RECENT_KEPT = (RECENT - 1) * 17 - 1

-- The state's `q` as this run knows it: its text (or number), false or nil
-- when unset. A script that reads the state sets it before anything may call
-- give() with waiters.
local mark

-- @HELPERS@

-- Write a lease for `token`, granted with waiters queued (an uncontended
-- grant is acquire.lua's, before the helpers), and return its fence, as text:
-- its serial (issue()), the server clock in microseconds above the last
-- fence issued (`last`). `ended` is the state's `e`: when it does not name
-- `last`, that lease ended in a loss and is recorded as one; `horizon` is
-- its `h` (false in a state that has none yet: it starts here). `ttl` is
-- text; `state_ttl` (the state's TTL: ttl + KEEP) a number; `name` is ''
-- when the key holds it. The state's TTL may only grow (it covers the
-- waiters' deadlines). `more`: fields and values to write into the state
-- along with the fence.
-- The lease is written over in place: a caller that hands on a lease it
-- found (rather than one it deleted) makes sure it has no other fields.
local function give(token, ttl, state_ttl, name, owner, last, ended, horizon, more)
  clock = clock or redis.call('TIME')
  if issued then
    -- This run gave a lease already and took it back (a waiter nobody
    -- heard): that one is the last, and it ended without a loss.
    last, ended, horizon = issued, issued, horizon or issued
  end
  local f = issue(clock, last)
  -- Only reached after contended(), which made lib. The lease ends on the
  -- clock that cover() below reads (TIME, when this run first read it), so
  -- the state outlives it by KEEP exactly, not by KEEP less however long
  -- the run has taken since.
  local now = lib.now()
  -- As text once, for the three places it goes (the state's copy, the
  -- lease's `x`, its PEXPIREAT): '%d' costs the server about half what a
  -- number concatenated or passed to redis.call costs.
  local ends = string.format('%d', now + tonumber(ttl))
  local fields = { 'f', f }
  if not last or not horizon then
    fields[3], fields[4] = 'h', f
  elseif ended ~= last then
    local u, h = lib.losses().record(redis.call('HGET', state, 'u'), horizon, last)
    if u then
      fields[3], fields[4], fields[5], fields[6] = 'h', h, 'u', u
    end
  end
  if more then
    for i = 1, #more do
      fields[#fields + 1] = more[i]
    end
  end
  if mark then
    -- Waiters are queued: the state's `e` becomes the new lease's copy (see
    -- above), written with the fence, so a waiter that queues behind it
    -- reads no more than the state. It claims no more than `f` does: it
    -- counts only while its fence is the state's `f` (a grant by an earlier
    -- version writes `f` and leaves `e`), and its end only until it has
    -- passed.
    fields[#fields + 1] = 'e'
    fields[#fields + 1] = token .. '|' .. ends .. '|' .. f
  end
  redis.call('HSET', state, unpack(fields))
  lib.cover(now + tonumber(state_ttl))
  -- A grant made with waiters queued keeps in the lease its end `x` and
  -- the state's mark `q` as cover() left it: its release learns the mark
  -- from the lease (release.lua), with no call of its own, and a waiter
  -- that finds the state's copy stale learns the end from the lease. The
  -- mark never claims more than Redis holds: the state's and the queue's
  -- TTLs were raised to it, and while the lease exists nothing shortens
  -- them (the one TTL set outright, an uncontended grant's, needs the lease
  -- gone).
  local lease_fields = { 't', token, 'f', f, 'o', owner, 'x', ends }
  if mark then
    lease_fields[9], lease_fields[10] = 'q', mark
  end
  if name ~= '' then
    lease_fields[#lease_fields + 1] = 'n'
    lease_fields[#lease_fields + 1] = name
  end
  redis.call('HSET', lease, unpack(lease_fields))
  redis.call('PEXPIREAT', lease, ends)
  return f
end

-- The contended paths' helpers: the prelude's, and the lock's own added to
-- them (lib.hand_off, lib.released_before). Returns them.
local function contended()
  if lib and lib.hand_off then
    return lib
  end
  common()

  -- A release of `fence` (text from the client; '' or nil when it did not
  -- say) that found the lease not its own: 1 if that lease was released all
  -- the same (this is a retry, and the first run released it), else 0.
  function lib.released_before(fence)
    if not fence or fence == '' then
      return 0
    end
    local st = redis.call('HMGET', state, 'f', 'e', 'h', 'u')
    if fence == st[1] then
      -- The last lease issued, and gone: released only if `e` says so (it
      -- may have run out since, unrecorded until the next grant).
      return st[2] == fence and 1 or 0
    end
    return lib.losses().released(fence, st[1], st[3], st[4]) and 1 or 0
  end

  -- How long a lease handed as a claim (on a Cluster, to a waiter whose
  -- process is not seen listening on the lock's node: hand_off) waits for
  -- its waiter to ask again, ms: a wake-up and a round trip, with room for a
  -- loaded host. A waiter that misses it queues again; a dead one holds the
  -- lock no longer than this.
  local CLAIM = 2000

  -- How far past its mark cover() sets the state's and the queue's expiry,
  -- ms: a busy name raises them once in this long, not in every run. It is
  -- what the state may outlive its last waiter or lease beyond KEEP.
  local SPARE = 1000

  -- Make sure the state and the queue (while it exists) last until at least
  -- `until_ms` (server ms, a number), never shortening either. While anyone
  -- is queued, the state's `q` (the mark) says until when they last
  -- already, so most runs of a busy name touch neither TTL. Otherwise both
  -- are raised to `until_ms` + SPARE (where shorter; a key without a TTL
  -- gets one), and the mark says so when `q` is set. The mark never claims
  -- more than Redis holds: it is written only here, after both TTLs were
  -- raised to it; the one TTL set outright (an uncontended grant, acquire.lua)
  -- is set while `q` is unset, and the waiter that finds `q` unset writes it
  -- after this raised both (enqueue, acquire.lua); and a queue made anew is
  -- given the mark as its expiry (enqueue). `made`: this run made the queue
  -- anew (its RPUSH), so it has no TTL yet and is given one without asking.
  -- The mark it raised them to (what the caller writes as `q` when it is
  -- unset), or false when it raised nothing.
  function lib.cover(until_ms, made)
    local x = mark and tonumber(mark)
    if x and x >= until_ms then
      return false
    end
    local target = until_ms + SPARE
    local left = target - lib.now()
    if mark then
      redis.call('HSET', state, 'q', target)
      mark = target
    end
    if redis.call('PTTL', state) < left then
      redis.call('PEXPIREAT', state, target)
    end
    if made then
      redis.call('PEXPIREAT', queue, target)
    else
      local q = redis.call('PTTL', queue)
      if q ~= -2 and q < left then
        redis.call('PEXPIREAT', queue, target)
      end
    end
    return target
  end

  -- The lock is free and someone may be queued: hand the lease straight to
  -- the oldest live waiter and wake it with "<token>:<fence>:<round>", so it
  -- holds the lock the moment it wakes, with no second round trip. The
  -- message also names the acquire attempt (round) that queued the waiter:
  -- a lease handed in answer to an older attempt is never taken as it is.
  -- On a Cluster or through Sentinel ('s', 'c'), a waiter whose process is
  -- not seen listening on this node (its listener may be on a replica, after
  -- a failover, and hear the message all the same; see wake()) is handed a
  -- claim instead: the lease
  -- for CLAIM ms, and "<token>:<fence>", which names no round, so that it
  -- asks again (acquire finds the lease its own and restarts it for its TTL)
  -- before it counts as held. A dead waiter costs its claim, not its TTL.
  -- Waiters whose deadline passed, or whose wake-up channel nobody listens
  -- on (their process died: known on a single server only), are dropped on
  -- the way. Returns the new holder's token, or false when nobody was left.
  -- When the oldest live waiter is `self` (the caller of this very script),
  -- it is popped and returned without a lease: the caller takes it itself.
  -- `last`, `ended` and `name` are the state's f, e and n as give() takes
  -- them; `horizon` its h when the caller has it (else h is read when
  -- someone waits: with the waiter's entry, when queued bare).
  -- A release passes its own fence as `ended` (its lease ended without a
  -- loss): `e` is not written for it, since the grant writes its copy there
  -- with the new fence, and `e` only ever counts when it names the last
  -- fence issued. A waiter nobody heard gets its lease deleted and `e`
  -- names it: nobody will release it, no loss to remember.
  -- `horizon`: the state's h, when the caller read it; a release passes its
  -- own fence in its stead (last and ended are that fence: the grant reads
  -- no h then, see give()). `popped`: the oldest entry, when the caller
  -- popped it already (release.lua), taken first.
  function lib.hand_off(self, last, ended, name, horizon, popped)
    while true do
      local head = popped or redis.call('LPOP', queue)
      popped = nil
      if not head then
        redis.call('HDEL', state, 'q')
        mark = false
        return false
      end
      local info
      local bar = string.find(head, '|', 1, true)
      if bar then
        -- The first-come order's element: <token>|<since>|<entry>.
        info = string.sub(head, string.find(head, '|', bar + 1, true) + 1)
        head = string.sub(head, 1, bar - 1)
        if not horizon then
          horizon = redis.call('HGET', state, 'h')
        end
      else
        local got = redis.call('HMGET', state, head, 'h')
        info, horizon = got[1], got[2]
        redis.call('HDEL', state, head)
      end
      local s1 = info and lib.alive(info)
      if s1 then
        if head == self then
          return head
        end
        local s2 = string.find(info, '|', s1 + 1, true)
        local s3 = string.find(info, '|', s2 + 1, true)
        local s4 = string.find(info, '|', s3 + 1, true)
        local ttl = string.sub(info, s2 + 1, s3 - 1)
        -- An entry written before attempts were numbered has the owner
        -- (JSON, never digits) where the round is: it is woken as before,
        -- with no round, and looks again.
        local round = s4 and string.sub(info, s3 + 1, s4 - 1)
        local owner
        if round and string.find(round, '^%d+$') then
          owner = string.sub(info, s4 + 1)
        else
          round = nil
          owner = string.sub(info, s3 + 1)
        end
        local mode = string.sub(info, s1 + 1, s1 + 1)
        if (mode == 's' or mode == 'c') and redis.call('PUBSUB',
            mode == 's' and 'SHARDNUMSUB' or 'NUMSUB', string.sub(info, s1 + 2, s2 - 1))[2] == 0 then
          -- A Cluster's or Sentinel client's waiter whose process is not seen
          -- listening on this node (the count of this node's listeners of
          -- its channel): a claim (see above). A single server's count comes
          -- with wake().
          round = nil
          if tonumber(ttl) > CLAIM then
            ttl = CLAIM
          end
        end
        local fence = give(head, ttl, tonumber(ttl) + KEEP, name or '', owner, last, ended,
          horizon)
        local message = head .. ':' .. fence
        if round then
          message = message .. ':' .. round
        end
        if lib.wake(info, s1 + 1, s2, message) then
          -- A waiter without a channel finds its lease at its next retry.
          return head
        end
        -- Nobody heard: its process died. Take the lease back (nobody
        -- will release it: no loss to remember), try the next.
        redis.call('DEL', lease)
        redis.call('HSET', state, 'e', fence)
      end
    end
  end

  return lib
end
