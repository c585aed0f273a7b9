-- leaky_bucket.lua: a leaky bucket of capacity cap that drains limit units
-- per period. The chunk returns the load/decide/store table take.lua calls
-- for every key whose algorithm is leaky_bucket.
--
-- State: the bucket's level is a counter that drains lazily; it is stored as
-- the one number that determines it, the time (µs of Redis TIME, a decimal
-- that may carry a fraction) at which the bucket will be empty:
-- level(now) = max(0, empty_at - now) / emission. A request of h hits adds
-- h × emission µs of water. The key expires when the bucket is empty.
--
-- Two modes:
--   policing (max_delay 0): a request is allowed when its water fits in the
--     bucket, else rejected; it proceeds at once. (As a meter this is the
--     same arithmetic as GCRA, which the token bucket uses.)
--   shaping (max_delay > 0): the bucket is a queue that releases one unit
--     per emission interval. An admitted request reserves its place and
--     must wait delay = empty_at - now (the water ahead of it) before it
--     proceeds; it is admitted when it fits in the bucket and that delay is
--     at most max_delay, else rejected.
--
-- The state take.lua keeps is empty_at itself (a number; false for no key).
local M = {}

local call, tonumber = redis.call, tonumber

function M.load(key)
	return tonumber(call("GET", key)) or false
end

function M.decide(_, empty_at, now, limit, period, cap, hits, _, max_delay, force)
	local emission = period / limit -- µs to drain one unit
	local capacity = emission * cap -- µs of water the bucket holds
	if not empty_at or empty_at < now then
		empty_at = now
	end
	-- One microsecond of slack, as in token_bucket.lua.
	local rem0, reset0 = (capacity - (empty_at - now) + 1) / emission, empty_at - now

	local increment = emission * hits
	local new_empty_at = empty_at + increment
	local room = capacity - (new_empty_at - now) -- >= 0: the water fits
	local ahead = empty_at - now                 -- the wait of a shaped request
	local shaping = max_delay > 0
	local allowed, retry, delay = room >= 0 and (not shaping or ahead <= max_delay), 0, 0
	if not allowed then
		if increment > capacity then
			-- Never fits: report the time a full bucket takes to drain.
			retry = capacity
		else
			retry = -room
			if shaping and ahead - max_delay > retry then
				retry = ahead - max_delay
			end
		end
	end
	if shaping and hits > 0 then
		delay = ahead
	end
	if hits > 0 and (allowed or force) then
		return allowed, retry, delay, rem0, reset0, new_empty_at, (room + 1) / emission, new_empty_at - now
	end
	return allowed, retry, delay, rem0, reset0, nil, rem0, reset0
end

-- store writes the time the bucket is empty again, expiring then: the token
-- bucket's store, which does the same with the time its bucket is full.
M.store = algorithm("tb").store

-- refund takes the hits' water back out: the token bucket's refund, with
-- the same bound.
M.refund = algorithm("tb").refund

return M
