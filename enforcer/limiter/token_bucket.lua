-- token_bucket.lua: a token bucket as GCRA (the generic cell rate algorithm,
-- as in go-redis/redis_rate). The chunk returns one function that take.lua
-- calls for every key whose algorithm is "token_bucket".
--
-- State: one string key holding the theoretical arrival time (TAT), in
-- microseconds of Redis TIME, a decimal number that may carry a fraction. A
-- bucket is full when TAT <= now; every token taken pushes TAT one emission
-- interval (period / limit) further; a request is allowed while the pushed TAT
-- stays within burst emission intervals of now. The key expires when the bucket
-- would be full again, so idle keys vanish by themselves.
--
-- Precision: TAT is a double near 1.7e15 µs, exact to 0.25 µs. Increments
-- (emission interval × hits) well above that are exact enough; a limit whose
-- increment is below ~1 µs (over ~1M tokens per second per key, one hit at a
-- time) would be rounded away and under-count.
--
-- Arguments: key, now (µs), limit, period (µs), burst, hits (0 = peek), and
-- cache, a table shared by the keys of one call so that a key named twice in
-- one call sees the first request's tentative effect.
--
-- Result: a table (see take.lua) with
--   allowed        whether this key alone would admit the request;
--   retry          µs until it would (0 when allowed);
--   remaining      tokens left and
--   reset          µs until full, if the batch is committed;
--   remaining_now,
--   reset_now      the same for the state left untouched (batch rejected);
--   write          a function that stores the new state, nil for a peek.
return function(key, now, limit, period, burst, hits, cache)
	local emission = period / limit       -- µs for one token to come back
	local tolerance = emission * burst    -- how far TAT may run ahead of now

	local tat = cache[key]
	if tat == nil then
		-- GET yields false for a missing key; tonumber(false) is nil. A value
		-- that is not a number (never written by us) counts as a full bucket.
		tat = tonumber(redis.call("GET", key))
	end
	if tat == nil or tat < now then
		tat = now
	end

	-- One microsecond of slack in the token count: TIME has µs resolution and
	-- TAT is a double, so a token due within the same microsecond counts.
	local remaining_now = (now - (tat - tolerance) + 1) / emission
	local reset_now = tat - now

	local increment = emission * hits
	local new_tat = tat + increment
	local slack = now - (new_tat - tolerance)
	if slack < 0 then
		local retry = -slack
		if increment > tolerance then
			-- More hits than the bucket holds: this request can never be
			-- allowed. Report a full refill rather than a meaningless wait.
			retry = tolerance
		end
		return {
			allowed = false, retry = retry,
			remaining = remaining_now, reset = reset_now,
			remaining_now = remaining_now, reset_now = reset_now,
		}
	end

	local result = {
		allowed = true, retry = 0,
		remaining = (slack + 1) / emission, reset = new_tat - now,
		remaining_now = remaining_now, reset_now = reset_now,
	}
	if hits > 0 then
		cache[key] = new_tat
		-- Expire when the bucket is full again; at least 1 ms.
		local ttl = math.max(1, math.ceil((new_tat - now) / 1000))
		local value = string.format("%.17g", new_tat)
		result.write = function()
			redis.call("SET", key, value, "PX", ttl)
		end
	end
	return result
end
