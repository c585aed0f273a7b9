-- token_bucket.lua: a token bucket as GCRA (the generic cell rate algorithm,
-- as in go-redis/redis_rate). The chunk returns the load/decide/store table
-- take.lua calls for every key whose algorithm is token_bucket.
--
-- State: one string key holding the theoretical arrival time (TAT), in
-- microseconds of Redis TIME, a decimal number that may carry a fraction. A
-- bucket is full when TAT <= now; every token taken pushes TAT one emission
-- interval (period / limit) further; a request is allowed while the pushed TAT
-- stays within capacity emission intervals of now. The key expires when the
-- bucket would be full again, so idle keys vanish by themselves.
--
-- Precision: TAT is a double near 1.7e15 µs, exact to 0.25 µs. Increments
-- (emission interval × hits) well above that are exact enough; a limit whose
-- increment is below ~1 µs (over ~1M tokens per second per key, one hit at a
-- time) would be rounded away and under-count.
--
-- The state take.lua keeps is the TAT itself (a number; false for no key):
-- a table per decision would be garbage for every request.
local M = {}

local call, tonumber, floor, ceil, format = redis.call, tonumber, math.floor, math.ceil, string.format

function M.load(key)
	-- GET yields false for a missing key; tonumber(false) is nil. A value
	-- that is not a number (never written by us) counts as a full bucket.
	return tonumber(call("GET", key)) or false
end

function M.decide(_, tat, now, limit, period, cap, hits, _, _, force)
	local emission = period / limit -- µs for one token to come back
	local tolerance = emission * cap -- how far TAT may run ahead of now
	if not tat or tat < now then
		tat = now
	end

	-- One microsecond of slack in the token count: TIME has µs resolution and
	-- TAT is a double, so a token due within the same microsecond counts.
	local rem0, reset0 = (now - (tat - tolerance) + 1) / emission, tat - now

	local increment = emission * hits
	local new_tat = tat + increment
	local slack = now - (new_tat - tolerance)
	local allowed, retry = slack >= 0, 0
	if not allowed then
		retry = -slack
		if increment > tolerance then
			-- More hits than the bucket holds: this request can never be
			-- allowed. Report a full refill rather than a meaningless wait.
			retry = tolerance
		end
	end
	if hits > 0 and (allowed or force) then
		return allowed, retry, 0, rem0, reset0, new_tat, (slack + 1) / emission, new_tat - now
	end
	return allowed, retry, 0, rem0, reset0, nil, rem0, reset0
end

-- refund moves TAT back by the hits' increment. Exact when the bucket was
-- not full when they were taken, or when nothing was taken from it since;
-- otherwise (it was full, and a later Take counted from the reserved TAT
-- rather than from its own, later, now) it gives back up to the refill of
-- the time between the two Takes too, at most the refunded hits.
function M.refund(_, tat, _, limit, period, _, hits)
	if not tat then
		return nil
	end
	return tat - period / limit * hits
end

function M.store(key, tat, now)
	-- Expire when the bucket is full again; at least 1 ms.
	local ttl = ceil((tat - now) / 1000)
	if not (ttl >= 1) then -- also NaN, as math.max(1, NaN) is 1
		ttl = 1
	elseif ttl > 9000000000000 then
		ttl = 9000000000000
	end
	-- %.17g round-trips any double; an integer (the usual TAT when the
	-- emission interval is whole µs) prints the same with the cheaper %d.
	local fmt = "%.17g"
	if tat == floor(tat) and tat > 0 and tat < 9007199254740992 then
		fmt = "%d"
	end
	call("SET", key, format(fmt, tat), "PX", ttl)
end

return M
