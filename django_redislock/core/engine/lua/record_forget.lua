-- Forget an idempotency record, if it is still the one this attempt wrote
-- (django_redislock/core/drivers/records_base.py): an attempt whose lease ran out
-- while it ran must not delete the record of the duplicate that ran after it.
-- Stand-alone, no prelude.
-- KEYS[1] the record (hash).
-- ARGV[1] the attempt's id (the record's field a).
-- Returns 1 if the record was deleted, 0 if it was another attempt's or gone.
if redis.call('HGET', KEYS[1], 'a') == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
