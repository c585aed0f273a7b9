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
local M = {}

function M.load(key)
	return { empty_at = tonumber(redis.call("GET", key)) }
end

function M.decide(_, st, now, p, force)
	local emission = p.period / p.limit   -- µs to drain one unit
	local capacity = emission * p.cap     -- µs of water the bucket holds
	local empty_at = st.empty_at
	if empty_at == nil or empty_at < now then
		empty_at = now
	end
	-- One microsecond of slack, as in token_bucket.lua.
	local r = { rem0 = (capacity - (empty_at - now) + 1) / emission, reset0 = empty_at - now, delay = 0 }

	local increment = emission * p.hits
	local new_empty_at = empty_at + increment
	local room = capacity - (new_empty_at - now) -- >= 0: the water fits
	local ahead = empty_at - now                 -- the wait of a shaped request
	local shaping = p.max_delay > 0
	r.allowed = room >= 0 and (not shaping or ahead <= p.max_delay)
	if not r.allowed then
		if increment > capacity then
			-- Never fits: report the time a full bucket takes to drain.
			r.retry = capacity
		else
			r.retry = -room
			if shaping and ahead - p.max_delay > r.retry then
				r.retry = ahead - p.max_delay
			end
		end
	end
	if shaping and p.hits > 0 then
		r.delay = ahead
	end
	if p.hits > 0 and (r.allowed or force) then
		r.state = { empty_at = new_empty_at }
		r.rem, r.reset = (room + 1) / emission, new_empty_at - now
	else
		r.rem, r.reset = r.rem0, r.reset0
	end
	return r
end

function M.store(key, st, now)
	-- Expire when the bucket is empty again; at least 1 ms.
	local ttl = math.min(math.max(1, math.ceil((st.empty_at - now) / 1000)), 9000000000000)
	redis.call("SET", key, string.format("%.17g", st.empty_at), "PX", ttl)
end

return M
