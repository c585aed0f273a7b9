-- sliding_window_counter.lua: the sliding window approximated from two fixed
-- windows (as Cloudflare and nginx do): windows are consecutive multiples of
-- period since the Unix epoch, and the count over the last period is
-- estimated as current + previous × (period - elapsed) / period, where
-- elapsed is the time since the current window began. A request is allowed
-- when estimate + hits <= limit. The chunk returns the load/decide/store
-- table take.lua calls for every key whose algorithm is
-- sliding_window_counter.
--
-- State: one string key "<current window start µs>:<current>:<previous>".
-- It expires when the current window stops weighing in, one period after
-- the current window ends.
local M = {}

function M.load(key)
	local v = redis.call("GET", key)
	if v then
		local start, cur, prev = string.match(v, "^(%-?%d+):(%d+):(%d+)$")
		if start then
			return { start = tonumber(start), cur = tonumber(cur), prev = tonumber(prev) }
		end
	end
	return {}
end

-- clear returns the µs until an estimate of cur and prev drops to 0.
local function clear(start, period, cur, prev, now)
	if cur > 0 then
		return start + 2 * period - now
	elseif prev > 0 then
		return start + period - now
	end
	return 0
end

function M.decide(_, st, now, limit, period, _, hits, _, _, force)
	local start = now - now % period
	local elapsed = now - start
	local cur, prev = 0, 0
	if st.start == start then
		cur, prev = st.cur, st.prev
	elseif st.start == start - period then
		prev = st.cur
	elseif st.start ~= nil and st.start > now then
		-- A later window than now says (see fixed_window.lua): judge in it,
		-- at its start, rather than overwrite it.
		start, elapsed, cur, prev = st.start, 0, st.cur, st.prev
	end
	local estimate = prev * (period - elapsed) / period + cur
	local rem0, reset0 = limit - estimate, clear(start, period, cur, prev, now)
	local allowed, retry = estimate + hits <= limit, 0
	if not allowed then
		local room = limit - cur - hits -- what the previous window may still weigh
		if hits > limit then
			-- Never fits: report the time until the counter is clear.
			retry = reset0
			if retry <= 0 then
				retry = period
			end
		elseif room >= 0 then
			-- prev × (period - t) / period <= room once t >= period × (1 - room / prev);
			-- prev > 0 here, or the estimate would not exceed limit - hits.
			retry = period - period * room / prev - elapsed
		else
			-- The current window alone is too full: in the next one it is
			-- the previous, and must weigh at most limit - hits.
			local room2 = limit - hits
			local t = 0
			if cur > room2 then
				t = period - period * room2 / cur
			end
			retry = start + period - now + t
		end
	end
	if hits > 0 and (allowed or force) then
		return allowed, retry, 0, rem0, reset0, { start = start, cur = cur + hits, prev = prev },
			limit - estimate - hits, start + 2 * period - now
	end
	return allowed, retry, 0, rem0, reset0, nil, rem0, reset0
end

-- refund takes hits off the window they were counted in (exact): the
-- current one, or the previous one when the state has moved on a window.
function M.refund(_, st, now, _, period, _, hits)
	local start = now - now % period
	if st.start == start then
		return { start = start, cur = math.max(st.cur - hits, 0), prev = st.prev }
	elseif st.start == start + period then
		return { start = st.start, cur = st.cur, prev = math.max(st.prev - hits, 0) }
	end
	return nil
end

function M.store(key, st, now, period)
	local ttl = math.max(1, math.ceil((st.start + 2 * period - now) / 1000))
	redis.call("SET", key, string.format("%.0f:%.0f:%.0f", st.start, st.cur, st.prev), "PX", ttl)
end

return M
